"""Prints recheck.sh's table: CreateStudent alone at 32 in flight (per second, student-svc
CPU ms per student) and, at 1,000/s, CPU ms per student of each process and in all."""
import json
import pathlib
import statistics
import sys

d = pathlib.Path(sys.argv[1])


def load(name):
    return json.loads((d / name).read_text())["results"]


def cpu(run, name=None):
    calls = run["create"]["calls"]
    return sum(p["cpu_seconds"] for p in run["processes"]
               if name is None or p["name"] == name) * 1000 / calls


print("| side | round | @32 alone: per s | student-svc CPU ms per student | 1,000/s: CPU ms per "
      "student, all | student-svc | users-svc | relay |")
print("|---|---|---|---|---|---|---|---|")
rows = {}
for side in ("before", "after"):
    for n in (1, 2, 3):
        closed = load(f"recheck-closed32-{side}-{n}.json")["closed"]
        open_ = load(f"recheck-open-1000-{side}-{n}.json")["open"]
        row = (closed["create"]["per_second"], cpu(closed), cpu(open_),
               cpu(open_, "student-svc"), cpu(open_, "users-svc"), cpu(open_, "relay-0"))
        rows.setdefault(side, []).append(row)
        print(f"| {side} | {n} | {row[0]:,.0f} | {row[1]:.3f} | {row[2]:.3f} | {row[3]:.3f} "
              f"| {row[4]:.3f} | {row[5]:.3f} |")
for side, side_rows in rows.items():
    c = [statistics.mean(col) for col in zip(*side_rows)]
    print(f"| {side} | mean | {c[0]:,.0f} | {c[1]:.3f} | {c[2]:.3f} | {c[3]:.3f} | {c[4]:.3f} "
          f"| {c[5]:.3f} |")
