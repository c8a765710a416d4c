#!/usr/bin/env bash
# SQLite, 4 in flight, one relay: SQLite's own busy handler (sleeps growing to 100 ms)
# against one that sleeps a constant 1 ms or 0.2 ms between tries, every binary; alternated
# run by run. A checkout of ae79f0a (before the handler landed) with platform patched by
# handler.diff.txt (EXPERIMENT_SQLITE_BUSY_SLEEP_US). Run
# from the repository's root; writes beside itself.
set -euo pipefail
D=$PWD/bench/results/2026-12-03/sqlite-busy
for round in 1 2; do
  for pause in default 1000 200; do
    env=(); [ "$pause" = default ] || env=(--env EXPERIMENT_SQLITE_BUSY_SLEEP_US=$pause)
    ./target/release/loadgen --backend sqlite "${env[@]}" --json "$D/closed-4-$pause-$round.json" \
      closed --students 10000 --in-flight 4 --relays 1 > "$D/closed-4-$pause-$round.txt" 2>&1
  done
done
