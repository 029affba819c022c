"""The CLI against the engine: `fairserve simulate --trace FILE --drain` of 10,000 requests from 1,000 clients
(scale.py's synthetic Poisson trace) against `simulate()` alone on the same trace, and `fairserve --version` and
`--help`, each a fresh process. Rounds interleave the cases; medians of wall seconds.

Targets: the whole command within 2x of `simulate()` alone; `--version` and `--help` <= 0.3 s.

Run: .venv/bin/python benchmarks/cli_speed.py [--rounds 5] [--requests 10000] [--clients 1000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scale import write_trace

from fairserve.sim import SimOptions, simulate
from fairserve.workloads import load_trace

CLI = [sys.executable, "-m", "fairserve"]


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=1_000)
    a = ap.parse_args(argv)
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    with tempfile.TemporaryDirectory() as tmp:
        trace = write_trace(Path(tmp) / "trace.csv", a.requests, a.clients)
        workload = load_trace(trace)
        times: dict[str, list[float]] = {"simulate()": [], "command": [], "--version": [], "--help": []}
        for _ in range(a.rounds):
            start = time.perf_counter()
            simulate(workload, SimOptions(policy="vtc", drain=True))
            times["simulate()"].append(time.perf_counter() - start)
            times["command"].append(wall([*CLI, "simulate", "--trace", str(trace), "--drain"]))
            times["--version"].append(wall([*CLI, "--version"]))
            times["--help"].append(wall([*CLI, "--help"]))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{a.requests:,} requests from {a.clients:,} clients, VTC, median of {a.rounds} rounds (wall seconds)\n")
    print("| case | median | range | target |")
    print("|---|---:|---:|---|")
    ratio = med["command"] / med["simulate()"]
    targets = {
        "simulate()": "",
        "command": f"{ratio:.2f}× `simulate()` (≤ 2×)",
        "--version": "≤ 0.3 s",
        "--help": "≤ 0.3 s",
    }
    names = {"command": "`fairserve simulate --trace FILE --drain`", "simulate()": "`simulate()` alone"}
    for k, v in times.items():
        print(f"| {names.get(k, f'`fairserve {k}`')} | {med[k]:.3f} s | {min(v):.3f}–{max(v):.3f} | {targets[k]} |")
    print(f"\nload average at end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
