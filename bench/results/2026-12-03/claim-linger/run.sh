#!/usr/bin/env bash
# Would the relay waiting for rows to gather (as Kafka's linger.ms) bring CreateStudent's
# p50 at 4 in flight under 0.5 x direct's, and what would it cost the link latency at a
# quarter of the maximum rate? An experiment build: experiment.diff.txt applied (the
# relay, woken by a commit, waits RELAY_EXPERIMENT_LINGER_MS before it claims; 0 is the
# shipped behaviour). Per wait, alternated within each round:
# `compare --students 6000 --in-flight 4` and `open --rate 700 --duration 15s` (a quarter
# of this AMD box's maximum, as its suites of 2026-12-02 measured: 698 and 769 /s).
#
#   run.sh ROUNDS WAITS_MS
#
# Made by `run.sh "1 2" "0 1 2 4"` on commit f036b1f, then `run.sh "3 4" "0 8 16"` (to see
# whether a longer wait reaches 0.5) on the tree of 26578fa, which changes only one-shot
# commands' exit codes. Run from the repository's root; writes beside itself.
set -euo pipefail
D=$PWD/bench/results/2026-12-03/claim-linger
PG=postgres://postgres@127.0.0.1:5432/postgres
for round in $1; do
  for ms in $2; do
    ./target/release/loadgen --backend $PG --env RELAY_EXPERIMENT_LINGER_MS=$ms \
      --json "$D/compare-$ms-$round.json" compare --students 6000 --in-flight 4 \
      > "$D/compare-$ms-$round.txt" 2>&1
    ./target/release/loadgen --backend $PG --env RELAY_EXPERIMENT_LINGER_MS=$ms \
      --json "$D/open-$ms-$round.json" open --rate 700 --duration 15s \
      > "$D/open-$ms-$round.txt" 2>&1
  done
done
