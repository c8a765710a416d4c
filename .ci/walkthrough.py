#!/usr/bin/env python3
"""Runs the README's grpcurl walk-through against the real binaries and checks its output.

The walk-through is every ```console block between the markers
<!-- walkthrough:start --> and <!-- walkthrough:end --> in README.md. A line starting with
"$ " is a command (a trailing backslash continues it on the next line); the lines after it,
up to the next command, are its expected output (stdout and stderr together). Commands run
in order in one bash session, so variables carry over, from the repository root, while
`cargo run -p devstack` (the README's start command) runs the system on a fresh ./data.

Outputs are compared exactly after normalisation: each distinct UUID becomes <id-N>
numbered in order of first appearance (so the same id must recur where the README shows the
same id), and RFC 3339 timestamps become <timestamp>.

Exit statuses are checked too: a step whose expected output starts with "ERROR:" (grpcurl
reporting a gRPC error) must exit non-zero, every other step must exit 0.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
START_COMMAND = ["cargo", "run", "-q", "-p", "devstack"]
STEPS_TIMEOUT = 300


def parse_walkthrough(readme):
    start = readme.index("<!-- walkthrough:start -->")
    end = readme.index("<!-- walkthrough:end -->")
    steps = []
    for block in re.findall(r"```console\n(.*?)```", readme[start:end], re.S):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            if not lines[i].startswith("$ "):
                raise SystemExit(f"walkthrough: output without a command: {lines[i]!r}")
            command = lines[i][2:]
            while command.endswith("\\"):
                i += 1
                command += "\n" + lines[i]
            i += 1
            expected = []
            while i < len(lines) and not lines[i].startswith("$ "):
                expected.append(lines[i])
                i += 1
            steps.append((command, expected))
    return steps


class Normaliser:
    def __init__(self):
        self.ids = {}

    def __call__(self, lines):
        out = []
        for line in lines:
            line = UUID.sub(lambda m: self.ids.setdefault(m.group(0), f"<id-{len(self.ids) + 1}>"), line)
            out.append(TIMESTAMP.sub("<timestamp>", line))
        return out


MARKER = "@@walkthrough-step-done@@"


def run_steps(steps):
    script = []
    for command, _ in steps:
        script.append(f"{{ {command}\n}} 2>&1\necho {MARKER} $?\n")
    shell = subprocess.Popen(["bash", "-c", "".join(script)], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = shell.communicate(timeout=STEPS_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(shell.pid, signal.SIGKILL)
        stdout, stderr = shell.communicate()
        stderr += f"\nwalkthrough: the steps did not finish within {STEPS_TIMEOUT} s"
    # Each step's output ends with the marker line carrying its exit status.
    outputs = []
    current = []
    for line in stdout.splitlines():
        if line.startswith(MARKER + " "):
            outputs.append((current, int(line[len(MARKER) + 1:])))
            current = []
        else:
            current.append(line)
    # Lines after the last marker belong to a step that never finished.
    return outputs, stderr


def main():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        steps = parse_walkthrough(f.read())
    if not steps:
        raise SystemExit("walkthrough: no steps found in README.md")
    shutil.rmtree(os.path.join(ROOT, "data"), ignore_errors=True)

    stack = subprocess.Popen(START_COMMAND, cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)
    started, stopped = [], []
    try:
        deadline = time.time() + 600
        for line in stack.stdout:
            print(f"devstack: {line.rstrip()}")
            started.append(line)
            if "all three are up" in line:
                break
            if time.time() > deadline:
                raise SystemExit("walkthrough: the system did not come up")
        else:
            raise SystemExit(f"walkthrough: devstack exited early with {stack.wait()}")

        outputs, stderr = run_steps(steps)
        if len(outputs) != len(steps):
            print(stderr)
            print(f"walkthrough: step {len(outputs) + 1} did not finish: $ {steps[len(outputs)][0]}")
        expected_norm, actual_norm = Normaliser(), Normaliser()
        failures = 0
        for (command, expected), (actual, exit_status) in zip(steps, outputs):
            want, got = expected_norm(expected), actual_norm(actual)
            expects_error = bool(expected) and expected[0].startswith("ERROR:")
            status_ok = (exit_status != 0) if expects_error else (exit_status == 0)
            status = "ok" if want == got and status_ok else "MISMATCH"
            print(f"walkthrough: {status}: $ {command.splitlines()[0][:100]} (exit {exit_status})")
            if want != got:
                failures += 1
                print("  expected:\n    " + "\n    ".join(want))
                print("  actual:\n    " + "\n    ".join(got))
            elif not status_ok:
                failures += 1
                wanted = "non-zero" if expects_error else "0"
                print(f"  expected exit status {wanted}, got {exit_status}")
    finally:
        # Ctrl-C, as a person would: devstack must stop all three and exit cleanly.
        try:
            os.killpg(stack.pid, signal.SIGINT)
        except ProcessLookupError:
            pass  # devstack already exited; its own message says why
        try:
            rest, _ = stack.communicate(timeout=30)
            for line in rest.splitlines():
                print(f"devstack: {line}")
            stopped = rest.splitlines()
        except subprocess.TimeoutExpired:
            os.killpg(stack.pid, signal.SIGKILL)
            raise SystemExit("walkthrough: devstack did not stop on Ctrl-C")
    if stack.returncode != 0:
        raise SystemExit(f"walkthrough: devstack exited with {stack.returncode} after Ctrl-C")
    # README: devstack waits until both services are healthy, and Ctrl-C stops all three
    # cleanly: each told with SIGTERM, and each stopped by it (devstack kills one still
    # running 10 s later, and says so).
    for service in ("users-svc", "student-svc"):
        if not any(line.startswith(service) and " healthy on " in line for line in started):
            raise SystemExit(f"walkthrough: devstack said all three are up before {service} was healthy")
    for name in ("users-svc", "student-svc", "relay"):
        with open(os.path.join(ROOT, "data", f"{name}.log"), encoding="utf-8") as log:
            if 'shutting down signal="SIGTERM"' not in log.read():
                raise SystemExit(f"walkthrough: {name} was not stopped with SIGTERM (data/{name}.log)")
        if f"{name} stopped" not in stopped:
            raise SystemExit(f"walkthrough: {name} did not stop on SIGTERM: {stopped}")
    if len(outputs) != len(steps):
        raise SystemExit(f"walkthrough: only {len(outputs)} of {len(steps)} steps finished")
    if failures:
        raise SystemExit(f"walkthrough: {failures} of {len(steps)} steps differ from README.md")
    print(f"walkthrough: {len(steps)} passed, 0 failed")


if __name__ == "__main__":
    main()
