# Sourced by this directory's run.sh files. `renice_while_running LEVEL NAME…` keeps every
# thread of every process named NAME at nice LEVEL (loadgen starts them mid-run, so it
# looks again every 20 ms) until it is killed.
renice_while_running() {
    local level=$1; shift
    while sleep 0.02; do
        for name in "$@"; do
            for p in $(pgrep -x "$name"); do
                for t in /proc/$p/task/*; do renice -n "$level" -p "${t##*/}" >/dev/null 2>&1 || true; done
            done
        done
    done
}
