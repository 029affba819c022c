"""The figures of one experiment, by kind, from its runs (the drawing itself is in figures.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import figures
from .analysis import difference_series
from .experiments import Experiment, Results
from .runs import RunOutput


def draw(exp: Experiment, res: Results, out_dir: Path) -> list[tuple[str, str]]:
    """Write the experiment's PNGs; return (file name, caption) pairs. Kinds drawn per workload get one figure
    per workload, with one panel or line per policy; the others get one figure over all the experiment's runs."""
    present = [res[r.workload, r.name] for r in exp.runs if (r.workload, r.name) in res]
    made = []
    for kind in exp.figures:
        if kind in _PER_WORKLOAD:
            groups = {w: [o for o in present if o.spec.workload == w] for w in exp.workloads}
        else:
            groups = {exp.workloads[0]: present}
        for workload, outs in groups.items():
            if not outs:
                continue
            stem = f"{exp.name}-{workload}-{kind}" if len(groups) > 1 else f"{exp.name}-{kind}"
            one_workload = len({o.spec.workload for o in outs}) == 1
            runs = {o.spec.name if one_workload else o.spec.workload: o for o in outs}
            made.append((f"{stem}.png", _DRAW[kind](out_dir / f"{stem}.png", exp, runs, workload)))
    return made


def _title(exp: Experiment, workload: str, what: str) -> str:
    return f"{exp.title}\n{what} — workload {workload}"


def _service_rate(path, exp, runs: dict[str, RunOutput], workload):
    first = next(iter(runs.values()))
    figures.service_rate(
        path,
        first.times,
        {n: o.rates for n, o in runs.items()},
        _title(exp, workload, "service rate per client (60 s window)"),
    )
    return f"Service rate per client over time on `{workload}`, one panel per policy."


def _response_time(path, exp, runs, workload):
    first = next(iter(runs.values()))
    figures.response_time(
        path,
        first.times,
        {n: o.response for n, o in runs.items()},
        _title(exp, workload, "response time (time to first token, 60 s window)"),
    )
    return f"Mean response time (time to first token) per client over time on `{workload}`."


def _difference(path, exp, runs, workload):
    first = next(iter(runs.values()))
    figures.accumulated_difference(
        path,
        first.times,
        {n: difference_series(o) for n, o in runs.items()},
        _title(exp, workload, "service difference between backlogged clients"),
        bound=first.bound,
    )
    return (
        f"Largest service difference accumulated by two clients while both were backlogged, on `{workload}`; "
        f"dashed: the bound 2U."
    )


def _difference_by_workload(path, exp, runs, workload):
    by_w = {o.spec.workload: o for o in runs.values()}
    first = next(iter(by_w.values()))
    figures.accumulated_difference(
        path,
        first.times,
        {w: difference_series(o) for w, o in by_w.items()},
        _title(exp, ", ".join(by_w), "VTC service difference by workload"),
    )
    bounds = ", ".join(f"{w}: {o.bound:,.0f}" for w, o in by_w.items())
    return f"VTC's service difference between backlogged clients on each workload (bounds 2U — {bounds})."


def _client_service(path, exp, runs, workload):
    clients = sorted(next(iter(runs.values())).summary.clients)
    figures.bars(
        path,
        clients,
        {n: [o.summary.clients[c].service for c in clients] for n, o in runs.items()},
        _title(exp, workload, "service per client"),
        "service (weighted tokens)",
    )
    return f"Total service per client on `{workload}`."


def _throughput(path, exp, runs, workload):
    names = list(runs)
    vtc = runs.get("vtc")
    figures.bars(
        path,
        names,
        {"output tokens/s": [runs[n].summary.output_tokens_per_s for n in names]},
        _title(exp, workload, "throughput"),
        "output tokens/s",
        reference=vtc.summary.output_tokens_per_s if vtc else None,
        reference_label="VTC",
    )
    return f"Throughput (output tokens/s) per policy on `{workload}`."


def _mean_response(path, exp, runs, workload):
    names = list(runs)
    means = []
    for n in names:
        rts = [r.first_token_s - r.arrival_s for r in runs[n].records if r.first_token_s is not None]
        means.append(float(np.mean(rts)) if rts else 0.0)
    figures.bars(
        path, names, {"mean response time (s)": means}, _title(exp, workload, "mean response time"), "response time (s)"
    )
    return f"Mean response time of the requests that were served, per policy, on `{workload}` (rejected excluded)."


