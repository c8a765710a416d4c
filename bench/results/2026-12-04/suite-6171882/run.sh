#!/usr/bin/env bash
# How the files in this directory were made (2026-12-04, release build of commit 6171882:
# the log written from a thread of its own, the span hooks with no collector named; run
# from the repository's root, nothing else of ours running): one PostgreSQL suite, with a
# disk probe before it. The .txt beside the .json is what the run printed.
set -euo pipefail
D=$PWD/bench/results/2026-12-04/suite-6171882
PG=postgres://postgres@127.0.0.1:5432/postgres
cargo build --release -p loadgen -p student-svc -p users-svc -p relay
python3 bench/results/2026-12-02/idle-wakeups/fsync-probe.py > "$D/suite-pg-fsync-before.txt"
./target/release/loadgen --backend $PG --json "$D/suite-pg.json" suite --seconds 15 > "$D/suite-pg.txt"
