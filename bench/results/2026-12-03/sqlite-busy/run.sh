#!/usr/bin/env bash
# Part one needs a checkout from before e6ed302 (ae79f0a), when SQLite's own busy handler
# was in use; the part after `wait` needs e6ed302 or later.
#
# Where a SQLite relay waits at 4 in flight: the sleeps of SQLite's busy handler in the
# relay and in student-svc, 4 s of each traced with strace (nanosleep calls and their
# durations) three seconds into a closed loop. Run as root from the repository's root;
# writes beside itself.
set -euo pipefail
D=$PWD/bench/results/2026-12-03/sqlite-busy
./target/release/loadgen --backend sqlite closed --students 20000 --in-flight 4 --relays 1 > "$D/closed-4.txt" 2>&1 &
until RP=$(pgrep -f "relay .*run" | head -1); do sleep 0.2; done
SP=$(pgrep -x student-svc | head -1)
sleep 3
timeout 4 strace -f -tt -T -e trace=clock_nanosleep,nanosleep -p "$RP" -o "$D/relay-busy-sleeps.strace" || true
timeout 4 strace -f -tt -T -e trace=clock_nanosleep,nanosleep -p "$SP" -o "$D/student-busy-sleeps.strace" || true
wait
# The handler as committed (one pause of 1 ms between tries): the same closed loop twice,
# then a whole SQLite suite.
for r in 1 2; do
  ./target/release/loadgen --backend sqlite --json "$D/final-closed-4-$r.json" closed --students 10000 --in-flight 4 --relays 1 > "$D/final-closed-4-$r.txt" 2>&1
done
./target/release/loadgen --backend sqlite --json "$D/suite-sqlite.json" suite --seconds 15 > "$D/suite-sqlite.txt"
./target/release/loadgen --backend sqlite --json "$D/compare-sqlite.json" \
  compare --students 6000 --in-flight 1,4,16,32 > "$D/compare-sqlite.txt" 2>&1
