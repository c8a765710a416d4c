#!/usr/bin/env bash
# Both link modes at 1, 4, 16 and 32 in flight on both backends, one run each (at each
# concurrency: outbox, then direct, each on fresh databases; one relay). Scaling with
# relays is the suites' drains (../suite/). Run from the repository's root; writes beside
# itself.
set -euo pipefail
D=$PWD/bench/results/2026-12-03/scaling
PG=postgres://postgres@127.0.0.1:5432/postgres
for backend in $PG sqlite; do
  name=$([ "$backend" = sqlite ] && echo sqlite || echo pg)
  ./target/release/loadgen --backend "$backend" --json "$D/compare-$name.json" \
    compare --students 6000 --in-flight 1,4,16,32 > "$D/compare-$name.txt" 2>&1
done
