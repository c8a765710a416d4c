#!/usr/bin/env bash
# What the per-request info lines cost: outbox vs direct at 4 and 32 in flight on
# PostgreSQL, every binary at RUST_LOG=info (the default) or warn (only the line that
# gives loadgen each port, `listening=info`, stays), alternated run by run; commit 5ed12a1.
# Run from the repository's root; writes beside itself.
set -euo pipefail
D=$PWD/bench/results/2026-12-03/log-level
PG=postgres://postgres@127.0.0.1:5432/postgres
for round in 1 2 3; do
  for level in info warn; do
    ./target/release/loadgen --backend $PG --env RUST_LOG=$level --json "$D/compare-$level-$round.json" \
      compare --students 8000 --in-flight 4,32 > "$D/compare-$level-$round.txt" 2>&1
  done
done
