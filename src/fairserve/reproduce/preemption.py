"""The paper's future work (§C.3): preemption. The largest backlogged difference against the service rate as the
preemption threshold DELTA (`vtc:preempt=DELTA`) and the per-tenant running-memory cap (`vtc:running-cap=TOKENS`)
vary, on `overload`, `overload-multi` and the lower-bound construction (`lower-bound`), in both engine modes
(docs/preemption.md). The goals: some DELTA at <= 0.5x plain VTC's difference and >= 0.97x its service rate on
`overload` (reserve mode) and `overload-multi` (paged mode), with no request lost; on the construction, below the
non-preemptive lower bound. These are our own findings (the paper leaves preemption as future work)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..sim import engine_config
from ..sim.lower_bound import held_back
from ..sim.requests import Mode
from ..workloads import LOWER_BOUND
from .runs import RunOutput, RunSpec
from .verdicts import A10G, Results, Verdict

SECTION = "The paper's future work (§C.3): preemption"
SOURCE = "beyond §C.3, p. 24 (the paper's future work: preemption, per-client limits on running memory)"
PLAIN = "vtc"
DELTAS = (250, 500, 1000, 2000)
CAPS = (2500,)
POLICIES = (PLAIN, *(f"vtc:preempt={d}" for d in DELTAS), *(f"vtc:running-cap={c}" for c in CAPS))
MODES: tuple[Mode, ...] = ("reserve", "paged")
DIFF_GOAL, RATE_GOAL = 0.5, 0.97  # the largest backlogged difference at most half plain VTC's, at >= 97% its rate


def runs(workload: str) -> tuple[RunSpec, ...]:
    return tuple(RunSpec(workload, p, mode=m) for m in MODES for p in POLICIES)


@dataclass(frozen=True)
class Point:
    """One run of the curve, beside plain VTC's run in the same mode."""

    label: str  # "vtc", "DELTA 500", "cap 2,500"
    diff: float  # the largest backlogged difference
    diff_x: float  # its ratio to plain VTC's (NaN where plain VTC's is 0)
    rate_x: float  # the service rate's ratio to plain VTC's
    fair: int  # preemptions for fairness
    lost: int

    def meets(self, plain: Point) -> bool:
        return self.diff <= DIFF_GOAL * plain.diff and self.rate_x >= RATE_GOAL and not self.lost


def _label(policy: str) -> str:
    if policy == PLAIN:
        return PLAIN
    key, _, value = policy.removeprefix("vtc:").partition("=")
    return f"{'DELTA' if key == 'preempt' else 'cap'} {int(value):,}"


def curve(outs: dict[str, RunOutput], mode: Mode) -> list[Point]:
    """Plain VTC first, then each DELTA, then each cap, in `mode`; `outs`: one workload's runs by run name."""
    plain = outs[RunSpec("", PLAIN, mode=mode).name].summary
    points = []
    for policy in POLICIES:
        o = outs[RunSpec("", policy, mode=mode).name]
        s = o.summary
        diff_x = s.max_backlogged_diff / plain.max_backlogged_diff if plain.max_backlogged_diff else float("nan")
        rate_x = s.service_per_s / plain.service_per_s
        points.append(Point(_label(policy), s.max_backlogged_diff, diff_x, rate_x, o.fair_preemptions, o.lost))
    return points


def _of(res: Results, workload: str) -> dict[str, RunOutput]:
    return {r.name: res[workload, r.name] for r in runs(workload)}


def _cell(p: Point) -> str:
    ratio = f" ({p.diff_x:.2f}×)" if p.diff_x == p.diff_x else ""  # NOTE: NaN where plain VTC's difference is 0
    fair = f", {p.fair} preemptions" if p.label.startswith("DELTA") else ""
    return f"{p.label}: {p.diff:,.0f}{ratio} at {p.rate_x:.3f}× the rate{fair}"


