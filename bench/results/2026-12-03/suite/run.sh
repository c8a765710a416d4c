#!/usr/bin/env bash
# How the files in this directory were made (2026-12-03, release build of the checkout;
# run from the repository's root, nothing else of ours running): each PostgreSQL suite
# between two disk probes, then a SQLite suite. Each .txt beside its .json is what the
# run printed.
set -euo pipefail
D=$PWD/bench/results/2026-12-03/suite
PG=postgres://postgres@127.0.0.1:5432/postgres
probe() { python3 bench/results/2026-12-02/idle-wakeups/fsync-probe.py > "$1"; }
cargo build --release -p loadgen -p student-svc -p users-svc -p relay
for run in suite-pg suite-pg-2; do
    probe "$D/$run-fsync-before.txt"
    ./target/release/loadgen --backend $PG --json "$D/$run.json" suite --seconds 15 > "$D/$run.txt"
    probe "$D/$run-fsync-after.txt"
done
./target/release/loadgen --backend sqlite --json "$D/suite-sqlite.json" suite --seconds 15 > "$D/suite-sqlite.txt"
