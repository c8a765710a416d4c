#!/usr/bin/env bash
# Which of the background work's costs slows CreateStudent at 4 in flight: its disk syncs
# or its CPU? The same closed loop with no relay, with one relay as shipped, with users-svc
# committing without waiting for the disk, and with both users-svc and the relay so
# (a diagnostic only: Users' commits must be durable). Run on a checkout of 79616e4 with
# loadgen patched by
# experiment.diff.txt (EXPERIMENT_USERS_NO_FLUSH, EXPERIMENT_RELAY_NO_FLUSH). Run from the
# repository's root; writes beside itself.
set -euo pipefail
D=$PWD/bench/results/2026-12-03/commit-flush
PG=postgres://postgres@127.0.0.1:5432/postgres
L=./target/release/loadgen
run() { # name, relays, env...
  local name=$1 relays=$2; shift 2
  env "$@" $L --backend $PG --json "$D/$name.json" closed --students 10000 --in-flight 4 --relays "$relays" > "$D/$name.txt" 2>&1
}
for round in 1 2 3; do
  run "no-relay-$round" 0
  run "shipped-$round" 1
  run "users-no-flush-$round" 1 EXPERIMENT_USERS_NO_FLUSH=1
  run "all-background-no-flush-$round" 1 EXPERIMENT_USERS_NO_FLUSH=1 EXPERIMENT_RELAY_NO_FLUSH=1
done
# Then, with the patch reverted (the shipped loadgen), today's ratio against direct:
for round in 1 2 3; do
  $L --backend $PG --json "$D/compare-4-$round.json" compare --students 10000 --in-flight 4 > "$D/compare-4-$round.txt" 2>&1
done
