"""The paper's future work (§C.3): a fleet and auto-scaling. The simulated fleet (`fairserve simulate --engines N`,
sim/fleet.py, docs/fleet.md) answers the two directions the paper leaves open: a central dispatcher over several
engines ("its bound depends on aggregate serving-engine memory") and auto-scaling ("may mitigate RPM-related
throughput degradation, but brings operational cost").

(a) The bound: `overload` on N = 1, 2, 4, 8 engines (least-loaded), each with a 2,000-token pool so that eight are
    still overloaded; VTC's largest backlogged difference against the fleet's 2U, M = the N pools together, with
    FCFS beside it. The goal: VTC within the bound at every N.
(b) Auto-scaling on the `real` trace: VTC, FCFS and RPM (30 a minute) on 1 to 4 engines (`autoscale=1:4`, an engine
    asked for after 5 s of queueing, ready 30 s later) against 4 engines held all along. The goal, the paper's
    conjecture answered: RPM rejects as many requests under auto-scaling as on the fixed fleet (its limits are blind
    to capacity), while VTC rejects none with fewer engine-seconds than the fixed fleet.
(c) Shuffle sharding: `flood` (seven light tenants, one sending 300 requests at once) on 8 engines, shard:2 against
    least_loaded, with the flood and without it (the same arrivals less the flooding tenant's). The goal: with
    shard:2 the light tenants' median time to first token with the flood within 1.2x of without, FCFS and VTC.
These are our own findings (the paper leaves the fleet as future work)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..workloads import DEFAULT_KV_TOKENS
from ..workloads.flood import (
    BURST,
    BURST_AT_S,
    BURST_OUTPUT,
    BURST_PROMPT,
    DURATION_S,
    FLOOD,
    LIGHT,
    LIGHT_OUTPUT,
    LIGHT_PROMPT,
)
from .runs import REAL, RunOutput, RunSpec
from .verdicts import Results, Verdict

SECTION = "The paper's future work (§C.3): a fleet and auto-scaling"
SOURCE = "beyond §C.3, p. 24 (the paper's future work: a central dispatcher over engines, auto-scaling)"

BOUND_WORKLOAD, POOL, SIZES, BOUND_POLICIES = "overload", 2_000, (1, 2, 4, 8), ("vtc", "fcfs")
SCALE_POLICIES, LOW, HIGH, WAIT_S, DELAY_S = ("vtc", "fcfs", "rpm:30"), 1, 4, 5.0, 30.0
SHARD_ENGINES, DISPATCHES, SHARD_POLICIES, TTFT_GOAL = 8, ("least_loaded", "shard:2"), ("fcfs", "vtc"), 1.2
BUSIEST = 5  # (b)'s light tenants: all but the five that send the most


def bound_spec(policy: str, engines: int) -> RunSpec:
    return RunSpec(BOUND_WORKLOAD, policy, kv_tokens=POOL, engines=engines)


def fixed_spec(policy: str) -> RunSpec:
    return RunSpec(REAL, policy, engines=HIGH)


def scaled_spec(policy: str) -> RunSpec:
    return RunSpec(REAL, policy, autoscale=f"{LOW}:{HIGH}", scale_wait_s=WAIT_S, scale_delay_s=DELAY_S)


def shard_spec(policy: str, dispatch: str, flood: bool) -> RunSpec:
    return RunSpec(FLOOD, policy, engines=SHARD_ENGINES, dispatch=dispatch, without=None if flood else FLOOD)


def ttft(o: RunOutput, clients: frozenset[str] | set[str] | None = None) -> np.ndarray:
    """Times to first token of the requests not rejected (of `clients`, if given); a request not started by the run's
    end counts the time to the end (a lower bound on its wait)."""
    return np.array(
        [
            (r.first_token_s if r.first_token_s is not None else o.duration_s) - r.arrival_s
            for r in o.records
            if r.status != "rejected" and (clients is None or r.client in clients)
        ]
    )


def light_tenants(o: RunOutput) -> set[str]:
    """All but the `BUSIEST` tenants that send the most requests."""
    counts: dict[str, int] = {}
    for r in o.records:
        counts[r.client] = counts.get(r.client, 0) + 1
    return set(sorted(counts, key=lambda c: (-counts[c], c))[BUSIEST:])


def _pct(part: float, whole: float) -> str:
    return f"{part / whole:.0%}" if whole else "n/a"


# ---- (a) the bound ---------------------------------------------------------------------------------------------------
def _bound(res: Results) -> Verdict:
    lines, within, shares, fcfs_over = [], [], [], []
    for n in SIZES:
        vtc, fcfs = (res[BOUND_WORKLOAD, bound_spec(p, n).name] for p in BOUND_POLICIES)
        bound, v, f = vtc.bound, vtc.summary.max_backlogged_diff, fcfs.summary.max_backlogged_diff
        within.append(v <= bound)
        shares.append(v / bound)
        fcfs_over += [n] if f > bound else []
        lines.append(
            f"{n} engine{'s' if n > 1 else ''}: 2U {bound:,.0f}; VTC {v:,.0f} ({_pct(v, bound)}); FCFS {f:,.0f}"
        )
    over = f"FCFS above it at N = {', '.join(map(str, fcfs_over))}" if fcfs_over else "FCFS within it too"
    ours = f"VTC ≤ {max(shares):.0%} of 2U at N = {', '.join(map(str, SIZES))}; {over}"
    evidence = (
        f"the largest backlogged difference against 2U = 2·max(w_p·L_in, w_q·N·{POOL:,}): "
        + "; ".join(lines)
        + f"; VTC within the bound at {sum(within)} of {len(SIZES)} fleet sizes"
    )
    return all(within), evidence, ours


def bound_figure(outs: list[RunOutput]):
    """The largest backlogged difference against N, a line for VTC, for FCFS and for the bound 2U."""
    by_name = {o.spec.name: o for o in outs}
    lines: dict[str, list[tuple[str, float, float]]] = {p.upper(): [] for p in BOUND_POLICIES}
    lines["bound 2U"] = []
    for n in SIZES:
        for p in BOUND_POLICIES:
            o = by_name[bound_spec(p, n).name]
            d = o.summary.max_backlogged_diff
            lines[p.upper()].append((f"{d:,.0f}", float(n), d))
        bound = by_name[bound_spec(BOUND_POLICIES[0], n).name].bound
        lines["bound 2U"].append(("", float(n), bound))
    return {BOUND_WORKLOAD: lines}


# ---- (b) auto-scaling ------------------------------------------------------------------------------------------------
def _cost_row(o: RunOutput) -> str:
    t, light = ttft(o), ttft(o, light_tenants(o))
    unfinished = sum(r.status == "unfinished" for r in o.records)
    return (
        f"{o.engine_seconds or 0:,.0f} engine-s, TTFT p50 / p95 {np.median(t):.2f} / {np.percentile(t, 95):.2f} s "
        f"(light tenants' p95 {np.percentile(light, 95):.2f} s), {o.lost} rejected, {unfinished} in flight at the end"
    )


def _scaling(res: Results) -> Verdict:
    runs = {p: (res[REAL, fixed_spec(p).name], res[REAL, scaled_spec(p).name]) for p in SCALE_POLICIES}
    lines = [f"{p}: {HIGH} engines {_cost_row(f)}; autoscale {_cost_row(s)}" for p, (f, s) in runs.items()]
    rpm = [p for p in SCALE_POLICIES if p.startswith("rpm")]
    same = all(runs[p][0].lost == runs[p][1].lost for p in rpm)
    fixed, scaled = runs["vtc"]
    cheaper = (scaled.engine_seconds or 0) < (fixed.engine_seconds or 0)
    saved = 1 - (scaled.engine_seconds or 0) / (fixed.engine_seconds or 1)
    ours = (
        "; ".join(f"{p} rejects {runs[p][1].lost} autoscaled vs {runs[p][0].lost} on {HIGH} engines" for p in rpm)
        + f"; VTC rejects {scaled.lost} with {saved:.0%} fewer engine-seconds "
        f"({scaled.engine_seconds or 0:,.0f} vs {fixed.engine_seconds or 0:,.0f})"
    )
    evidence = (
        f"`real`, {HIGH} engines held all along vs autoscale {LOW}:{HIGH} (light tenants: all but the {BUSIEST} "
        f"busiest): " + "; ".join(lines)
    )
    return same and scaled.lost == 0 and cheaper, evidence, ours


def scaling_figure(outs: list[RunOutput]):
    """Each autoscaled run's engines over time, as steps to the run's end: {policy (engine-seconds): [(t, n)]}."""
    by_name = {o.spec.name: o for o in outs}
    lines = {}
    for p in SCALE_POLICIES:
        o = by_name[scaled_spec(p).name]
        counts = o.counts or [(0.0, 1)]
        lines[f"{p} ({o.engine_seconds or 0:,.0f} engine-s)"] = [*counts, (o.duration_s, counts[-1][1])]
    fixed = by_name[fixed_spec(SCALE_POLICIES[0]).name]
    return lines, (float(HIGH), f"{HIGH} engines held all along ({fixed.engine_seconds or 0:,.0f} engine-s)")


# ---- (c) shuffle sharding --------------------------------------------------------------------------------------------
def light_median(o: RunOutput) -> float:
    return float(np.median(ttft(o, set(LIGHT))))


def _times(x: float) -> str:
    return f"{x:.2f}×" if x < 10 else f"{x:,.0f}×"


def _sharding(res: Results) -> Verdict:
    lines, held, ratios = [], [], []
    for p in SHARD_POLICIES:
        for d in DISPATCHES:
            calm, storm = (res[FLOOD, shard_spec(p, d, f).name] for f in (False, True))
            ratio = light_median(storm) / light_median(calm)
            ratios.append(f"{_times(ratio)} ({p}, {d})")
            if d != "least_loaded":
                held.append(ratio <= TTFT_GOAL)
            calm_t, storm_t = ttft(calm, set(LIGHT)), ttft(storm, set(LIGHT))
            lines.append(
                f"{p}, {d}: {np.median(calm_t):.2f} / {np.percentile(calm_t, 95):.2f} s calm, "
                f"{np.median(storm_t):.2f} / {np.percentile(storm_t, 95):.2f} s with the flood ({_times(ratio)})"
            )
    evidence = (
        f"`flood` on {SHARD_ENGINES} engines, the light tenants' time to first token (median / p95) without the "
        "flooding tenant and with it (the ratio of the medians): " + "; ".join(lines)
    )
    return all(held), evidence, "light tenants' median with the flood / calm: " + ", ".join(ratios)


# ---- the section -----------------------------------------------------------------------------------------------------
def _scope(what: str, pool: int = DEFAULT_KV_TOKENS) -> str:
    return (
        f"each engine Llama-2-7b on an A10G (profiled), KV pool {pool:,}; a fleet behind the gateway's own dispatch "
        f"(sim/fleet.py, docs/fleet.md); {what}"
    )


Rule = Callable[[Results], Verdict]
FIGURES = ("fleet_bound", "fleet_scaling", "")  # each finding's figure kind (plots.py), "" for none
EXPERIMENTS: tuple[tuple[str, str, str, tuple[RunSpec, ...], Rule, str, tuple[str, str]], ...] = (
    (
        "fleet-bound",
        "A fleet's bound: the largest backlogged difference against N engines",
        f"On `{BOUND_WORKLOAD}` over N = {', '.join(map(str, SIZES))} engines (least-loaded), does VTC's largest "
        "backlogged difference stay within the fleet's 2U = 2·max(w_p·L_in, w_q·M), M = the N engines' pools "
        "together, at every N?",
        tuple(bound_spec(p, n) for n in SIZES for p in BOUND_POLICIES),
        _bound,
        _scope(
            f"`{BOUND_WORKLOAD}` (2 clients at 1.5 and 3 req/s, 256/256 tokens; the pool small enough that eight "
            f"engines are still overloaded); VTC and FCFS; N = {', '.join(map(str, SIZES))}",
            POOL,
        ),
        ("VTC within 2U (M = N pools) at every N?", f"overload, N = {SIZES[0]}–{SIZES[-1]}"),
    ),
    (
        "fleet-autoscale",
        "Auto-scaling against RPM limits: rejections and engine-seconds",
        f"On the Arena trace, does RPM reject as many requests on {LOW} to {HIGH} engines (auto-scaled) as on {HIGH} "
        f"held all along, while VTC rejects none with fewer engine-seconds than the {HIGH} engines?",
        tuple(s for p in SCALE_POLICIES for s in (fixed_spec(p), scaled_spec(p))),
        _scaling,
        _scope(
            f"the Arena trace (27 tenants, 10 min); VTC, FCFS and RPM 30/min; autoscale {LOW}:{HIGH} (an engine "
            f"asked for when the oldest request has waited {WAIT_S:g} s, ready {DELAY_S:g} s later, let go after "
            f"60 s idle) vs {HIGH} engines; engine-seconds, time to first token, rejected"
        ),
        ("RPM's rejections unchanged by scaling; VTC none, cheaper?", f"Arena trace, 1:{HIGH} vs {HIGH}"),
    ),
    (
        "fleet-shard",
        "Shuffle sharding under a flood",
        f"With one tenant flooding {SHARD_ENGINES} engines, is the light tenants' median time to first token with "
        f"shard:2 within {TTFT_GOAL:g}× of what it is without the flood, under FCFS and VTC (least_loaded beside "
        "it)?",
        tuple(shard_spec(p, d, f) for p in SHARD_POLICIES for d in DISPATCHES for f in (False, True)),
        _sharding,
        _scope(
            f"`{FLOOD}` ({len(LIGHT)} light tenants at a request a second, {LIGHT_PROMPT} + {LIGHT_OUTPUT} tokens; "
            f"`{FLOOD}` sends {BURST} requests of {BURST_PROMPT} + {BURST_OUTPUT} at {BURST_AT_S:g} s; "
            f"{DURATION_S:g} s), {SHARD_ENGINES} engines; FCFS and VTC; shard:2 and least_loaded; with and without "
            "the flooding tenant"
        ),
        (f"shard:2 keeps light tenants within {TTFT_GOAL:g}× of calm?", f"flood, {SHARD_ENGINES} engines"),
    ),
)
