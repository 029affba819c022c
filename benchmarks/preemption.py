"""The paper's future work (§C.3): preemption. The largest backlogged difference against the service rate as the
preemption threshold DELTA (`vtc:preempt=DELTA`) and the per-tenant running-memory cap (`vtc:running-cap=TOKENS`)
vary, on `overload`, `overload-multi` and the lower-bound construction (sim/lower_bound.py), in both engine modes,
each run as `simulate()` runs it (the workload's preset and pool, up to its duration). See docs/preemption.md.

Per run: the largest backlogged difference (and its ratio to plain VTC's in the same mode), the service rate (service
per second over the run, and its ratio), the preemptions for fairness (and all preemptions: paged mode also evicts
when the pool runs out), and the requests lost (neither finished nor still queued or running at the horizon: none
is expected). The goal the issue set: on `overload` (reserve) and `overload-multi` (paged), some DELTA at <= 0.5x
plain VTC's difference and >= 0.97x its service rate; on the construction, below the non-preemptive lower bound.

Run: .venv/bin/python benchmarks/preemption.py [--quick] [--deltas 0,500,...] [--caps 2500,...] [--preempt-max 1]
"""

from __future__ import annotations

import argparse

from fairserve.metrics.summary import summarize
from fairserve.sim import engine_config, simulate
from fairserve.sim.lower_bound import held_back, lower_bound_workload
from fairserve.workloads import DEFAULT_LATENCY_PROFILE, LOWER_BOUND, Workload, get_workload

DELTAS = (0, 250, 500, 1000, 2000, 4000, 8000)
CAPS = (2500, 5000, 7500)
GOAL = {("overload", "reserve"), ("overload-multi", "paged")}
BATCH = 8  # the construction's hog batch


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def workloads(mode: str) -> list[Workload]:
    return [
        get_workload("overload"),
        get_workload("overload-multi"),
        lower_bound_workload(engine_config(mode=mode), batch=BATCH),
    ]


def row(workload: Workload, spec: str, mode: str) -> dict:
    result = simulate(workload, spec, mode=mode)
    s = summarize(result.records, workload.duration_s, weights=workload.weights)
    lost = sum(r.status not in ("finished", "unfinished", "rejected") for r in result.records)
    return {
        "diff": s.max_backlogged_diff,
        "rate": s.service_per_s,
        "fair": result.fair_preemptions,
        "all": result.preemptions,
        "lost": lost + sum(r.status == "rejected" for r in result.records),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deltas", default=",".join(map(str, DELTAS)))
    ap.add_argument("--caps", default=",".join(map(str, CAPS)))
    ap.add_argument("--preempt-max", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="DELTA 500 and 2000, a cap of 5000 only")
    args = ap.parse_args()
    if args.quick:
        args.deltas, args.caps = "500,2000", "5000"
    k = f":preempt-max={args.preempt_max}" if args.preempt_max != 1 else ""
    specs = ["vtc"] + [f"vtc:preempt={d}{k}" for d in _ints(args.deltas)]
    specs += [f"vtc:running-cap={c}" for c in _ints(args.caps)]
    cfg = engine_config(DEFAULT_LATENCY_PROFILE)
    print(f"pool M = {cfg.kv_tokens} tokens; VTC's bound 2·w_q·M = {2 * 2 * cfg.kv_tokens}; w_p=1, w_q=2\n")
    print(
        "| workload | mode | policy | largest backlogged difference | × plain | service/s | × plain "
        "| fair preemptions (all) | lost |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for mode in ("reserve", "paged"):
        for wl in workloads(mode):
            plain = None
            reached = []
            lower = held_back(engine_config(mode=mode), BATCH) if wl.name == LOWER_BOUND else None
            for spec in specs:
                r = row(wl, spec, mode)
                plain = plain or r
                dx = r["diff"] / plain["diff"] if plain["diff"] else float("nan")
                rx = r["rate"] / plain["rate"]
                print(
                    f"| {wl.name} | {mode} | `{spec}` | {r['diff']:,.0f} | {dx:.2f} | {r['rate']:,.0f} | {rx:.3f} "
                    f"| {r['fair']} ({r['all']}) | {r['lost']} |"
                )
                goal = dx <= 0.5 if lower is None else r["diff"] < lower
                if spec != "vtc" and goal and rx >= 0.97 and not r["lost"]:
                    reached.append(f"`{spec}`")
            if lower is not None and not plain["diff"]:
                print(f"|  | {mode} | the construction holds nobody back here (every prompt fits at arrival) |||||||")
            elif lower is not None:
                print(
                    f"|  | {mode} | below the non-preemptive lower bound w_q·(the hog's batch output) = {lower:,.0f} "
                    f"at >= 0.97x the rate: {', '.join(reached) or 'no setting'} | | | | | | |"
                )
            elif (wl.name, mode) in GOAL:
                print(
                    f"|  | {mode} | goal (<= 0.5x difference at >= 0.97x rate) on {wl.name}: "
                    f"{', '.join(reached) or 'no setting'} | | | | | | |"
                )


if __name__ == "__main__":
    main()
