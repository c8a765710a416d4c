#!/usr/bin/env bash
# The writer as changed in 3c13447 (5 ms between writes rather than 5 ms after every first
# line) against the same before (3e48ea1, at $BEFORE with its own target directory):
# CreateStudent alone at 32 in flight and the outbox flow at 1,000 a second for 15 s,
# alternated, three rounds, PostgreSQL, RUST_LOG=info. Run from the repository's root with
# both sides' release binaries built; recheck.py prints the table BENCHMARKS.md quotes.
set -euo pipefail
D=$PWD/bench/results/2026-12-04/batched-log-writer
BEFORE=${BEFORE:-/work/before}
PG=postgres://postgres@127.0.0.1:5432/postgres
for round in 1 2 3; do
  for side in before after; do
    if [ "$side" = before ]; then dir=$BEFORE; else dir=$PWD; fi
    run() {
      local name=$1
      shift
      (cd "$dir" && CARGO_TARGET_DIR="$dir/target" ./target/release/loadgen --backend $PG \
        --json "$D/recheck-$name-$side-$round.json" "$@") > "$D/recheck-$name-$side-$round.txt" 2>&1
    }
    run closed32 closed --students 20000 --in-flight 32 --relays 0
    run open-1000 open --rate 1000 --duration 15s
  done
done
python3 "$D/recheck.py" "$D" | tee "$D/recheck-summary.txt"
