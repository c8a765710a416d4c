#!/bin/bash
PG=postgres://postgres@127.0.0.1:5432/postgres
cd /work/main
for r in 3 4 5; do
  for side in multi current; do
    ./target/release/loadgen --backend $PG --env EXP_RT=$side --json /tmp/exp-rt/c32-$side-$r.json closed --students 20000 --in-flight 32 --relays 0 2>&1 | grep -iE "closed:" | sed "s/^/$side $r: /" | cut -c1-200
  done
done
for r in 1 2; do
  for side in multi current; do
    ./target/release/loadgen --backend $PG --env EXP_RT=$side --json /tmp/exp-rt/cmp-$side-$r.json compare --students 10000 2>&1 | grep -vE "…" | sed "s/^/$side $r: /" | cut -c1-220
  done
done
