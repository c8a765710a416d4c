#!/usr/bin/env bash
# CreateStudent alone at 32 in flight with 2 (the default), 3 and 4 group-commit writers
# on PostgreSQL, alternated run by run; a checkout of 79616e4 with student-svc patched by
# experiment.diff.txt
# (EXPERIMENT_STUDENT_WRITERS). Run from the repository's root; writes beside itself.
set -euo pipefail
D=$PWD/bench/results/2026-12-03/writers
PG=postgres://postgres@127.0.0.1:5432/postgres
for round in 1 2 3; do
  for w in 2 3 4; do
    ./target/release/loadgen --backend $PG --env EXPERIMENT_STUDENT_WRITERS=$w --json "$D/writers-$w-$round.json" \
      closed --students 30000 --in-flight 32 --relays 0 > "$D/writers-$w-$round.txt" 2>&1
  done
done
