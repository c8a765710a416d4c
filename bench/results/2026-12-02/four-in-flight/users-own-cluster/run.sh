#!/bin/bash
# Paired: compare at 4 in flight, Users DB on the same cluster vs on its own cluster (5433).
# The second cluster: pg_createcluster 15 users -p 5433 --start -- --auth-local=trust --auth-host=trust
# (output in cluster.txt); loadgen with experiment.diff.txt applied; dropped afterwards.
cd /work/main
PG=postgres://postgres@127.0.0.1:5432/postgres
out=/tmp/split
for i in 1 2 3; do
  for v in same own; do
    if [ $v = own ]; then export LOADGEN_USERS_ADMIN_URL=postgres://postgres@127.0.0.1:5433/postgres; else unset LOADGEN_USERS_ADMIN_URL; fi
    ./target/release/loadgen --backend $PG --json $out/$v-$i.json compare --students 10000 --in-flight 4 > $out/$v-$i.txt 2>&1
  done
done
echo DONE > $out/done
