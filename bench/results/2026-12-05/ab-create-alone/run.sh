#!/usr/bin/env bash
# How the files in this directory were made (2026-12-05, after the suite of a7ca2ae missed
# CreateStudent alone at 32 in flight against its ceiling): the build of the last suite
# that met it (b082030, 0.90 on the AMD box of 2026-12-04) against a7ca2ae, alternated
# run by run on this box (run with NEW left out, the working tree then at a7ca2ae; written
# here with a7ca2ae named).
# ab.txt is what the script printed.
set -euo pipefail
OUT=$PWD/bench/results/2026-12-05/ab-create-alone \
  bash bench/ab-drain.sh b082030 a7ca2ae --rounds 3 -- closed --students 20000 --in-flight 32 --relays 0
