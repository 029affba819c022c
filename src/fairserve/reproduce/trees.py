"""Beyond the paper: the tenant tree and priority classes. Organisations with many tenants, weights on groups,
premium and free tiers, weighted classes, in the simulator: what a group gets is measured over the backlogged window
after a 60 s warm-up. These are our own findings (fairserve's tree), not the paper's claims."""

from __future__ import annotations

import numpy as np

from ..core.account import SEP
from .analysis import mean_response
from .runs import RunOutput, RunSpec
from .verdicts import A10G, Results, Verdict

WARMUP_S = 60.0
SECTION = "Beyond the paper: hierarchies and priorities"

TWO_ORGS, WEIGHTED_ORGS, TIERS, TIERS_10X = "two-orgs", "two-orgs-weighted", "tiers", "tiers-10x"
CLASSES, CLASSES_LONG = "classes-6-3-1", "classes-6-3-1-long"
TREE_VTC = "vtc"
FLAT_VTC = "vtc (flat)"


def runs(workload: str) -> tuple[RunSpec, ...]:
    return (RunSpec(workload, "vtc"), RunSpec(workload, "vtc", flat=True, label=FLAT_VTC))


def group_of(client: str) -> str:
    """`org-a/user-3` (or flattened, `org-a.user-3`) -> `org-a`."""
    return client.replace(".", SEP).split(SEP)[0]


def group_curves(out: RunOutput) -> dict[str, np.ndarray]:
    """Each group's service over time: the sum of its tenants'."""
    sums: dict[str, np.ndarray] = {}
    for client, curve in out.curves.items():
        g = group_of(client)
        sums[g] = sums[g] + curve if g in sums else curve.copy()
    return sums


def shares(curves: dict[str, np.ndarray], times: np.ndarray, start_s: float, end_s: float) -> dict[str, float]:
    """Each one's part of the service received in [start_s, end_s]."""
    got = {k: float(np.interp(end_s, times, c) - np.interp(start_s, times, c)) for k, c in curves.items()}
    total = sum(got.values())
    return {k: v / total if total else 0.0 for k, v in got.items()}


def backlogged_window(out: RunOutput) -> tuple[float, float]:
    """From the warm-up's end to the last moment every tenant was still backlogged."""
    busy = np.logical_and.reduce(list(out.busy.values()))
    idx = busy.nonzero()[0]
    end = float(out.times[idx[-1]]) if len(idx) else out.duration_s
    return WARMUP_S, max(end, WARMUP_S)


def _fmt(d: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in sorted(d.items()))


def _two_orgs(res: Results) -> Verdict:
    tree, flat = res[TWO_ORGS, TREE_VTC], res[TWO_ORGS, FLAT_VTC]
    t0, t1 = backlogged_window(tree)
    orgs = shares(group_curves(tree), tree.times, t0, t1)
    users = shares(tree.curves, tree.times, t0, t1)
    many = {u: s for u, s in users.items() if group_of(u) == "org-a"}
    flat_orgs = shares(group_curves(flat), flat.times, *backlogged_window(flat))
    ok = all(abs(s - 0.5) <= 0.02 for s in orgs.values()) and all(abs(s - 0.05) <= 0.01 for s in many.values())
    return (
        ok,
        f"over {t0:.0f}–{t1:.0f} s: organisations {_fmt(orgs)} (goal 0.50 ± 0.02); org-a's ten users "
        f"{min(many.values()):.3f}–{max(many.values()):.3f} each (goal 0.05 ± 0.01); the same tenants flat: "
        f"{_fmt(flat_orgs)}",
        f"org-a {orgs['org-a']:.2f} / org-b {orgs['org-b']:.2f} (flat: {flat_orgs['org-a']:.2f} / "
        f"{flat_orgs['org-b']:.2f})",
    )


def _weighted_orgs(res: Results) -> Verdict:
    tree = res[WEIGHTED_ORGS, TREE_VTC]
    t0, t1 = backlogged_window(tree)
    orgs = shares(group_curves(tree), tree.times, t0, t1)
    return (
        abs(orgs["org-a"] - 0.75) <= 0.02,
        f"weights org-a=3, org-b=1; over {t0:.0f}–{t1:.0f} s: {_fmt(orgs)} (goal org-a 0.75 ± 0.02)",
        f"org-a {orgs['org-a']:.3f}",
    )


