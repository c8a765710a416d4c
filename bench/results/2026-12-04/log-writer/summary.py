"""Prints the before/after table of run.sh's results: CPU per student (all processes) and
CreateStudent p50 at 1,000/s, and outbox vs direct at 4 in flight (p50 ratio, linked/s
over direct's completed/s)."""
import json
import pathlib
import statistics
import sys

d = pathlib.Path(sys.argv[1])


def load(name):
    return json.loads((d / name).read_text())["results"]


print("| side | round | 1,000/s: CPU ms per student | CreateStudent p50 ms | link p50 ms "
      "| @4 in flight: p50 outbox ÷ direct | linked/s ÷ direct |")
print("|---|---|---|---|---|---|---|")
means = {}
for side in ("before", "after"):
    for n in (1, 2, 3):
        open_ = load(f"open-1000-{side}-{n}.json")["open"]
        calls = open_["create"]["calls"]
        cpu = sum(p["cpu_seconds"] for p in open_["processes"]) * 1000 / calls
        compare = load(f"compare-{side}-{n}.json")["compare"][0]
        linked = compare["outbox"]["links"]["per_second"] / compare["direct"]["create"]["per_second"]
        row = (cpu, open_["create"]["latency"]["p50_ms"], open_["links"]["latency"]["p50_ms"],
               compare["p50_ratio"], linked)
        means.setdefault(side, []).append(row)
        print(f"| {side} | {n} | {row[0]:.3f} | {row[1]:.1f} | {row[2]:.1f} | {row[3]:.2f} | {row[4]:.2f} |")
for side, rows in means.items():
    cols = [statistics.mean(c) for c in zip(*rows)]
    print(f"| {side} | mean | {cols[0]:.3f} | {cols[1]:.1f} | {cols[2]:.1f} | {cols[3]:.2f} | {cols[4]:.2f} |")
