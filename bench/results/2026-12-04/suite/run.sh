#!/usr/bin/env bash
# How the files in this directory were made (2026-12-04, release build of commit c4c5037;
# run from the repository's root, nothing else of ours running): one PostgreSQL suite,
# then a disk probe. The .txt beside the .json is what the run printed.
set -euo pipefail
D=$PWD/bench/results/2026-12-04/suite
PG=postgres://postgres@127.0.0.1:5432/postgres
cargo build --release -p loadgen -p student-svc -p users-svc -p relay
./target/release/loadgen --backend $PG --json "$D/suite-pg.json" suite --seconds 15 > "$D/suite-pg.txt"
python3 bench/results/2026-12-02/idle-wakeups/fsync-probe.py > "$D/suite-pg-fsync-after.txt"