def _bound(path, exp, runs, workload):
    outs = list(runs.values())
    figures.bound_chart(
        path,
        [o.spec.workload for o in outs],
        [o.summary.max_backlogged_diff for o in outs],
        [o.bound for o in outs],
        "Theorem 4.4: VTC's largest backlogged difference vs 2U",
    )
    return "Measured largest service difference between backlogged clients under VTC, next to its bound 2U."


def _group_service(path, exp, runs, workload):
    from ..metrics import service_rates
    from .trees import group_curves

    first = next(iter(runs.values()))
    panels = {}
    for name, o in runs.items():
        panels[f"{name}: per group"] = service_rates(group_curves(o), o.times)
        if not o.spec.flat:
            panels[f"{name}: per tenant"] = o.rates
    figures.service_rate(
        path, first.times, panels, _title(exp, workload, "service rate per group and per tenant (60 s window)")
    )
    return f"Service rate of each group (the sum of its tenants') and of each tenant over time on `{workload}`."


def _preemption_curve(path, exp, runs, workload):
    from .preemption import curve_figure

    panels, references, goals = curve_figure(exp.name, list(runs.values()))
    figures.tradeoff(
        path,
        panels,
        _title(exp, workload, "largest backlogged difference vs service rate"),
        "service rate / plain VTC's in the same mode",
        "largest backlogged difference (weighted tokens)",
        references=references,
        goals=goals,
    )
    return (
        f"The largest service difference between backlogged clients against the service rate (as a ratio to plain "
        f"VTC's in the same engine mode) on `{workload}`, one line per engine mode: from plain VTC through each "
        "`preempt=DELTA` (left) and each `running-cap=TOKENS` (right); shaded: the goal judged (≤ 0.5× plain VTC's "
        "difference at ≥ 0.97× its rate); dashed: the non-preemptive lower bound, where there is one."
    )


def _locality_curve(path, exp, runs, workload):
    from .locality import HELD, THROUGHPUT_GOAL, curve_figure

    figures.tradeoff(
        path,
        curve_figure(list(runs.values())),
        _title(exp, "system-prompts", "throughput / VTC's over the pool's size"),
        "system prompts (of 8) the KV pool holds",
        "service per second / VTC's",
        references=[(THROUGHPUT_GOAL, f"goal where the pool holds ≤ {HELD[1]} prompts"), (1.0, "VTC")],
    )
    return (
        "DLPM's and LPM's throughput (service per second) as a ratio to VTC's on the same pool, against how many of "
        "the 8 clients' system prompts the pool holds; each point labelled with its prefix-cache hit rate."
    )


def _fleet_bound(path, exp, runs, workload):
    from .fleet import POOL, bound_figure

    figures.tradeoff(
        path,
        bound_figure(list(runs.values())),
        _title(exp, workload, "largest backlogged difference vs the fleet's size"),
        "engines (least-loaded)",
        "largest backlogged difference (weighted tokens)",
        log=True,
    )
    return (
        f"The largest service difference between backlogged clients on `{workload}` against the number of engines "
        f"(each with a {POOL:,}-token pool), under VTC and FCFS, beside the fleet's bound 2U with M = the engines' "
        "pools together (log scale)."
    )


def _fleet_scaling(path, exp, runs, workload):
    from .fleet import scaling_figure

    lines, reference = scaling_figure(list(runs.values()))
    figures.steps(
        path, lines, _title(exp, workload, "engines up or starting, auto-scaled"), "time (s)", "engines", reference
    )
    return (
        f"The engines up or starting over time in each policy's auto-scaled run on `{workload}` (an engine costs "
        "from the moment it is asked for; lines offset a little to stay apart), with its engine-seconds; dashed: the "
        "fixed fleet."
    )


_DRAW = {
    "service_rate": _service_rate,
    "response_time": _response_time,
    "difference": _difference,
    "difference_by_workload": _difference_by_workload,
    "client_service": _client_service,
    "throughput": _throughput,
    "mean_response": _mean_response,
    "difference_by_policy": _difference,
    "bound": _bound,
    "group_service": _group_service,
    "preemption_curve": _preemption_curve,
    "locality_curve": _locality_curve,
    "fleet_bound": _fleet_bound,
    "fleet_scaling": _fleet_scaling,
}
_PER_WORKLOAD = {"service_rate", "response_time", "difference", "difference_by_policy", "group_service"}
