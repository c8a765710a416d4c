#!/usr/bin/env bash
# Compares the backlog drain of two commits on this machine, alternating them run by run so
# that both see the same machine (its speed drifts by tens of per cent within an hour).
#
#   bench/ab-drain.sh BASE [NEW] [--rounds N] [--students N] [--relays "1 2 4"] [--backend URL]
#
# BASE and NEW are commits (NEW defaults to the working tree). Each side is built in a
# worktree of its own with a target directory of its own (a shared one would mix them up:
# cargo names the units of both the same). Every run writes `loadgen --json` into
# $OUT (default bench/results/ab-<date>/); the last lines are the median rows/s per side
# and number of relays; loadgen's progress goes to $AB_WORK/ab-drain.log. A commit older than d88757f rebuilds on every run (its devstack
# passed cargo's variables on to the inner build).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

base=${1:?usage: bench/ab-drain.sh BASE [NEW] [--rounds N] [--students N] [--relays LIST] [--backend URL]}
shift
new=""
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then new=$1; shift; fi
rounds=3 students=4000 relays="1 2" backend=postgres://postgres@127.0.0.1:5432/postgres
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --students) students=$2; shift 2 ;;
    --relays) relays=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
out=${OUT:-$root/bench/results/ab-$(date +%F)}
work=${AB_WORK:-${TMPDIR:-/tmp}/ab-drain}
mkdir -p "$out" "$work"

# A worktree and a target directory per side; the working tree itself when NEW is empty.
checkout() {
  local name=$1 commit=$2
  if [ -z "$commit" ]; then
    echo "$root ${CARGO_TARGET_DIR:-$root/target}"
    return
  fi
  local dir=$work/$name
  if [ -d "$dir" ]; then
    git -C "$dir" checkout -q --detach "$commit"
  else
    git worktree add -q --detach "$dir" "$commit"
  fi
  echo "$dir $work/$name-target"
}
read -r base_dir base_target < <(checkout base "$base")
read -r new_dir new_target < <(checkout new "$new")

drain() {
  local side=$1 dir=$2 target=$3 relays=$4 round=$5
  ( cd "$dir" && CARGO_TARGET_DIR=$target cargo run -q --release -p loadgen -- \
      --backend "$backend" --json "$out/$side-relays$relays-$round.json" \
      drain --students "$students" --relays "$relays" 2>>"$work/ab-drain.log" ) |
    grep '^drain of' | sed "s/^/$side: /"
}

# The first run of each side builds it; not counted.
drain base "$base_dir" "$base_target" 1 warm >/dev/null
drain new "$new_dir" "$new_target" 1 warm >/dev/null
rm -f "$out"/*-warm.json
for round in $(seq 1 "$rounds"); do
  for k in $relays; do
    drain base "$base_dir" "$base_target" "$k" "$round"
    drain new "$new_dir" "$new_target" "$k" "$round"
  done
done

python3 - "$out" <<'EOF'
import glob, json, statistics, sys
rates = {}
for path in glob.glob(f"{sys.argv[1]}/*-relays*-*.json"):
    side = path.rsplit("/", 1)[1].split("-relays")[0]
    drain = json.load(open(path))["results"]["drain"]
    rates.setdefault((drain["relays"], side), []).append(drain["links"]["per_second"])
for (relays, side), values in sorted(rates.items()):
    print(f"{relays} relay(s), {side}: median {statistics.median(values):.0f} rows/s over {len(values)} runs "
          f"(min {min(values):.0f}, max {max(values):.0f})")
EOF
