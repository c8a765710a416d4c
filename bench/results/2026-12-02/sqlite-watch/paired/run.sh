#!/bin/bash
# Paired, alternated run by run: the experiment build (../experiment.diff.txt plus an
# environment switch, RELAY_SQLITE_WATCH=off, in Wakeup::for_database) with the watcher
# on ("watch") and off ("poll"). Run from the repository's root after
# `cargo build --release -p loadgen -p student-svc -p users-svc -p relay`.
set -euo pipefail
D=$PWD/bench/results/2026-12-02/sqlite-watch/paired
L=./target/release/loadgen
for round in 1 2 3; do
    for side in poll watch; do
        env=(); [ $side = poll ] && env=(--env RELAY_SQLITE_WATCH=off)
        for rate in 50 332 664; do
            $L --backend sqlite "${env[@]}" --json $D/open-$rate-$side-$round.json \
                open --rate $rate --duration 15s > $D/open-$rate-$side-$round.txt 2>/dev/null
        done
        $L --backend sqlite "${env[@]}" --json $D/compare-$side-$round.json \
            compare --students 6000 --in-flight 4 > $D/compare-$side-$round.txt 2>/dev/null
    done
done
