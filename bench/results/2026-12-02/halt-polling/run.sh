#!/bin/bash
# Diagnostic, not a setting of the project: the ¼ open loop with the guest's halt-polling
# off (this VM's default, haltpoll.guest_halt_poll_ns=0) and on (200 µs: an idle vCPU polls
# that long before it halts, so a wake-up within it costs no vCPU wake-up), alternated.
# Run as root from the repository root with release binaries built; restores the value.
set -u
PG=postgres://postgres@127.0.0.1:5432/postgres
D=$(realpath "$(dirname "$0")")
knob=/sys/module/haltpoll/parameters/guest_halt_poll_ns
was=$(cat $knob)
trap 'echo $was > $knob' EXIT
for r in 1 2 3 4; do
  for ns in 0 200000; do
    echo $ns > $knob
    target/release/loadgen --backend $PG --json "$D/open629-haltpoll$ns-$r.json" open --rate 629 --duration 15s 2>&1 |
      grep -E "open loop|saved" | sed "s/^/halt-poll $ns ns, round $r: /" | cut -c1-230
  done
done
echo "restored $knob to $was"
