#!/bin/bash
PG=postgres://postgres@127.0.0.1:5432/postgres
cd /work/main
for r in 1 2 3 4; do
  for side in multi current; do
    ./target/release/loadgen --backend $PG --env EXP_RT=$side --json /tmp/exp-rt/open-$side-$r.json open --rate 614 --duration 15s 2>&1 | grep -E "open loop|saved" | sed "s/^/$side $r: /"
  done
done
