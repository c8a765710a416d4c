#!/usr/bin/env python3
"""Tabulates this directory's runs: per wait and round, the compare at 4 in flight
(CreateStudent p50 outbox and direct, their ratio, link p50, relay + users-svc CPU in ms
per row) and the open loop at 700/s (CreateStudent p50, link p50 and p99). Its output is
summary.txt."""
import json, pathlib

D = pathlib.Path(__file__).parent
print("wait round | @4: outbox p50  direct p50  ratio  link p50  bg CPU ms/row | 700/s: create p50  link p50  link p99")
runs = sorted(
    (int(p.stem.split("-")[1]), int(p.stem.split("-")[2])) for p in D.glob("compare-*.json")
)
for ms, rnd in runs:
    if (D / f"open-{ms}-{rnd}.json").exists():
        c = json.loads((D / f"compare-{ms}-{rnd}.json").read_text())["results"]["compare"][0]
        o = json.loads((D / f"open-{ms}-{rnd}.json").read_text())["results"]
        o = o["open"][0] if isinstance(o.get("open"), list) else o["open"]
        out, direct = c["outbox"], c["direct"]
        bg = sum(p["cpu_seconds"] for p in out["processes"] if p["name"] != "student-svc")
        print(f"{ms:>4} {rnd:>5} | {out['create']['latency']['p50_ms']:13.2f} {direct['create']['latency']['p50_ms']:11.2f}"
              f" {c['p50_ratio']:6.2f} {out['links']['latency']['p50_ms']:9.2f}"
              f" {1000 * bg / out['links']['rows']:14.3f} | {o['create']['latency']['p50_ms']:17.2f}"
              f" {o['links']['latency']['p50_ms']:9.2f} {o['links']['latency']['p99_ms']:9.2f}")
