"""The simulated fleet (`fairserve simulate --engines N`, docs/fleet.md): the paper's future work (§C.3) measured.

(a) The bound: two tenants flood a fleet of N = 1, 2, 4, 8 engines (least-loaded); the largest backlogged difference
    under VTC and FCFS against the fleet's 2U = 2 max(w_p L_in, w_q M), M = N engines' pools.
(b) Auto-scaling on the `real` trace (27 tenants, 600 s): VTC, FCFS and RPM under `--autoscale 1:MAX` against MAX
    engines held all along: engine-seconds (the cost), the time to first token of every request and of the light
    tenants (all but the five busiest), the share of the backlogged tenants (Jain's index) and the rejected.
(c) Shuffle sharding: 8 engines, seven light tenants and one that floods; the light tenants' time to first token
    with shard:2 and least_loaded, with and without the flood.
(d) Speed: 10,000 requests from 1,000 tenants on one engine, a fleet of one and a fleet of eight.

Run: .venv/bin/python benchmarks/sim_fleet.py [--max 4] [--delay 30]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from fairserve.metrics import jain_window, summarize
from fairserve.sim import SimOptions, simulate
from fairserve.sim.latency import ConstantLatency
from fairserve.workloads import Arrival, Workload, get_workload

LATENCY = ConstantLatency(prefill_s_per_token=1e-4, prefill_s_fixed=0.02, decode_s=0.01)


def flood(client: str, start: float, n: int, prompt: int, output: int) -> list[Arrival]:
    return [Arrival(start + i * 1e-3, client, prompt, output) for i in range(n)]


def ttft(records, clients=None) -> np.ndarray:
    return np.array(
        [
            r.first_token_s - r.arrival_s
            for r in records
            if r.first_token_s is not None and (clients is None or r.client in clients)
        ]
    )


def bound_table() -> None:
    kv = 2_000
    print("(a) two tenants flood (400 requests each, 200 + 200 tokens), KV pool 2,000 tokens per engine")
    print("\n| engines | bound 2U | VTC | FCFS |\n|---:|---:|---:|---:|")
    for n in (1, 2, 4, 8):
        arrivals = flood("a", 0.0, 400, 200, 200) + flood("b", 0.5, 400, 200, 200)
        w = Workload("flood", arrivals, 60.0, kv_tokens=kv)
        diff = {}
        for policy in ("vtc", "fcfs"):
            r = simulate(w, SimOptions(policy=policy, latency=LATENCY, drain=True, engines=n))
            diff[policy] = summarize(r.records, r.end_s).max_backlogged_diff
        print(f"| {n} | {2 * max(200, 2 * n * kv):,} | {diff['vtc']:,.0f} | {diff['fcfs']:,.0f} |")


def scaling_table(high: int, delay: float) -> None:
    w = get_workload("real", seed=0)
    counts: dict[str, int] = {}
    for a in w.arrivals:
        counts[a.client] = counts.get(a.client, 0) + 1
    light = set(sorted(counts, key=counts.get)[:-5])  # type: ignore[arg-type]
    print(f"\n(b) `real` trace ({len(w.arrivals):,} requests, {len(counts)} tenants, {w.duration_s:.0f} s), drained")
    print(f"autoscale 1:{high}, a new engine ready {delay:g} s after it is asked for\n")
    print("| policy | fleet | engine-seconds | TTFT p50 / p95 (s), all | light tenants | Jain | rejected |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for policy in ("vtc", "fcfs", "rpm:30"):
        for fleet in (f"fixed {high}", f"autoscale 1:{high}"):
            opts = {"engines": high} if fleet.startswith("fixed") else {"autoscale": f"1:{high}"}
            r = simulate(w, SimOptions(policy=policy, drain=True, scale_delay_s=delay, scale_wait_s=5.0, **opts))
            s = summarize(r.records, r.end_s, window_s=jain_window(r.end_s))
            a, li = ttft(r.records), ttft(r.records, light)
            rejected = sum(x.status == "rejected" for x in r.records)
            jain = f"{s.jain_index:.3f}" if s.jain_index is not None else "n/a"
            print(
                f"| {policy} | {fleet} | {r.fleet.engine_seconds:,.0f} | {np.median(a):.2f} / "
                f"{np.percentile(a, 95):.2f} | {np.median(li):.2f} / {np.percentile(li, 95):.2f} | {jain} | "
                f"{rejected} |"
            )


def share_table(delay: float) -> None:
    """The backlogged tenants' shares in the 60 s windows in which at least two are backlogged (90% of the window),
    while the fleet scales 1:4: the largest deviation from the fair (equal) share."""
    from fairserve.metrics import backlogged, service_curves, time_grid

    print("\n(b2) shares across scaling events: autoscale 1:4, VTC, 60 s windows with >= 2 tenants backlogged\n")
    print("| workload | windows | largest deviation from the fair share | engine-seconds (fixed 4) |")
    print("|---|---:|---:|---:|")
    for name in ("overload", "overload-multi"):
        w = get_workload(name)
        r = simulate(w, SimOptions(autoscale="1:4", scale_delay_s=delay, scale_wait_s=5.0))
        times = time_grid(w.duration_s)
        curves, busy = service_curves(r.records, times), backlogged(r.records, times)
        worst, windows = 0.0, 0
        for a in range(0, len(times) - 60, 60):
            got = {c: curves[c][a + 60] - curves[c][a] for c in curves if busy[c][a : a + 61].mean() >= 0.9}
            if len(got) >= 2:
                fair = sum(got.values()) / len(got)
                windows += 1
                worst = max(worst, *(abs(v - fair) / fair for v in got.values()))
        fixed = 4 * w.duration_s
        print(f"| {name} | {windows} | {worst:.1%} | {r.fleet.engine_seconds:,.0f} ({fixed:,.0f}) |")


def shard_table() -> None:
    light = [f"t{i}" for i in range(7)]
    calm = [Arrival(s + 0.1 * i, c, 200, 100) for s in range(0, 10) for i, c in enumerate(light)]
    storm = flood("flood", 0.0, 400, 300, 300)
    print("\n(c) 8 engines (KV 2,000 each); 7 light tenants (a request per second each, 10 s) and one flooding 400")
    print("\n| policy | dispatch | light TTFT p50 / p95 (s), calm | with the flood |\n|---|---|---:|---:|")
    for policy in ("fcfs", "vtc"):
        for dispatch in ("least_loaded", "shard:2"):
            cells = []
            for arrivals in (calm, calm + storm):
                w = Workload("storm", sorted(arrivals, key=lambda a: a.arrival_s), 10.0, kv_tokens=2_000)
                opts = SimOptions(policy=policy, latency=LATENCY, drain=True, engines=8, dispatch=dispatch)
                t = ttft(simulate(w, opts).records, set(light))
                cells.append(f"{np.median(t):.2f} / {np.percentile(t, 95):.2f}")
            print(f"| {policy} | {dispatch} | {cells[0]} | {cells[1]} |")


def speed_table(rounds: int = 3) -> None:
    import statistics
    import tempfile
    from pathlib import Path

    from scale import write_trace

    from fairserve.workloads import load_trace

    with tempfile.TemporaryDirectory() as tmp:
        w = load_trace(write_trace(Path(tmp) / "t.csv", 10_000, 1_000))
    cases = {"one engine": {}, "a fleet of 1": {"engines": 1}, "a fleet of 8": {"engines": 8}}
    times: dict[str, list[float]] = {k: [] for k in cases}
    simulate(w, SimOptions(drain=True, engines=1))  # NOTE: the gateway's modules loaded before timing
    for _ in range(rounds):
        for name, opts in cases.items():
            start = time.perf_counter()
            simulate(w, SimOptions(drain=True, **opts))
            times[name].append(time.perf_counter() - start)
    print(f"\n(d) speed: 10,000 requests from 1,000 tenants (scale.py's trace), drained; median of {rounds} rounds\n")
    print("| run | seconds |\n|---|---:|")
    for name, v in times.items():
        print(f"| {name} | {statistics.median(v):.2f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max", type=int, default=4, help="the fleet's most engines (default: 4)")
    ap.add_argument("--delay", type=float, default=30.0, help="a new engine's start-up in s (default: 30)")
    a = ap.parse_args(argv)
    start = time.perf_counter()
    bound_table()
    scaling_table(a.max, a.delay)
    share_table(a.delay)
    shard_table()
    speed_table()
    print(f"\n({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
