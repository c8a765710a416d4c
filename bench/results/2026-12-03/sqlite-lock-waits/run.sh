#!/usr/bin/env bash
# How often SQLite's writers wait for the write lock (`sqlite_write_lock_waits_total`, one
# count per 1 ms pause) at a quarter and a half of the SQLite maximum and at the maximum,
# so an operator can read the counter's rate against known loads. Commit da6f780, release
# build; loadgen on SQLite (`synchronous=FULL`, its default) with every binary's metrics
# on fixed ports, scraped once a second while each run lasts (the last scrape of each
# process is its total; the load's seconds are in the run's JSON). Rates: 300 and 600 /s
# open loop (meant as a quarter and a half of the maximum, whose quarter the SQLite suites
# in BENCHMARKS.md put at 332 and 412 /s; against this afternoon's maximum, the closed
# loops' 932 and 1,094 /s, they were 27-32 % and 55-64 %), then a closed loop at 32 in
# flight with one relay. Run from the repository's root; writes beside itself.
set -euo pipefail
D=$PWD/bench/results/2026-12-03/sqlite-lock-waits
METRICS=(--env STUDENT_METRICS_ADDR=127.0.0.1:19101 --env USERS_METRICS_ADDR=127.0.0.1:19102
         --env RELAY_METRICS_ADDR=127.0.0.1:19103)
scrape() {
  while true; do
    for port in 19101 19102 19103; do
      curl -s --max-time 1 "http://127.0.0.1:$port/metrics" \
        | sed -n "s/^sqlite_write_lock_waits_total /$port /p" || true
    done
    sleep 1
  done
}
run() {
  local name=$1; shift
  scrape > "$D/$name-scrapes.txt" &
  local scraper=$!
  ./target/release/loadgen --backend sqlite "${METRICS[@]}" --json "$D/$name.json" "$@" \
    > "$D/$name.txt" 2>&1
  kill $scraper
}
for round in 1 2; do
  run open-300-$round open --rate 300 --duration 15s
  run open-600-$round open --rate 600 --duration 15s
  run closed-32-$round closed --students 15000 --in-flight 32 --relays 1
done
