#!/usr/bin/env bash
# How the files in this directory were made (2026-12-04, release build of commit c4c5037;
# run from the repository's root, nothing else of ours running): a PostgreSQL suite and a
# disk probe after it, then a disk probe and a second suite twenty minutes later. Each
# .txt beside its .json is what the run printed.
set -euo pipefail
D=$PWD/bench/results/2026-12-04/suite
PG=postgres://postgres@127.0.0.1:5432/postgres
probe() { python3 bench/results/2026-12-02/idle-wakeups/fsync-probe.py > "$1"; }
cargo build --release -p loadgen -p student-svc -p users-svc -p relay
./target/release/loadgen --backend $PG --json "$D/suite-pg.json" suite --seconds 15 > "$D/suite-pg.txt"
probe "$D/suite-pg-fsync-after.txt"
probe "$D/suite-pg-2-fsync-before.txt"
./target/release/loadgen --backend $PG --json "$D/suite-pg-2.json" suite --seconds 15 > "$D/suite-pg-2.txt"
