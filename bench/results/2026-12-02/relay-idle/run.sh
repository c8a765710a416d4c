#!/usr/bin/env bash
# The relay at SCHED_IDLE (it runs only when nothing else wants a core) against the default,
# alternated twice: `compare` at 4 and 32 in flight, then an open loop at 614 /s.
# Run from the workspace root after `cargo build --release -p loadgen`.
set -euo pipefail
PG=${PG:-postgres://postgres@127.0.0.1:5432/postgres}
out=$(cd "$(dirname "$0")" && pwd)
loadgen=./target/release/loadgen

idle_relays() { # until killed: every thread of each relay process to SCHED_IDLE
  while true; do
    for pid in $(pgrep -x relay); do chrt --all-tasks --idle -p 0 "$pid" > /dev/null 2>&1 || true; done
    sleep 0.02
  done
}

for round in 1 2; do
  $loadgen --backend "$PG" --json "$out/compare-$round.json" \
    compare --students 10000 --in-flight 4,32 > "$out/compare-$round.txt"
  idle_relays & idler=$!
  $loadgen --backend "$PG" --json "$out/compare-relay-idle-$round.json" \
    compare --students 10000 --in-flight 4,32 > "$out/compare-relay-idle-$round.txt"
  $loadgen --backend "$PG" --json "$out/open-614-relay-idle-$round.json" \
    open --rate 614 --duration 15s > "$out/open-614-relay-idle-$round.txt"
  kill "$idler"
  $loadgen --backend "$PG" --json "$out/open-614-$round.json" \
    open --rate 614 --duration 15s > "$out/open-614-$round.txt"
done
