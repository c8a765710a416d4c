"""Prints the before/after table of run.sh's results: CreateStudent alone at 32 in flight
(per second and as a ratio to the round's pgbench ceiling, and student-svc's CPU per
student), CPU per student (all processes) and p50s at 1,000/s, and outbox vs direct at 4
in flight (p50 ratio, linked/s over direct's completed/s)."""
import json
import pathlib
import statistics
import sys

d = pathlib.Path(sys.argv[1])


def load(name):
    return json.loads((d / name).read_text())["results"]


def cpu_ms_per_student(run, calls):
    return sum(p["cpu_seconds"] for p in run["processes"]) * 1000 / calls


print("| side | round | @32 alone: per s | ÷ ceiling | student-svc CPU ms per student "
      "| 1,000/s: CPU ms per student | CreateStudent p50 ms | link p50 ms "
      "| @4 in flight: p50 outbox ÷ direct | linked/s ÷ direct |")
print("|---|---|---|---|---|---|---|---|---|---|")
rows = {}
for side in ("before", "after"):
    for n in (1, 2, 3):
        ceiling = load(f"ceiling-{n}.json")["ceiling"]["pgbench"]["create_per_second"]
        closed = load(f"closed32-{side}-{n}.json")["closed"]
        alone = closed["create"]["per_second"]
        open_ = load(f"open-1000-{side}-{n}.json")["open"]
        compare = load(f"compare-{side}-{n}.json")["compare"][0]
        linked = compare["outbox"]["links"]["per_second"] / compare["direct"]["create"]["per_second"]
        row = (alone, alone / ceiling, cpu_ms_per_student(closed, closed["create"]["calls"]),
               cpu_ms_per_student(open_, open_["create"]["calls"]),
               open_["create"]["latency"]["p50_ms"], open_["links"]["latency"]["p50_ms"],
               compare["p50_ratio"], linked)
        rows.setdefault(side, []).append(row)
        print(f"| {side} | {n} | {row[0]:,.0f} | {row[1]:.2f} | {row[2]:.3f} | {row[3]:.3f} "
              f"| {row[4]:.1f} | {row[5]:.1f} | {row[6]:.2f} | {row[7]:.2f} |")
for side, side_rows in rows.items():
    c = [statistics.mean(col) for col in zip(*side_rows)]
    print(f"| {side} | mean | {c[0]:,.0f} | {c[1]:.2f} | {c[2]:.3f} | {c[3]:.3f} "
          f"| {c[4]:.1f} | {c[5]:.1f} | {c[6]:.2f} | {c[7]:.2f} |")
