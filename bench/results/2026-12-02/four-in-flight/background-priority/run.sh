#!/bin/bash
# Outbox at 4 in flight: no relay, one relay, one relay with it and users-svc at nice 10.
cd /work/main
PG=postgres://postgres@127.0.0.1:5432/postgres
out=/tmp/bg
renicer() {
  while sleep 0.02; do
    for p in $(pgrep -x relay) $(pgrep -x users-svc); do
      for t in /proc/$p/task/*; do renice -n 10 -p "${t##*/}" >/dev/null 2>&1; done
    done
  done
}
for i in 1 2; do
  ./target/release/loadgen --backend $PG --json $out/no-relay-$i.json closed --students 10000 --in-flight 4 --relays 0 > $out/no-relay-$i.txt 2>&1
  ./target/release/loadgen --backend $PG --json $out/relay-$i.json closed --students 10000 --in-flight 4 --relays 1 > $out/relay-$i.txt 2>&1
  renicer & R=$!
  ./target/release/loadgen --backend $PG --json $out/relay-users-nice10-$i.json closed --students 10000 --in-flight 4 --relays 1 > $out/relay-users-nice10-$i.txt 2>&1
  kill $R; wait $R 2>/dev/null
done
echo DONE > $out/done
