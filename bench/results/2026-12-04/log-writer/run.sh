#!/usr/bin/env bash
# What writing the log from a thread of its own (09461b1, tracing-appender's non-blocking
# writer) and the OTLP span hooks (off: no endpoint set) cost: the outbox flow at 1,000
# CreateStudent a second for 15 s, and outbox vs direct at 4 in flight, on PostgreSQL at
# RUST_LOG=info (the default), before (5e66ef5, checked out at $BEFORE with its own target
# directory) and after (this commit), alternated. Run from the repository's root; writes
# beside itself; summary.py prints the table BENCHMARKS.md quotes.
set -euo pipefail
D=$PWD/bench/results/2026-12-04/log-writer
BEFORE=${BEFORE:-/work/before}
PG=postgres://postgres@127.0.0.1:5432/postgres
for round in 1 2 3; do
  for side in before after; do
    if [ "$side" = before ]; then dir=$BEFORE; else dir=$PWD; fi
    (cd "$dir" && CARGO_TARGET_DIR="$dir/target" ./target/release/loadgen --backend $PG \
      --json "$D/open-1000-$side-$round.json" open --rate 1000 --duration 15s) \
      > "$D/open-1000-$side-$round.txt" 2>&1
    (cd "$dir" && CARGO_TARGET_DIR="$dir/target" ./target/release/loadgen --backend $PG \
      --json "$D/compare-$side-$round.json" compare --students 4000 --in-flight 4) \
      > "$D/compare-$side-$round.txt" 2>&1
  done
done
python3 "$D/summary.py" "$D" | tee "$D/summary.txt"
