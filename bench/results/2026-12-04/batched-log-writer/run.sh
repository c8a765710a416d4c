#!/usr/bin/env bash
# What writing the log in batches costs against tracing-appender's writer, which wakes its
# thread and writes once per line: before (3e48ea1, checked out at $BEFORE with its own
# target directory) and after (this commit), alternated, three rounds, PostgreSQL,
# RUST_LOG=info (the default). Each round: the database-only ceiling, CreateStudent alone at
# 32 in flight (20,000 students), the outbox flow at 1,000 CreateStudent a second for 15 s,
# and outbox vs direct at 4 in flight. Run from the repository's root with the release
# binaries of both sides built; writes beside itself; summary.py prints the table
# BENCHMARKS.md quotes.
set -euo pipefail
D=$PWD/bench/results/2026-12-04/batched-log-writer
BEFORE=${BEFORE:-/work/before}
PG=postgres://postgres@127.0.0.1:5432/postgres
for round in 1 2 3; do
  ./target/release/loadgen --backend $PG --json "$D/ceiling-$round.json" ceiling \
    > "$D/ceiling-$round.txt" 2>&1
  for side in before after; do
    if [ "$side" = before ]; then dir=$BEFORE; else dir=$PWD; fi
    run() {
      local name=$1
      shift
      (cd "$dir" && CARGO_TARGET_DIR="$dir/target" ./target/release/loadgen --backend $PG \
        --json "$D/$name-$side-$round.json" "$@") > "$D/$name-$side-$round.txt" 2>&1
    }
    run closed32 closed --students 20000 --in-flight 32 --relays 0
    run open-1000 open --rate 1000 --duration 15s
    run compare compare --students 4000 --in-flight 4
  done
done
python3 "$D/summary.py" "$D" | tee "$D/summary.txt"
