#!/bin/bash
# Paired, alternated run by run: `compare` at 4 in flight with the Users DB on the same
# PostgreSQL cluster as the Student DB ("same") and on a cluster of its own ("own", port
# 5433, same disk). Run as root from the repository's root, with experiment.diff.txt
# applied to loadgen (it reads LOADGEN_USERS_ADMIN_URL) and
# `cargo build --release -p loadgen -p student-svc -p users-svc -p relay`. The second
# cluster (output in cluster.txt), dropped afterwards with `pg_dropcluster 15 users --stop`:
#   pg_createcluster 15 users -p 5433 --start -- --auth-local=trust --auth-host=trust
set -euo pipefail
D=$PWD/bench/results/2026-12-02/four-in-flight/users-own-cluster
PG=postgres://postgres@127.0.0.1:5432/postgres
for i in 1 2 3; do
    for v in same own; do
        if [ $v = own ]; then
            export LOADGEN_USERS_ADMIN_URL=postgres://postgres@127.0.0.1:5433/postgres
        else
            unset LOADGEN_USERS_ADMIN_URL
        fi
        ./target/release/loadgen --backend $PG --json "$D/$v-$i.json" compare --students 10000 --in-flight 4 > "$D/$v-$i.txt" 2>&1
    done
done
