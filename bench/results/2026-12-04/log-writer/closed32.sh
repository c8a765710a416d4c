#!/usr/bin/env bash
# CreateStudent alone (no relay) at 32 in flight, 20,000 students, PostgreSQL, before
# (5e66ef5, checked out at $BEFORE with its own target directory) and after (6171882),
# alternated: the suite of 6171882 (../suite-6171882/) put it at 0.62 of the ceiling on
# this box, and this asks whether the log writer is why. Run from the repository's root.
set -euo pipefail
D=$PWD/bench/results/2026-12-04/log-writer
BEFORE=${BEFORE:-/work/before}
PG=postgres://postgres@127.0.0.1:5432/postgres
for round in 1 2 3; do
  for side in before after; do
    if [ "$side" = before ]; then dir=$BEFORE; else dir=$PWD; fi
    (cd "$dir" && CARGO_TARGET_DIR="$dir/target" ./target/release/loadgen --backend $PG \
      --json "$D/closed32-$side-$round.json" closed --students 20000 --in-flight 32 --relays 0) \
      > "$D/closed32-$side-$round.txt" 2>&1
  done
done
grep -H "CreateStudent in" "$D"/closed32-*.txt
