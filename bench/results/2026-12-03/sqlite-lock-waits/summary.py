#!/usr/bin/env python3
"""Per run: the load (CreateStudent /s over the run's seconds), each process's
sqlite_write_lock_waits_total at its last scrape, and that total per second of load and
per student. student-svc scraped on 19101, users-svc on 19102, the relay on 19103. The
last scrape comes after loadgen has waited for every link, so a total holds the pauses of
the drain after an open loop too, and its rate is an upper bound. The closed loops reached
1,094 and 932 CreateStudent a second: this box's SQLite maximum that afternoon. Its output
is summary.txt."""
import json, pathlib

D = pathlib.Path(__file__).parent
NAMES = {"19101": "student-svc", "19102": "users-svc", "19103": "relay"}
print("run            load /s  seconds | waits (total, /s, per student) by process")
for name in ["open-300-1", "open-300-2", "open-600-1", "open-600-2", "closed-32-1", "closed-32-2"]:
    results = json.loads((D / f"{name}.json").read_text())["results"]
    run = results.get("open") or results.get("closed")
    run = run[0] if isinstance(run, list) else run
    students, seconds = run["create"]["calls"], run["create"]["seconds"]
    last = {}
    for line in (D / f"{name}-scrapes.txt").read_text().splitlines():
        port, value = line.split()
        last[port] = float(value)
    parts = []
    for port, process in NAMES.items():
        total = last.get(port, 0.0)
        parts.append(f"{process} {total:.0f} ({total / seconds:.0f}/s, {total / students:.3f})")
    print(f"{name:<12} {students / seconds:9.0f} {seconds:8.1f} | " + "; ".join(parts))
