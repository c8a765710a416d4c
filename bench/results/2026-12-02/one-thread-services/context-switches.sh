#!/bin/bash
for p in /proc/[0-9]*; do
  c=$(cat $p/comm 2>/dev/null) || continue
  if [ "$c" = postgres ]; then c="pg:$(tr '\0' ' ' < $p/cmdline | awk '{print $2,$3,$4}' | sed 's/ /_/g')"; fi
  for t in $p/task/*; do
    v=$(awk '/^voluntary_ctxt_switches|^nonvoluntary_ctxt_switches/{s+=$2} END{print s}' $t/status 2>/dev/null)
    tc=$(cat $t/comm 2>/dev/null| tr ' ' '_')
    echo "$c ${p#/proc/} ${t##*/} $v $tc"
  done
done
