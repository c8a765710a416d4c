#!/usr/bin/env bash
# CreateStudent alone at 32 in flight on PostgreSQL (commit 79616e4): once under `perf record
# -a` (perf-summary.txt: the samples by command, and student-svc's by object), once beside
# `vmstat 1` (vmstat-closed-32.txt; its first seconds were cargo rebuilding student-svc,
# its last ones the idle box after the run). Run as root from the repository's root;
# writes beside itself.
set -euo pipefail
D=$PWD/bench/results/2026-12-03/create-alone-profile
PG=postgres://postgres@127.0.0.1:5432/postgres
perf record -o /tmp/perf.data -a -F 499 -- ./target/release/loadgen --backend $PG \
  --json "$D/closed-32.json" closed --students 30000 --in-flight 32 --relays 0 > "$D/closed-32.txt" 2>&1
{
  perf report -i /tmp/perf.data --sort comm --stdio
  perf report -i /tmp/perf.data --comm student-svc --sort dso --stdio
} > "$D/perf-summary.txt" 2>/dev/null
vmstat 1 20 > "$D/vmstat-closed-32.txt" &
./target/release/loadgen --backend $PG --json "$D/closed-32-vmstat.json" \
  closed --students 30000 --in-flight 32 --relays 0 > "$D/closed-32-vmstat.txt" 2>&1
wait
