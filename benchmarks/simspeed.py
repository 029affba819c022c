"""Simulator speed: the event-driven engine side by side with the step-by-step oracle (tests/support/oracle.py, the
loop the engine replaced), in one run, interleaved, medians over repeats; the two give the same records (checked).

1. Each (workload, policy) as `simulate()` runs it (its pool, preset and weights, up to its duration): oracle and
   engine CPU seconds, the speed-up, × real time. Then `overload` with 2,048-token outputs run until every request
   is done (long outputs: hundreds of decode steps per request).
2. Cost against tokens: each workload run until every request is done, with its outputs as they are and with every
   output ×10 (requests that no longer fit the pool are rejected, as by the engine), the two runs alternating: the
   engine's seconds and their ratio (of the medians, and the median of each pair's), the decode steps (×10 and
   more). Runs of a few tens of milliseconds vary by a third from one to the next on a shared machine: this table
   takes three times the repeats, each sample four runs back to back.

Targets: >= 3x the oracle on `real` and `overload` under VTC, >= 10x on the long-output run, <= 1.3x the time with
every output x10. `real` needs the Arena trace; it is skipped, with a message, when the trace is missing.

Run: .venv/bin/python benchmarks/simspeed.py [--quick] [--workloads real,overload] [--policies fcfs,vtc] [--repeats 5]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.oracle import StepEngine  # noqa: E402

from fairserve.core import Ledger, check_policy, make_policy  # noqa: E402
from fairserve.sim import SimEngine, SimResult, engine_config, get_latency_model  # noqa: E402
from fairserve.workloads import ALL_WORKLOADS, DEFAULT_LATENCY_PROFILE, Workload, WorkloadError, get_workload  # noqa: E402

WORKLOADS = ("real", "overload", "overload-multi")
POLICIES = ("fcfs", "vtc")
TARGET_X, LONG_TARGET_X, TOKENS_TARGET = 3.0, 10.0, 1.3
BATCH = 4  # runs per sample in the cost-against-tokens table


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def longer(workload: Workload, factor: float = 0, to: int = 0) -> Workload:
    """The workload with every output `factor` times longer (or `to` tokens long)."""
    arrivals = [replace(a, output_tokens=to or round(a.output_tokens * factor)) for a in workload.arrivals]
    return replace(workload, arrivals=arrivals)


def run(kind: type, workload: Workload, policy: str, drain: bool) -> tuple[float, SimResult]:
    """One simulation as `simulate()` builds it, timed in CPU seconds (on a shared machine, wall time depends on the
    other processes)."""
    profile = workload.latency_profile or DEFAULT_LATENCY_PROFILE
    ledger = Ledger(make_policy(policy), weights=workload.weights)
    engine = kind(ledger, get_latency_model(profile), engine_config(profile, workload.kv_tokens))
    gc.collect()
    start = time.process_time()
    result = engine.run(workload.arrivals, until_s=None if drain else workload.duration_s)
    return time.process_time() - start, result


def side_by_side(workload: Workload, policy: str, drain: bool, repeats: int) -> dict:
    walls: dict[str, list[float]] = {"oracle": [], "engine": []}
    results = {}
    for i in range(repeats):
        for name in ("oracle", "engine") if i % 2 == 0 else ("engine", "oracle"):
            wall, results[name] = run(StepEngine if name == "oracle" else SimEngine, workload, policy, drain)
            walls[name].append(wall)
    a, b = results["oracle"], results["engine"]
    same = a.records == b.records and (a.end_s, a.decode_steps, a.busy_s) == (b.end_s, b.decode_steps, b.busy_s)
    return {
        "oracle": statistics.median(walls["oracle"]),
        "engine": statistics.median(walls["engine"]),
        "sim_s": b.end_s,
        "steps": b.decode_steps,
        "same": same,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 repeats, no long-output or x10 runs (< 20 s)")
    ap.add_argument(
        "--workloads", default=",".join(WORKLOADS), help=f"comma-separated, from: {', '.join(ALL_WORKLOADS)}"
    )
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated policy specs")
    ap.add_argument("--repeats", type=int, help="timed runs per engine and case; default 5 (quick: 2)")
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
    run(SimEngine, next(iter(workloads.values())), policies[0], False)  # warm-up (imports, caches)

    print(
        f"Simulator speed, median of {repeats} interleaved runs each; oracle = the step-by-step loop "
        f"(tests/support/oracle.py). Target: >= {TARGET_X:g}x under VTC on real and overload.\n"
    )
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; CPU seconds\n")
    print("| workload | policy | decode steps | oracle s | engine s | speed-up | × real time | same records |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    cases = [(w, p, workloads[w], False) for w in workloads for p in policies]
    if not a.quick and "overload" in workloads:
        cases.append(("overload, 2,048-token outputs, drained", "vtc", longer(workloads["overload"], to=2048), True))
    for label, policy, workload, drain in cases:
        r = side_by_side(workload, policy, drain, repeats if not drain else max(1, min(repeats, 3)))
        print(
            f"| {label} | {policy} | {r['steps']:,} | {r['oracle']:.3f} | {r['engine']:.3f} "
            f"| {r['oracle'] / r['engine']:.1f}× | {r['sim_s'] / r['engine']:,.0f}× | {'yes' if r['same'] else 'NO'} |",
            flush=True,
        )
    if a.quick:
        return 0
    print(
        f"\nCost against tokens: each workload until every request is done, outputs as they are and ×10, "
        f"the engine alone, alternating, median of {3 * repeats} samples of {BATCH} runs. "
        f"Target: <= {TOKENS_TARGET:g}x.\n"
    )
    print("| workload | policy | decode steps ×1 / ×10 | engine s ×1 | engine s ×10 | ×10 / ×1 | pairs' median |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, workload in workloads.items():
        for policy in policies:
            walls: dict[int, list[float]] = {1: [], 10: []}
            steps = {}
            both = {factor: longer(workload, factor) for factor in (1, 10)}
            for _ in range(3 * repeats):
                for factor in (1, 10):
                    # NOTE: a sample is BATCH runs back to back: one run is a few tens of ms, which the host's
                    # slowdowns move by a third
                    times = [run(SimEngine, both[factor], policy, True) for _ in range(BATCH)]
                    walls[factor].append(sum(t for t, _ in times) / BATCH)
                    steps[factor] = times[0][1].decode_steps
            one, ten = statistics.median(walls[1]), statistics.median(walls[10])
            pairs = statistics.median(b / a for a, b in zip(walls[1], walls[10], strict=True))
            print(
                f"| {name} | {policy} | {steps[1]:,} / {steps[10]:,} | {one:.3f} | {ten:.3f} | {ten / one:.2f}× "
                f"| {pairs:.2f}× |",
                flush=True,
            )
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
