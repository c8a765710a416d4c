#!/usr/bin/env bash
# How much of CreateStudent's p50 at 4 and 32 in flight is the relay and Users sharing the
# two cores: alternated twice, (a) CreateStudent with no relay at all, (b) `compare` as the
# suite runs it, (c) `compare` with every relay reniced to 10 as soon as it starts.
# Run from the workspace root after `cargo build --release -p loadgen`.
set -euo pipefail
PG=${PG:-postgres://postgres@127.0.0.1:5432/postgres}
out=$(cd "$(dirname "$0")" && pwd)
loadgen=./target/release/loadgen

renice_relays() { # until killed: renice each relay process to 10
  while true; do
    for pid in $(pgrep -x relay); do renice -n 10 -p "$pid" > /dev/null 2>&1 || true; done
    sleep 0.02
  done
}

for round in 1 2; do
  for in_flight in 4 32; do
    $loadgen --backend "$PG" --json "$out/alone-$in_flight-$round.json" \
      closed --students 10000 --in-flight "$in_flight" --relays 0 > "$out/alone-$in_flight-$round.txt"
  done
  $loadgen --backend "$PG" --json "$out/compare-$round.json" \
    compare --students 10000 --in-flight 4,32 > "$out/compare-$round.txt"
  renice_relays & renicer=$!
  $loadgen --backend "$PG" --json "$out/compare-relay-nice-$round.json" \
    compare --students 10000 --in-flight 4,32 > "$out/compare-relay-nice-$round.txt"
  $loadgen --backend "$PG" --json "$out/open-614-relay-nice-$round.json" \
    open --rate 614 --duration 15s > "$out/open-614-relay-nice-$round.txt"
  kill "$renicer"
  $loadgen --backend "$PG" --json "$out/open-614-$round.json" \
    open --rate 614 --duration 15s > "$out/open-614-$round.txt"
done
