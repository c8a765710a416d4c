#!/bin/bash
# What was run for BENCHMARKS.md "SQLite relays woken by commits" (2026-12-02, 14:13-14:35),
# with experiment.diff.txt applied to 98454b2 and the release binaries rebuilt after each
# step (`cargo build --release -p relay`). Not paired: the baselines are the calm-disk
# suite of the same afternoon (../calm-disk/suite-sqlite.json) and, at 50 /s, one run of
# the unpatched build just before.
set -euo pipefail
D=$PWD/bench/results/2026-12-02/sqlite-watch
# Step 1, the watcher waking the relay after every commit that left a row pending:
./target/release/loadgen --backend sqlite --json $D/suite-sqlite.json suite --seconds 15 > $D/suite-sqlite.txt
# Step 2, the same with SQLITE_MIN_WAKE_GAP (50 ms between wake-ups), as in the diff:
./target/release/loadgen --backend sqlite --json $D/compare-4-gap50.json compare --students 10000 --in-flight 4 > $D/compare-4-gap50.txt
for r in 332 664; do
    ./target/release/loadgen --backend sqlite --json $D/open-$r-gap50.json open --rate $r --duration 15s > $D/open-$r-gap50.txt
done
# The open loops at 50 /s (printed only, not kept as JSON):
./target/release/loadgen --backend sqlite open --rate 50 --duration 10s
