#!/bin/bash
# The committed flag, paired at ½ and ¼ of the suite's maximum: one thread (the default)
# against two (`--worker-threads 2` through the environment), alternated.
PG=postgres://postgres@127.0.0.1:5432/postgres
D=$(realpath "$(dirname "$0")")
for r in 1 2 3 4; do
  for side in 2 1; do
    for rate in 1259 629; do
      target/release/loadgen --backend $PG --env STUDENT_WORKER_THREADS=$side --env USERS_WORKER_THREADS=$side \
        --json "$D/flag-open$rate-threads$side-$r.json" open --rate $rate --duration 15s 2>&1 |
        grep -E "open loop" | sed "s/^/threads $side, $rate, round $r: /" | cut -c1-220
    done
  done
done