def _mode_line(workload: str, mode: Mode, points: list[Point]) -> str:
    plain = points[0]
    return f"{workload}, {mode} mode: plain VTC {plain.diff:,.0f}; " + "; ".join(_cell(p) for p in points[1:])


def _span(values: list[float], fmt: str) -> str:
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}–{hi}"


def _deltas(points: list[Point]) -> str:
    """`DELTA 250–2,000` for a run of consecutive DELTAs, else `DELTA 250, 2,000`."""
    values = [int(p.label.split()[1].replace(",", "")) for p in points]
    i = DELTAS.index(values[0])
    if len(values) > 2 and tuple(values) == DELTAS[i : i + len(values)]:
        return f"DELTA {values[0]:,}–{values[-1]:,}"
    return "DELTA " + ", ".join(f"{v:,}" for v in values)


def _headline(points: list[Point]) -> str:
    """The DELTAs that reach the goal, with their ranges: `DELTA 250–2,000: 0.06–0.25× at 1.002–1.008× the rate`."""
    deltas = [p for p in points if p.label.startswith("DELTA")]
    hit = [p for p in deltas if p.meets(points[0])]
    if not hit:
        best = min(deltas, key=lambda p: p.diff)
        return f"no DELTA (smallest: {best.label}, {best.diff_x:.2f}× at {best.rate_x:.3f}× the rate)"
    diff_x, rate_x = _span([p.diff_x for p in hit], ".2f"), _span([p.rate_x for p in hit], ".3f")
    return f"{_deltas(hit)}: {diff_x}× at {rate_x}× the rate"


def _lost(outs: dict[str, RunOutput]) -> str:
    lost = sum(o.lost for o in outs.values())
    return f"no request lost in any of the {len(outs)} runs" if not lost else f"{lost} requests lost (rejected)"


def _goal(workload: str, mode: Mode) -> Callable[[Results], Verdict]:
    """Some DELTA at <= 0.5x plain VTC's largest backlogged difference and >= 0.97x its service rate, in `mode`."""
    other = next(m for m in MODES if m != mode)

    def judge(res: Results) -> Verdict:
        outs = _of(res, workload)
        points = curve(outs, mode)
        hit = [p.label for p in points if p.label.startswith("DELTA") and p.meets(points[0])]
        return (
            bool(hit),
            f"{_mode_line(workload, mode, points)}; goal (≤ {DIFF_GOAL}× the difference at ≥ {RATE_GOAL}× the rate, "
            f"nothing lost) reached by {', '.join(hit) or 'no DELTA'}; not judged: "
            f"{_mode_line(workload, other, curve(outs, other))}; {_lost(outs)}",
            _headline(points),
        )

    return judge


def _below_lower_bound(res: Results) -> Verdict:
    """On the construction (reserve mode): plain VTC above the non-preemptive lower bound (the construction holds it
    back), and some DELTA below it at >= 0.97x plain VTC's rate, nothing lost."""
    outs = _of(res, LOWER_BOUND)
    lower = held_back(engine_config())
    points = curve(outs, "reserve")
    plain, deltas = points[0], [p for p in points if p.label.startswith("DELTA")]
    hit = [p for p in deltas if p.diff < lower and p.rate_x >= RATE_GOAL and not p.lost]
    paged = curve(outs, "paged")
    held = "holds nobody back" if not paged[0].diff else f"holds plain VTC back by {paged[0].diff:,.0f}"
    ours = f"plain VTC {plain.diff:,.0f} vs lower bound {lower:,.0f}; " + (
        f"{_deltas(hit)}: {_span([p.diff for p in hit], ',.0f')} at {_span([p.rate_x for p in hit], '.2f')}× the rate"
        if hit
        else "no DELTA below it"
    )
    return (
        plain.diff > lower and bool(hit),
        f"the non-preemptive lower bound w_q·(the hog's batch output) is {lower:,.0f}; "
        f"{_mode_line(LOWER_BOUND, 'reserve', points)}; below it at ≥ {RATE_GOAL}× the rate, nothing lost: "
        f"{', '.join(p.label for p in hit) or 'no DELTA'}; in paged mode (not judged) every 10-token prompt fits at "
        f"arrival, so the construction {held}: {_mode_line(LOWER_BOUND, 'paged', paged)}; {_lost(outs)}",
        ours,
    )


