#!/bin/bash
# Outbox at 4 in flight, in turn: no relay, one relay, and one relay with it and
# users-svc at nice 10. Run as root from the repository's root after
# `cargo build --release -p loadgen -p student-svc -p users-svc -p relay`.
set -euo pipefail
D=$PWD/bench/results/2026-12-02/four-in-flight/background-priority
PG=postgres://postgres@127.0.0.1:5432/postgres
L=./target/release/loadgen
source "$D/../renice.sh"
for i in 1 2; do
    $L --backend $PG --json "$D/no-relay-$i.json" closed --students 10000 --in-flight 4 --relays 0 > "$D/no-relay-$i.txt" 2>&1
    $L --backend $PG --json "$D/relay-$i.json" closed --students 10000 --in-flight 4 --relays 1 > "$D/relay-$i.txt" 2>&1
    renice_while_running 10 relay users-svc & R=$!
    $L --backend $PG --json "$D/relay-users-nice10-$i.json" closed --students 10000 --in-flight 4 --relays 1 > "$D/relay-users-nice10-$i.txt" 2>&1
    kill $R; wait $R || true
done