def _tiers(res: Results) -> Verdict:
    parts, rts, premium = [], {}, {}
    for w in (TIERS, TIERS_10X):
        out = res[w, TREE_VTC]
        t0, t1 = backlogged_window(out)
        premium[w] = shares(group_curves(out), out.times, t0, t1)["premium"]
        rt = [mean_response(out, c, t0, t1) for c in out.curves if group_of(c) == "premium"]
        rts[w] = float(np.mean([r for r in rt if r is not None]))
        parts.append(f"{w}: premium {premium[w]:.3f} of the service over {t0:.0f}–{t1:.0f} s, mean TTFT {rts[w]:.1f} s")
    flat = res[TIERS, FLAT_VTC]
    flat_premium = shares(group_curves(flat), flat.times, *backlogged_window(flat))["premium"]
    ratio = rts[TIERS_10X] / rts[TIERS]
    return (
        min(premium.values()) >= 0.95 and abs(ratio - 1) <= 0.10,
        "; ".join(parts) + f"; premium TTFT at 10x free load / at 2x: {ratio:.3f} (goal within "
        f"10%); without priorities (flat VTC) premium gets {flat_premium:.3f}, its head-count share",
        f"premium {min(premium.values()):.3f}; TTFT 10x/2x {ratio:.2f}",
    )


CLASS_GOAL = {"class-a": 0.6, "class-b": 0.3, "class-c": 0.1}


def minute_shares(out: RunOutput) -> tuple[list[dict[str, float]], float]:
    """Each class's share in consecutive 60 s windows of the backlogged window, and the worst relative error."""
    t0, t1 = backlogged_window(out)
    curves, worst, windows, start = group_curves(out), 0.0, [], t0
    while start + 60.0 <= t1 + 1e-9:
        got = shares(curves, out.times, start, start + 60.0)
        windows.append(got)
        worst = max(worst, max(abs(got[c] / g - 1) for c, g in CLASS_GOAL.items()))
        start += 60.0
    return windows, worst


def _classes(res: Results) -> Verdict:
    windows, worst = minute_shares(res[CLASSES, TREE_VTC])
    long = res[CLASSES_LONG, TREE_VTC]
    _, worst_long = minute_shares(long)
    whole_long = shares(group_curves(long), long.times, *backlogged_window(long))
    mean = {c: float(np.mean([w[c] for w in windows])) for c in CLASS_GOAL}
    return (
        bool(windows) and worst <= 0.03,
        f"64/64-token requests, {len(windows)} windows of 60 s after the warm-up: mean shares {_fmt(mean)}; the worst "
        f"window is {100 * worst:.1f}% off 0.6 / 0.3 / 0.1 (goal ±3% relative); with 256/256-token requests "
        f"({CLASSES_LONG}: a minute holds about 100 of them, and the pool keeps ~19 running for ~10 s each) the "
        f"worst minute is {100 * worst_long:.1f}% off, and over the whole window the shares are {_fmt(whole_long)}",
        f"{' / '.join(f'{mean[c]:.3f}' for c in CLASS_GOAL)} (worst minute ±{100 * worst:.1f}%)",
    )


SCOPE = f"{A10G}; 256/256-token requests, every tenant overloaded; shares over the backlogged window after 60 s"
EXPERIMENTS = (
    # (name, title, question, runs, rule, brief question, brief scope)
    (
        "two-orgs",
        "Two organisations: ten tenants against one",
        "Does each organisation get its share however many tenants it opens, and each of its tenants a share of it?",
        runs(TWO_ORGS),
        _two_orgs,
        ("each organisation its share, whatever its tenants?", "10 users vs 1"),
    ),
    (
        "weighted-orgs",
        "Weights on groups",
        "With weights 3:1 on the organisations, does the weighted one get three quarters?",
        runs(WEIGHTED_ORGS)[:1],
        _weighted_orgs,
        ("weights on groups", "org-a=3, org-b=1"),
    ),
    (
        "tiers",
        "Premium first: priority classes",
        "With premium at priority 0 and free at 1, both overloaded, does premium get the service, and does its time to "
        "first token stay the same whether free sends 2x or 10x what the engine serves?",
        (*runs(TIERS), RunSpec(TIERS_10X, "vtc")),
        _tiers,
        ("premium first, whatever free sends?", "premium p0 + free p1"),
    ),
    (
        "classes",
        "Three classes weighted 6:3:1",
        "Do three overloaded classes weighted 6:3:1 get 0.6 / 0.3 / 0.1 of the service in every minute?",
        (RunSpec(CLASSES, "vtc"), RunSpec(CLASSES_LONG, "vtc")),
        _classes,
        ("classes 6:3:1 in every minute?", "3 classes × 2 tenants"),
    ),
)
