#!/usr/bin/env bash
# The same question at one fixed rate, so CPU per student compares like with like: the
# outbox flow at 500 and at 1,000 CreateStudent a second for 15 s on PostgreSQL, every
# binary at RUST_LOG=info or warn, alternated; commit 5ed12a1. Run from the repository's
# root; writes beside itself.
set -euo pipefail
D=$PWD/bench/results/2026-12-03/log-level
PG=postgres://postgres@127.0.0.1:5432/postgres
for round in 1 2 3; do
  for rate in 500 1000; do
    for level in info warn; do
      ./target/release/loadgen --backend $PG --env RUST_LOG=$level --json "$D/open-$rate-$level-$round.json" \
        open --rate $rate --duration 15s > "$D/open-$rate-$level-$round.txt" 2>&1
    done
  done
done
