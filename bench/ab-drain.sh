#!/usr/bin/env bash
# Compares two commits on this machine, alternating them run by run so that both see the
# same machine (its speed drifts by tens of per cent within an hour).
#
#   bench/ab-drain.sh BASE [NEW] [--rounds N] [--students N] [--relays "1 2 4"] [--backend URL]
#   bench/ab-drain.sh BASE [NEW] [--rounds N] [--backend URL] -- MODE [ARGS...]
#
# BASE and NEW are commits (NEW defaults to the working tree). Each side is built in a
# worktree of its own with a target directory of its own (a shared one would mix them up:
# cargo names the units of both the same). By default each round drains a backlog with
# each number of relays; after `--`, each round runs that `loadgen` mode instead (`closed
# --students 8000 --in-flight 32 --relays 0`, `open --rate 300 --duration 15s`, ...). Every
# run writes `loadgen --json` into $OUT (default bench/results/ab-<date>/); the last lines
# are the medians per side; loadgen's progress goes to $AB_WORK/ab-drain.log. A commit
# older than d88757f rebuilds on every run (its devstack passed cargo's variables on to
# the inner build).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

base=${1:?usage: bench/ab-drain.sh BASE [NEW] [--rounds N] [--students N] [--relays LIST] [--backend URL] [-- MODE ARGS...]}
shift
new=""
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then new=$1; shift; fi
rounds=3 students=4000 relays="1 2" backend=postgres://postgres@127.0.0.1:5432/postgres
mode=()
while [ $# -gt 0 ]; do
  case $1 in
    --) shift; mode=("$@"); break ;;
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
# Absolute: each run writes its JSON from inside its side's worktree.
out=$(cd "$out" && pwd)

# A worktree and a target directory per side; the working tree itself when NEW is empty.
checkout() {
  local name=$1 commit=$2
  if [ -z "$commit" ]; then
    echo "$root ${CARGO_TARGET_DIR:-$root/target}"
    return
  fi
  # Resolved here: inside a worktree, `HEAD` would name the worktree's own commit.
  commit=$(git -C "$root" rev-parse --verify "$commit^{commit}")
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

# One loadgen run of one side: `run SIDE DIR TARGET NAME ARGS...` writes $out/SIDE-NAME.json
# and prints loadgen's headline lines, prefixed with the side.
run() {
  local side=$1 dir=$2 target=$3 name=$4
  shift 4
  ( cd "$dir" && CARGO_TARGET_DIR=$target cargo run -q --release -p loadgen -- \
      --backend "$backend" --json "$out/$side-$name.json" "$@" 2>>"$work/ab-drain.log" ) |
    { grep -E '^(drain of|closed:|open loop|outbox, |direct, |  linked)' || true; } | sed "s/^/$side: /"
}

# The first run of each side builds it; not counted.
if [ ${#mode[@]} -eq 0 ]; then warm=(drain --students "$students" --relays 1); else warm=("${mode[@]}"); fi
run base "$base_dir" "$base_target" warm "${warm[@]}" >/dev/null
run new "$new_dir" "$new_target" warm "${warm[@]}" >/dev/null
rm -f "$out"/*-warm.json
for round in $(seq 1 "$rounds"); do
  if [ ${#mode[@]} -eq 0 ]; then
    for k in $relays; do
      run base "$base_dir" "$base_target" "relays$k-$round" drain --students "$students" --relays "$k"
      run new "$new_dir" "$new_target" "relays$k-$round" drain --students "$students" --relays "$k"
    done
  else
    run base "$base_dir" "$base_target" "${mode[0]}-$round" "${mode[@]}"
    run new "$new_dir" "$new_target" "${mode[0]}-$round" "${mode[@]}"
  fi
done

python3 - "$out" <<'EOF'
import glob, json, statistics, sys

def parts(mode, result):
    """(group, result) for each result a mode wrote: `compare` holds one per link mode
    (per concurrency since it takes a list), `suite`'s drains are a list."""
    if isinstance(result, list):
        for each in result:
            yield from parts(mode, each)
    elif "outbox" in result:
        for name in ("outbox", "direct"):
            yield f"{mode} {name}, {result[name]['in_flight']} in flight", result[name]
    else:
        yield mode, result

# Per mode (and number of relays) and side: the median of each figure over the runs.
figures = {}
for path in sorted(glob.glob(f"{sys.argv[1]}/*.json")):
    side = path.rsplit("/", 1)[1].split("-", 1)[0]
    for mode, results in json.load(open(path))["results"].items():
        for group, result in parts(mode, results):
            if "relays" in result:
                group = f"{group}, {result['relays']} relay(s)"
            found = figures.setdefault((group, side), {})
            for rate, latency, block in (("CreateStudent", "CreateStudent", result.get("create")),
                                         ("linked", "link latency", result.get("links"))):
                if not block:
                    continue
                found.setdefault((rate, "/s"), []).append(block["per_second"])
                for p in ("p50", "p99"):
                    found.setdefault((f"{latency} {p}", "ms"), []).append(block["latency"][f"{p}_ms"])
for (group, side), found in sorted(figures.items()):
    for (label, unit), values in found.items():
        print(f"{group}, {side}: {label} median {statistics.median(values):.1f} {unit} over "
              f"{len(values)} runs (min {min(values):.1f}, max {max(values):.1f})")
EOF