def curve_figure(experiment: str, outs: list[RunOutput]):
    """One workload's curves for figures.tradeoff: a panel for DELTA and one for the cap, a line per engine mode from
    plain VTC through the settings (DELTA from the largest down, the cap from the largest down); the goal's region
    for the mode the experiment judges; the lower bound on the construction."""
    by_name = {o.spec.name: o for o in outs}  # NOTE: the figure draws the runs as they ran
    workload = outs[0].spec.workload
    panels: dict[str, dict[str, list[tuple[str, float, float]]]] = {"preempt=DELTA": {}, "running-cap=TOKENS": {}}
    goals = {}
    for mode in MODES:
        points = curve(by_name, mode)
        xy = [(p.label, p.rate_x, p.diff) for p in points]
        name = f"{workload}, {mode}"
        panels["preempt=DELTA"][name] = [xy[0], *reversed(xy[1 : 1 + len(DELTAS)])]
        panels["running-cap=TOKENS"][name] = [xy[0], *reversed(xy[1 + len(DELTAS) :])]
        if (experiment, mode) in GOALS:
            goals[name] = (RATE_GOAL, DIFF_GOAL * points[0].diff)
    references = [(held_back(engine_config()), "non-preemptive lower bound")] if workload == LOWER_BOUND else []
    return panels, references, goals


def _scope(workload: str) -> str:
    return (
        f"{A10G}; {workload} in both engine modes (reserve: the paper's admission; paged: vLLM-like), 360 s; plain "
        f"VTC, `vtc:preempt=DELTA` with DELTA {', '.join(f'{d:,}' for d in DELTAS)} (preempt-max 1) and "
        f"{', '.join(f'`vtc:running-cap={c}`' for c in CAPS)}; the largest backlogged difference and "
        "the service rate, each beside plain VTC's in the same mode"
    )


GOALS = {("preempt-overload", "reserve"), ("preempt-overload-multi", "paged")}  # the issue's goals, as judged
GOAL = f"≤ {DIFF_GOAL}× VTC's difference at ≥ {RATE_GOAL}× its rate?"
EXPERIMENTS = (
    # (name, title, question, runs, rule, scope, brief question, brief scope)
    (
        "preempt-overload",
        "Preemption on overload: difference vs service rate",
        f"Does some DELTA bring overload's largest backlogged difference to ≤ {DIFF_GOAL}× plain VTC's at ≥ "
        f"{RATE_GOAL}× its service rate on the paper's engine (reserve mode), with no request lost?",
        runs("overload"),
        _goal("overload", "reserve"),
        _scope("overload"),
        (GOAL, "overload (2 clients), reserve"),
    ),
    (
        "preempt-overload-multi",
        "Preemption on overload-multi, paged: difference vs service rate",
        f"Does some DELTA bring overload-multi's largest backlogged difference to ≤ {DIFF_GOAL}× plain VTC's at ≥ "
        f"{RATE_GOAL}× its service rate on the vLLM-like engine (paged mode), with no request lost?",
        runs("overload-multi"),
        _goal("overload-multi", "paged"),
        _scope("overload-multi"),
        (GOAL, "overload-multi (8 clients), paged"),
    ),
    (
        "preempt-lower-bound",
        "Preemption on the lower-bound construction (§4.1.1)",
        "On the construction where every work-conserving scheduler without preemption lets one client run ahead by "
        "about w_q·M, does some DELTA bring VTC below that lower bound (reserve mode) at ≥ "
        f"{RATE_GOAL}× its service rate?",
        runs(LOWER_BOUND),
        _below_lower_bound,
        _scope(LOWER_BOUND),
        ("below the non-preemptive lower bound?", "the §4.1.1 construction, reserve"),
    ),
)
