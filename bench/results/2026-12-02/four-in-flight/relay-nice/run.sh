#!/bin/bash
# Paired: compare at 4 in flight, relay at normal priority vs relay at nice N.
cd /work/main
PG=postgres://postgres@127.0.0.1:5432/postgres
out=/tmp/nice
renicer() {
  while sleep 0.02; do
    for p in $(pgrep -x relay); do
      for t in /proc/$p/task/*; do renice -n "$1" -p "${t##*/}" >/dev/null 2>&1; done
    done
  done
}
for i in 1 2 3; do
  for v in plain nice10; do
    if [ $v = nice10 ]; then renicer 10 & R=$!; fi
    ./target/release/loadgen --backend $PG --json $out/$v-$i.json compare --students 10000 --in-flight 4 > $out/$v-$i.txt 2>&1
    if [ $v = nice10 ]; then kill $R; wait $R 2>/dev/null; fi
  done
done
echo DONE > $out/done
