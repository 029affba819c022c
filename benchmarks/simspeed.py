"""Simulator speed: wall seconds of `simulate(workload, policy)` and simulated seconds per wall second.

Workloads are built once, outside the timing. Runs are interleaved (every workload × policy once per repeat) so
machine noise hits them alike; the table reports the median over repeats (and the fastest). Target: >= 2,000x real
time, i.e. the 10-minute `real` trace in <= 0.3 s. `real` needs the Arena trace; it is skipped, with a message,
when the trace is missing.

Run: .venv/bin/python benchmarks/simspeed.py [--quick] [--workloads real,overload] [--policies fcfs,vtc] [--repeats 5]
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np

from fairserve.core import check_policy
from fairserve.sim import simulate
from fairserve.workloads import ALL_WORKLOADS, Workload, WorkloadError, get_workload

WORKLOADS = ("real", "overload", "overload-multi")
POLICIES = ("fcfs", "vtc")
TARGET_X = 2_000.0


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 repeats (< 20 s)")
    ap.add_argument(
        "--workloads", default=",".join(WORKLOADS), help=f"comma-separated, from: {', '.join(ALL_WORKLOADS)}"
    )
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated policy specs")
    ap.add_argument("--repeats", type=int, help="timed runs per (workload, policy); default 5 (quick: 2)")
    a = ap.parse_args(argv)
    names, policies = _csv(a.workloads), _csv(a.policies)
    repeats = a.repeats if a.repeats is not None else (2 if a.quick else 5)
    if not names or not policies:
        ap.error("--workloads and --policies must name at least one each")
    if repeats < 1:
        ap.error(f"--repeats must be >= 1, got {repeats}")
    for name in names:
        if name not in ALL_WORKLOADS:
            ap.error(f"unknown workload {name!r}; choose from: {', '.join(ALL_WORKLOADS)}")
    for p in policies:
        try:
            check_policy(p)
        except ValueError as e:
            ap.error(str(e))

    workloads: dict[str, Workload] = {}
    for name in names:
        try:
            workloads[name] = get_workload(name)
        except WorkloadError as e:
            print(f"> skipped `{name}`: {e}\n")
    if not workloads:
        ap.error("no workload could be built")

    runs = [(w, p) for w in workloads for p in policies]
    walls: dict[tuple[str, str], list[float]] = {k: [] for k in runs}
    sim_s: dict[tuple[str, str], float] = {}
    steps: dict[tuple[str, str], int] = {}
    simulate(workloads[runs[0][0]], policies[0])  # warm-up (imports, caches)
    for _ in range(repeats):
        for w, p in runs:
            gc.collect()
            t0 = time.perf_counter()
            res = simulate(workloads[w], p)
            walls[w, p].append(time.perf_counter() - t0)
            sim_s[w, p], steps[w, p] = res.end_s, res.decode_steps

    print(
        f"Simulator speed, median (and fastest) of {repeats} runs; simulated seconds = result.end_s. "
        f"Target: >= {TARGET_X:,.0f}x real time.\n"
    )
    print(
        "| workload | policy | requests | decode steps | simulated s | wall s (median) | wall s (min) "
        "| × real time | steps / wall s | target |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for w, p in runs:
        med, low = float(np.median(walls[w, p])), min(walls[w, p])
        speed = sim_s[w, p] / med
        verdict = "met" if speed >= TARGET_X else "NOT met"
        print(
            f"| {w} | {p} | {len(workloads[w].arrivals):,} | {steps[w, p]:,} | {sim_s[w, p]:.1f} | {med:.3f} "
            f"| {low:.3f} | {speed:,.0f}× | {steps[w, p] / med:,.0f} | {verdict} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
