"""Scale: how the simulator and `fairserve simulate`'s summary grow with requests and clients.

Synthetic traces, generated here: Poisson arrivals at 3 requests/s, prompt and output lengths uniform in 16-512,
each request's client drawn uniformly. Two tables:

1. requests x clients, run until every request is done, each in a child process doing what
   `fairserve simulate --trace FILE --drain --policy P` does: load the trace, `simulate()` (its seconds, and the
   process's peak memory by then), the summary (its own seconds, the peak memory after it, and whether the largest
   backlogged difference came out exact or as a bracket). The 1,000,000-request row runs VTC only.
2. the hot loop: a fixed number of requests from 10 to 100,000 clients, `simulate()` alone, microseconds per
   request, FCFS and VTC interleaved, median of --repeats (per-request work must not grow with clients).

Targets: `simulate()` of 100,000 requests from 10,000 clients <= 4 s and of 1,000,000 from 100,000 <= 45 s under
VTC, with peak memory below 2.3 GiB.

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
    """CPU seconds of `simulate()` until every request is done."""
    start = time.process_time()
    simulate(workload, policy, drain=True)
    return time.process_time() - start


CHILD = """
import resource, sys, time
from fairserve.cli import format_summary
from fairserve.core import make_cost
from fairserve.metrics import summarize
from fairserve.sim import simulate
from fairserve.workloads import load_trace
clock = time.process_time  # NOTE: CPU seconds: on a shared machine, wall time depends on the other processes
t0, w0 = clock(), time.perf_counter()
workload = load_trace(sys.argv[1])
t1 = clock()
result = simulate(workload, sys.argv[2], drain=True)
t2, w2 = clock(), time.perf_counter()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
summary = summarize(result.records, result.end_s, 1.0, 2.0, workload.weights, cost=make_cost(None, 1.0, 2.0))
t3 = clock()
print(format_summary(result, summary))
print(f"@@ {t1 - t0} {t2 - t1} {t3 - t2} {peak} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} {w2 - w0}")
"""


def run_child(trace: Path, policy: str) -> dict:
    """What `fairserve simulate --trace … --drain` does, phase by phase, in a child: seconds and peak MiB."""
    out = subprocess.run([sys.executable, "-c", CHILD, str(trace), policy], capture_output=True, text=True, check=True)
    found = re.search(r"^@@ (\S+) (\S+) (\S+) (\d+) (\d+) (\S+)$", out.stdout, re.M)
    load, sim, summary, peak_sim, peak, wall = found.groups()
    diff = re.search(r"^max service difference between backlogged clients: (.*)$", out.stdout, re.M).group(1)
    return {
        "load": float(load),
        "sim": float(sim),
        "summary": float(summary),
        "sim_mib": int(peak_sim) / 1024,
        "mib": int(peak) / 1024,
        "wall": float(wall),
        "diff": diff,
    }


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
            "CPU seconds of each phase (wall seconds of loading + simulating in brackets), in a child process per row\n"
        )
        print(
            "| requests | clients | policy | `simulate()` | peak memory by then | summary | peak memory | load "
            "| largest backlogged difference |"
        )
        print("|---:|---:|---|---:|---:|---:|---:|---:|---|")
        for requests, clients, policies in rows:
            trace = write_trace(Path(tmp) / f"scale-{requests}-{clients}.csv", requests, clients)
            for p in policies:
                c = run_child(trace, p)
                print(
                    f"| {requests:,} | {clients:,} | {p} | {c['sim']:.1f} s ({c['wall']:.1f} s) "
                    f"| {c['sim_mib']:,.0f} MiB | {c['summary']:.1f} s | {c['mib']:,.0f} MiB | {c['load']:.1f} s "
                    f"| {c['diff']} |",
                    flush=True,
                )
        if a.no_loop:
            return 0
        print(
            f"\nhot loop: {loop_n:,} requests, `simulate()` alone, CPU microseconds per request "
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
