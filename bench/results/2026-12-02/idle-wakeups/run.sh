#!/bin/bash
# How much of a row's link latency at low rates is waking processes up, on this machine.
# 1. One round trip to PostgreSQL (`SELECT 1`, pgbench, one client): back to back, and
#    paced at 100 and 600 a second, when the server's backend and pgbench sleep between
#    transactions and each is woken for the next.
# 2. The open loop at 100, 300 and 614 /s: at 100 /s the box is nearly idle, so what a row
#    pays there is its chain of hand-offs, not a queue for the cores.
# Run from the repository root with release binaries built; writes beside this script.
set -euo pipefail
out=$(dirname "$0")
PG=postgres://postgres@127.0.0.1:5432/postgres
echo "SELECT 1;" > "$out/select1.sql"
for rate in "" 600 100; do
  echo "pgbench SELECT 1, one client${rate:+, --rate=$rate}:"
  pgbench -h 127.0.0.1 -U postgres -n -c 1 -T 10 ${rate:+--rate=$rate} -f "$out/select1.sql" postgres 2>&1 |
    grep -E "latency average|^tps"
done | tee "$out/pgbench-select1.txt"
for round in 1 2; do
  for rate in 100 300 614; do
    target/release/loadgen --backend $PG --json "$(realpath "$out")/open-$rate-$round.json" \
      open --rate $rate --duration 15s 2>&1 | grep -vE "…" | tee "$out/open-$rate-$round.txt"
  done
done
