#!/bin/bash
# The SQLite suite of 7ab51f2 (the relay's SQLite watcher in), 2026-12-02 15:04-15:13, run
# from the repository's root with nothing else running.
set -euo pipefail
cargo build --release -p loadgen -p student-svc -p users-svc -p relay
D=$PWD/bench/results/2026-12-02/sqlite-watch/suite-after
./target/release/loadgen --backend sqlite --json $D/suite-sqlite.json suite --seconds 15 > $D/suite-sqlite.txt
./target/release/loadgen targets --update BENCHMARKS.md
