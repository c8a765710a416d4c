#!/bin/bash
# Paired, alternated run by run: `compare` at 4 in flight with the relay at normal
# priority ("plain") and at nice 10 ("nice10"). Run as root from the repository's root
# after `cargo build --release -p loadgen -p student-svc -p users-svc -p relay`.
set -euo pipefail
D=$PWD/bench/results/2026-12-02/four-in-flight/relay-nice
PG=postgres://postgres@127.0.0.1:5432/postgres
source "$D/../renice.sh"
for i in 1 2 3; do
    for v in plain nice10; do
        if [ $v = nice10 ]; then renice_while_running 10 relay & R=$!; fi
        ./target/release/loadgen --backend $PG --json "$D/$v-$i.json" compare --students 10000 --in-flight 4 > "$D/$v-$i.txt" 2>&1
        if [ $v = nice10 ]; then kill $R; wait $R || true; fi
    done
done
