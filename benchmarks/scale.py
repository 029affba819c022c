"""Scale: how the simulator and `fairserve simulate`'s summary grow with requests and clients.

Synthetic traces, generated here: Poisson arrivals at 3 requests/s, prompt and output lengths uniform in 16-512,
each request's client drawn uniformly. Two tables:

1. requests x clients: `simulate()` alone (FCFS / VTC, in this process) and the whole command
   `fairserve simulate --trace FILE --drain --policy P` (a child process: wall time, peak memory, and whether the
   largest backlogged difference came out exact or as a bracket). The 1,000,000-request row runs VTC only.
2. the hot loop: a fixed number of requests from 10 to 100,000 clients, `simulate()` alone, microseconds per
   request, FCFS and VTC interleaved, median of --repeats (per-step work must not grow with clients).

Run: .venv/bin/python benchmarks/scale.py [--quick] [--no-million] [--min-requests N] [--no-loop]
     [--loop-requests N] [--repeats 3]
(--quick: the 10,000-request rows and a 20,000-request hot loop, about a minute.)
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from fairserve.sim import simulate
from fairserve.workloads import Workload, load_trace

RATE = 3.0
TABLE = [
    (10_000, 10, ("fcfs", "vtc")),
    (10_000, 1_000, ("fcfs", "vtc")),
    (100_000, 10_000, ("fcfs", "vtc")),
    (1_000_000, 100_000, ("vtc",)),
]
LOOP_CLIENTS = (10, 1_000, 10_000, 100_000)


def write_trace(path: Path, requests: int, clients: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / RATE, requests))
    prompt, output = rng.integers(16, 513, requests), rng.integers(16, 513, requests)
    client = rng.integers(0, clients, requests)
    with path.open("w") as f:
        f.write("arrival_time_s,client,prompt_tokens,output_tokens\n")
        f.writelines(
            f"{a:.6f},client-{c},{p},{o}\n" for a, c, p, o in zip(arrival, client, prompt, output, strict=False)
        )
    return path


def time_simulate(workload: Workload, policy: str) -> float:
    start = time.perf_counter()
    simulate(workload, policy, drain=True)
    return time.perf_counter() - start


CHILD = """
import resource, sys, time
from fairserve.cli import main
t = time.perf_counter()
rc = main(sys.argv[1:])
print(f"@@ {time.perf_counter() - t} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}")
sys.exit(rc)
"""


def run_command(trace: Path, policy: str) -> dict:
    """`fairserve simulate --trace … --drain` in a child: seconds, peak MiB, and its difference line."""
    argv = ["simulate", "--trace", str(trace), "--drain", "--policy", policy]
    out = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, check=True).stdout
    seconds, rss_kib = re.search(r"^@@ (\S+) (\d+)$", out, re.M).groups()
    diff = re.search(r"^max service difference between backlogged clients: (.*)$", out, re.M).group(1)
    return {"s": float(seconds), "mib": int(rss_kib) / 1024, "diff": diff}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10,000-request rows, 20,000-request hot loop")
    ap.add_argument("--no-million", action="store_true", help="skip the 1,000,000-request row")
    ap.add_argument("--loop-requests", type=int, help="requests in the hot-loop table (default 100,000)")
    ap.add_argument("--min-requests", type=int, default=0, help="skip the rows with fewer requests")
    ap.add_argument("--no-loop", action="store_true", help="skip the hot-loop table")
    ap.add_argument("--repeats", type=int, default=3, help="hot loop: interleaved FCFS/VTC runs, median (default 3)")
    a = ap.parse_args(argv)
    rows = [
        r
        for r in TABLE
        if not (a.quick and r[0] > 10_000) and not (a.no_million and r[0] >= 1_000_000) and r[0] >= a.min_requests
    ]
    loop_n = a.loop_requests or (20_000 if a.quick else 100_000)
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    with tempfile.TemporaryDirectory() as tmp:
        print(
            "| requests | clients | `simulate()` FCFS / VTC | `fairserve simulate --trace … --drain`: FCFS | VTC "
            "| largest backlogged difference (VTC) |"
        )
        print("|---:|---:|---|---|---|---|")
        for requests, clients, policies in rows:
            trace = write_trace(Path(tmp) / f"scale-{requests}-{clients}.csv", requests, clients)
            workload = load_trace(trace)
            alone = {p: time_simulate(workload, p) for p in policies}
            del workload
            cmd = {p: run_command(trace, p) for p in policies}

            def cell(p, cmd=cmd):
                return f"{cmd[p]['s']:.1f} s, {cmd[p]['mib']:,.0f} MiB" if p in cmd else "—"

            print(
                f"| {requests:,} | {clients:,} | {' / '.join(f'{alone[p]:.1f} s' for p in policies)}"
                f"{' (VTC only)' if len(policies) == 1 else ''} | {cell('fcfs')} | {cell('vtc')} "
                f"| {cmd['vtc']['diff']} |",
                flush=True,
            )
        if a.no_loop:
            return 0
        print(
            f"\nhot loop: {loop_n:,} requests, `simulate()` alone, microseconds per request "
            f"(median of {a.repeats}, FCFS and VTC interleaved)\n"
        )
        print("| clients | FCFS | VTC | VTC / FCFS |")
        print("|---:|---:|---:|---:|")
        base = None
        for clients in LOOP_CLIENTS:
            workload = load_trace(write_trace(Path(tmp) / f"loop-{clients}.csv", loop_n, clients))
            runs = [(p, time_simulate(workload, p)) for _ in range(a.repeats) for p in ("fcfs", "vtc")]
            us = {p: 1e6 * float(np.median([s for q, s in runs if q == p])) / loop_n for p in ("fcfs", "vtc")}
            base = base or us
            print(
                f"| {clients:,} | {us['fcfs']:.0f} ({us['fcfs'] / base['fcfs']:.2f}×) "
                f"| {us['vtc']:.0f} ({us['vtc'] / base['vtc']:.2f}×) | {us['vtc'] / us['fcfs']:.2f}× |",
                flush=True,
            )
    print(
        f"\nload average at end: {os.getloadavg()[0]:.1f}; this process's peak: "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
