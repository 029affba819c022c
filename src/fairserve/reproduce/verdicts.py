"""The rules that compute each experiment's verdict from its runs' numbers, each on the scope its experiment states
(`experiments.py` holds the claims, scopes and runs)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .analysis import (
    client_windows,
    demand_rate,
    difference_series,
    fair_level,
    mean_response,
    profile_decode_to_prefill,
    served,
    share_ratio,
)
from .runs import REAL, RunOutput, RunSpec

# (holds, evidence: the numbers behind it, ours: the headline number(s) for the overview)
Verdict = tuple[bool, str, str]

A10G = "Llama-2-7b on an A10G (profiled), KV pool 10,000"
S4 = "Llama-2-13b on an A100-80GB (roofline)"
ARTIFACT = "re-run artifact, A10G"
ORIGINAL = "original submission"


class Results(dict):
    """(workload, run name) -> RunOutput."""

    def has(self, workload: str) -> bool:
        return any(w == workload for w, _ in self)


def _runs(workloads: str | list[str], *policies: str, **kw) -> tuple[RunSpec, ...]:
    names = [workloads] if isinstance(workloads, str) else workloads
    return tuple(RunSpec(w, p, **kw) for w in names for p in policies)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


# ---- verdicts: each on the scope its experiment states ---------------------------------------------------------
def _f(x: float | None) -> float:
    """A number that may be missing (no run backlogged, no response): NaN, which fails every comparison."""
    return math.nan if x is None else x


def _overload(res: Results) -> Verdict:
    vtc, fcfs = res["overload", "vtc"], res["overload", "fcfs"]
    r_vtc, r_fcfs = _f(share_ratio(vtc, "client-1", "client-0")), _f(share_ratio(fcfs, "client-1", "client-0"))
    d_vtc, d_fcfs = vtc.summary.max_backlogged_diff, fcfs.summary.max_backlogged_diff
    series = difference_series(fcfs)
    half, end = series[len(series) // 2], series[-1]
    ok = abs(r_vtc - 1) <= 0.05 and d_vtc <= vtc.bound and d_fcfs > vtc.bound and end >= 1.8 * half
    return (
        ok,
        (
            f"while both were backlogged the fast sender got {r_vtc:.2f}× the slow one's service under VTC and "
            f"{r_fcfs:.2f}× under FCFS; the largest VTC difference was {d_vtc:,.0f} (bound {vtc.bound:,.0f}), "
            f"FCFS's difference grew from {half:,.0f} at mid-run to {end:,.0f}; service "
            f"{vtc.summary.service_per_s:,.0f}/s (VTC) and {fcfs.summary.service_per_s:,.0f}/s (FCFS)"
        ),
        (
            f"fast:slow {r_vtc:.2f} (VTC) vs {r_fcfs:.2f} (FCFS); service {vtc.summary.service_per_s:,.0f} / "
            f"{fcfs.summary.service_per_s:,.0f} /s"
        ),
    )


def _light_clients_served(workload: str, light: list[str], heavy: str) -> Callable[[Results], Verdict]:
    def judge(res: Results) -> Verdict:
        vtc, fcfs = res[workload, "vtc"], res[workload, "fcfs"]
        parts, ok, short = [], True, []
        for c in light:
            got = vtc.summary.clients[c].service_rate / demand_rate(vtc, c)
            rt_v, rt_f = mean_response(vtc, c), mean_response(fcfs, c)
            ok &= got >= 0.85 and rt_v is not None and rt_f is not None and rt_v <= rt_f / 4
            parts.append(f"{c} got {_pct(got)} of what it asked with mean response {rt_v:.1f} s (FCFS {rt_f:.1f} s)")
            short.append(f"{c}: {rt_v:.1f} s vs {rt_f:.1f} s (FCFS)")
        rates = {c: s.service_rate for c, s in vtc.summary.clients.items()}
        fair = sum(rates.values()) / len(rates)
        ok &= rates[heavy] > fair
        parts.append(f"{heavy} received {rates[heavy]:,.0f}/s, above an equal split of {fair:,.0f}/s")
        return ok, "under VTC " + "; ".join(parts), "; ".join(short)

    return judge


def _equal_when_backlogged(workload: str) -> Callable[[Results], Verdict]:
    def judge(res: Results) -> Verdict:
        r_vtc = share_ratio(res[workload, "vtc"], "client-0", "client-1")
        r_fcfs = share_ratio(res[workload, "fcfs"], "client-0", "client-1")
        ok = r_vtc is not None and abs(r_vtc - 1) <= 0.1 and r_fcfs is not None and abs(r_fcfs - 1) > 0.1
        return (
            ok,
            (
                f"while both were backlogged client-0 got {r_vtc:.2f}× client-1's service under VTC and "
                f"{r_fcfs:.2f}× under FCFS"
            ),
            f"{r_vtc:.2f} (VTC) vs {r_fcfs:.2f} (FCFS)",
        )

    return judge


def _bounded(workload: str) -> Callable[[Results], Verdict]:
    def judge(res: Results) -> Verdict:
        vtc, fcfs = res[workload, "vtc"], res[workload, "fcfs"]
        d_v, d_f = vtc.summary.max_backlogged_diff, fcfs.summary.max_backlogged_diff
        ok = d_v <= vtc.bound < d_f
        return (
            ok,
            (
                f"largest difference {d_v:,.0f} under VTC, {d_f:,.0f} under FCFS; the bound 2U is "
                f"{vtc.bound:,.0f}; service {vtc.summary.service_per_s:,.0f}/s (VTC) and "
                f"{fcfs.summary.service_per_s:,.0f}/s (FCFS)"
            ),
            f"VTC {d_v:,.0f}, FCFS {d_f:,.0f} (2U {vtc.bound:,.0f})",
        )

    return judge


def _increase(res: Results) -> Verdict:
    vtc, fcfs = res["increase", "vtc"], res["increase", "fcfs"]
    start = vtc.duration_s * 2 / 3  # the last third: the other client asks for more than the server has
    got = served(vtc, "client-0", start, vtc.duration_s) / (vtc.duration_s - start)
    asked = demand_rate(vtc, "client-0", start)
    rt_v, rt_f = _f(mean_response(vtc, "client-0", start)), _f(mean_response(fcfs, "client-0", start))
    ok = got >= 0.85 * asked and rt_v <= rt_f / 2
    return (
        ok,
        (
            f"in the last third client-0 received {got:,.0f}/s of the {asked:,.0f}/s it asked under VTC, with mean "
            f"response {rt_v:.1f} s against {rt_f:.1f} s under FCFS"
        ),
        f"{got:,.0f} of {asked:,.0f}/s; {rt_v:.1f} s vs {rt_f:.1f} s (FCFS)",
    )


def _dist_shift(res: Results) -> Verdict:
    t0, t1 = 300.0, min(600.0, res["dist-shift", "vtc"].duration_s)
    got = {}
    for name in ("vtc", "lcf"):
        run = res["dist-shift", name]
        a, b = served(run, "client-0", t0, t1), served(run, "client-1", t0, t1)
        got[name] = dict(
            share=a / (a + b),
            asked=a / (t1 - t0) / demand_rate(run, "client-0", t0, t1),
            other=b,
            rt=mean_response(run, "client-0", t0, t1),
        )
    v, lcf = got["vtc"], got["lcf"]
    ok = (
        abs(v["share"] - 0.5) <= 0.05
        and lcf["asked"] >= 0.95
        and lcf["rt"] <= v["rt"] / 2
        and lcf["other"] < v["other"]
    )
    return (
        ok,
        (
            f"in the phase after the shift (from 300 s) LCF served client-0, which had built up credit while "
            f"idle, {_pct(lcf['asked'])} of what it asked, first (mean response {lcf['rt']:.1f} s), and client-1 "
            f"only the rest ({_pct(1 - lcf['share'])} of the service); VTC split it {_pct(v['share'])} / "
            f"{_pct(1 - v['share'])} (client-0 mean response {v['rt']:.1f} s)"
        ),
        f"LCF: client-1 gets {_pct(1 - lcf['share'])}; VTC {_pct(v['share'])} / {_pct(1 - v['share'])}",
    )


def _real(res: Results) -> Verdict:
    """Fig. 12–13: response time per client over time. "Drastic": a client's mean response over a minute of its
    arrivals reaching the median client's response under FCFS; "above its share": its demand over that minute and
    the one before above the max-min fair level of all clients' demands over the same span."""
    vtc, fcfs = res[REAL, "vtc"], res[REAL, "fcfs"]
    clients = sorted(vtc.summary.clients)
    rt = {name: {c: mean_response(run, c) for c in clients} for name, run in (("vtc", vtc), ("fcfs", fcfs))}
    med_v = float(np.median([v for v in rt["vtc"].values() if v is not None]))
    med_f = float(np.median([v for v in rt["fcfs"].values() if v is not None]))
    demands = {c: demand_rate(vtc, c) for c in clients}
    level = fair_level(demands, vtc.summary.service_per_s)
    within = [c for c in clients if demands[c] <= level and rt["vtc"][c] is not None and rt["fcfs"][c] is not None]
    raised = [c for c in within if _f(rt["fcfs"][c]) > _f(rt["vtc"][c])]
    drastic = [(c, t0, r, d, lvl) for c, t0, r, d, lvl in client_windows(vtc) if r >= med_f]
    above = [w for w in drastic if w[3] > w[4]]
    ok = med_f >= 3 * med_v and len(raised) == len(within) and len(above) == len(drastic)
    cells = ", ".join(f"{c} at {t0:.0f} s ({r:.0f} s; asked {d:,.0f}/s vs {lvl:,.0f})" for c, t0, r, d, lvl in drastic)
    return (
        ok,
        (
            f"median client response {med_v:.1f} s under VTC and {med_f:.1f} s under FCFS; FCFS raised the mean "
            f"response of {len(raised)} of the {len(within)} clients asking at most their fair share over the run; "
            f"under VTC {len(drastic)} client-minutes reached the FCFS median ({cells or 'none'}), "
            f"{len(above)} of them from clients asking above their share at that time"
        ),
        (
            f"median {med_v:.1f} s (VTC) vs {med_f:.1f} s (FCFS); {len(above)}/{len(drastic)} drastic client-minutes "
            f"above share"
        ),
    )


RPM_LIMITS = (5, 10, 15, 20, 30)


def _mean_rt(out: RunOutput) -> float:
    rts = [r.first_token_s - r.arrival_s for r in out.records if r.first_token_s is not None]
    return float(np.mean(rts)) if rts else 0.0


def _rpm(res: Results) -> Verdict:
    vtc = res[REAL, "vtc"].summary.output_tokens_per_s
    fcfs = res[REAL, "fcfs"].summary.output_tokens_per_s
    tput = [res[REAL, f"rpm:{n}"].summary.output_tokens_per_s for n in RPM_LIMITS]
    rts = [_mean_rt(res[REAL, f"rpm:{n}"]) for n in RPM_LIMITS]
    rt_f = _mean_rt(res[REAL, "fcfs"])
    ok = (
        tput[0] <= 0.6 * vtc
        and all(a <= b for a, b in zip(tput, tput[1:], strict=False))
        and tput[-1] >= 0.85 * fcfs
        and rts[-1] > rts[0]
    )
    return (
        ok,
        (
            f"RPM {RPM_LIMITS[0]} reached {tput[0]:.0f} output tokens/s, {_pct(tput[0] / vtc)} of VTC's {vtc:.0f}; "
            f"limits {', '.join(map(str, RPM_LIMITS))} gave {', '.join(f'{t:.0f}' for t in tput)} tokens/s, "
            f"approaching FCFS's {fcfs:.0f}, with mean response {', '.join(f'{t:.1f}' for t in rts)} s "
            f"(FCFS {rt_f:.1f} s)"
        ),
        f"RPM 5: {tput[0]:.0f} vs {vtc:.0f} tokens/s ({_pct(tput[0] / vtc)}); RPM 30: {tput[-1]:.0f}",
    )


LENGTHS = ("overload-s4-256", "overload-s4-512", "overload-s4-768")
POOL = ("overload-s4-512", "overload-s4-long")


def _ablation_length(res: Results) -> Verdict:
    runs = [res[w, "vtc"] for w in LENGTHS]
    d = [r.summary.max_backlogged_diff for r in runs]
    ok = all(x <= r.bound for x, r in zip(d, runs, strict=False)) and d[0] < min(d[1:]) and abs(d[2] / d[1] - 1) <= 0.15
    return (
        ok,
        (
            "largest backlogged difference with 35,000-token pool, by request length: "
            + ", ".join(f"{w.removeprefix('overload-s4-')}·2: {x:,.0f}" for w, x in zip(LENGTHS, d, strict=False))
            + f" (bound {runs[0].bound:,.0f}); 768·2 is {d[2] / d[1]:.2f}× 512·2"
        ),
        " / ".join(f"{x:,.0f}" for x in d) + " (256·2 / 512·2 / 768·2)",
    )


def _ablation_pool(res: Results) -> Verdict:
    small, large = (res[w, "vtc"] for w in POOL)
    d_s, d_l = small.summary.max_backlogged_diff, large.summary.max_backlogged_diff
    ok = d_l > d_s and d_s <= small.bound and d_l <= large.bound
    return (
        ok,
        (
            f"512·2 requests: largest backlogged difference {d_s:,.0f} with a 35,000-token pool (bound "
            f"{small.bound:,.0f}), {d_l:,.0f} with 65,000 (bound {large.bound:,.0f})"
        ),
        f"{d_s:,.0f} (35,000) vs {d_l:,.0f} (65,000)",
    )


WEIGHTED_W = "overload-weighted@600s"


def _weighted(res: Results) -> Verdict:
    parts, ok, short = [], True, []
    for name, expect in (("weighted vtc", [1, 2, 3, 4]), ("vtc (no weights)", [1, 1, 1, 1])):
        s = res[WEIGHTED_W, name].summary.clients
        got = [s[f"client-{i}"].service / s["client-0"].service for i in range(4)]
        ok &= all(abs(g / e - 1) <= 0.05 for g, e in zip(got, expect, strict=False))
        parts.append(f"{name} split service {':'.join(f'{g:.2f}' for g in got)}")
        short.append(":".join(f"{g:.2f}" for g in got))
    return ok, "; ".join(parts), f"{short[0]} (weighted), {short[1]} (plain)"


def _profile_shape(res: Results) -> Verdict:
    ratios = {n: profile_decode_to_prefill(n) for n in (64, 128, 196, 256)}
    ok = all(1.5 <= r <= 5.5 for r in ratios.values())
    return (
        ok,
        (
            "per-request decode time of n output tokens over prefill time of n input tokens, each in the largest "
            "batch a 10,000-token pool holds, on the profiled A10G forward model: "
            + ", ".join(f"n = {n}: {r:.1f}×" for n, r in ratios.items())
            + " (n = 64 decodes at batch 138, which the model under-estimates by 27%)"
        ),
        f"{min(ratios.values()):.1f}–{max(ratios.values()):.1f}× (n = 64–256)",
    )


PROFILED_REAL = ("vtc (profiled cost)", "lcf (profiled cost)", "fcfs (profiled cost)")


def _profiled_real(res: Results) -> Verdict:
    """Fig. 18: 27 clients' response times on the real trace, VTC-style schedulers on the profiled cost. Low-rate:
    asking at most the max-min fair share (profiled cost) over the run; consistently high-rate: asking above it and
    sending in at least half of the run's minutes (not a client whose whole demand is one burst)."""
    vtc, lcf, fcfs = (res[REAL, n] for n in PROFILED_REAL)
    clients = sorted(vtc.summary.clients)
    demands = {c: demand_rate(vtc, c) for c in clients}
    level = fair_level(demands, vtc.summary.service_per_s)
    low = [c for c in clients if demands[c] <= level]
    active: dict[str, int] = {}
    for c, *_ in client_windows(vtc):
        active[c] = active.get(c, 0) + 1
    minutes = int(np.ceil(vtc.duration_s / 60.0))
    steady = [c for c in clients if c not in low and active.get(c, 0) >= minutes / 2]

    def med(out: RunOutput, group: list[str]) -> float:
        return float(np.median([v for c in group if (v := mean_response(out, c)) is not None]))

    low_v, low_l, low_f = med(vtc, low), med(lcf, low), med(fcfs, low)
    hi_v, hi_l = (med(o, steady) if steady else float("nan") for o in (vtc, lcf))
    ok = low_v <= low_f / 3 and low_l <= low_f / 3 and bool(steady) and hi_l >= 2 * hi_v
    bursty = [c for c in clients if c not in low and c not in steady]
    return (
        ok,
        (
            f"median over the {len(low)} low-rate clients of their mean response: {low_v:.1f} s (VTC), "
            f"{low_l:.1f} s (LCF), {low_f:.1f} s (FCFS); over the consistently high-rate clients "
            f"({', '.join(steady) or 'none'}): {hi_v:.1f} s (VTC), {hi_l:.1f} s (LCF); high-rate but bursty "
            f"(not judged): "
            + (
                ", ".join(f"{c} ({mean_response(vtc, c):.1f} s VTC, {mean_response(lcf, c):.1f} s LCF)" for c in bursty)
                or "none"
            )
        ),
        f"low-rate {low_v:.1f} s (VTC) vs {low_f:.1f} s (FCFS); steady heavy {hi_l:.1f} s (LCF) vs {hi_v:.1f} s (VTC)",
    )


PREDICTORS = ("vtc-predict:oracle", "vtc-predict:oracle±50", "vtc-predict:moving-average")
BACKLOGGED = ("overload@600s", "overload-multi@600s")  # two and eight backlogged clients, 256/256, 10 minutes


def _prediction_on(workloads: tuple[str, ...]) -> Callable[[Results], Verdict]:
    def judge(res: Results) -> Verdict:
        parts, ok, short = [], True, []
        for w in workloads:
            base = res[w, "vtc"].summary.max_backlogged_diff
            d = {p: res[w, p].summary.max_backlogged_diff for p in PREDICTORS if (w, p) in res}
            ok &= d[PREDICTORS[0]] < base and d[PREDICTORS[1]] < base
            n = len(res[w, "vtc"].summary.clients)
            parts.append(
                f"{w} ({n} clients): VTC {base:,.0f}, " + ", ".join(f"{p.split(':')[1]} {v:,.0f}" for p, v in d.items())
            )
            short.append(f"{n} clients: {base:,.0f} → {d[PREDICTORS[0]]:,.0f} / {d[PREDICTORS[1]]:,.0f}")
        return ok, "largest backlogged difference — " + "; ".join(parts), "; ".join(short) + " (VTC → oracle / ±50%)"

    return judge


WEIGHTED = RunSpec(WEIGHTED_W, "vtc", label="weighted vtc")
BOUND_RUNS = (
    *_runs(["overload", "on-off-overload", "poisson-short-long", "poisson-short-long-2", "overload-multi"], "vtc"),
    WEIGHTED,
    *_runs([*LENGTHS, POOL[1]], "vtc"),
    RunSpec(REAL, "vtc"),
)


def _bound(res: Results) -> Verdict:
    rows = [(r.workload, res[r.workload, r.name]) for r in BOUND_RUNS if (r.workload, r.name) in res]
    worst = max(rows, key=lambda r: r[1].summary.max_backlogged_diff / r[1].bound)
    ok = all(r.summary.max_backlogged_diff <= r.bound for _, r in rows)
    ratio = worst[1].summary.max_backlogged_diff / worst[1].bound
    return (
        ok,
        f"{len(rows)} workloads; the closest to its bound was {worst[0]} at {_pct(ratio)} of 2U",
        f"≤ {_pct(ratio)} of 2U on {len(rows)} workloads",
    )


BELOW_SHARE = (
    ("proportional", "client-0"),
    ("proportional", "client-1"),
    ("on-off-less", "client-0"),
    ("poisson-on-off-overload", "client-0"),
)


def _non_backlogged(res: Results) -> Verdict:
    """Theorems 4.11 / 4.13 on the runs where one client asks below its share: all its requests are dispatched
    (those arriving in the last minute may still wait), and on `increase` its response time does not grow while
    the other client's rate rises ten-fold."""
    parts, ok = [], True
    for w, c in BELOW_SHARE:
        out = res[w, "vtc"]
        early = [r for r in out.records if r.client == c and r.arrival_s < out.duration_s - 60]
        done = sum(r.admit_s is not None for r in early)
        ok &= done == len(early)
        parts.append(f"{w}/{c}: {done} of {len(early)} dispatched")
    inc = res["increase", "vtc"]
    third = inc.duration_s / 3
    first, last = _f(mean_response(inc, "client-0", 0, third)), _f(mean_response(inc, "client-0", 2 * third))
    ok &= last <= 2 * first + 1.0
    parts.append(f"increase/client-0 mean response {first:.1f} s in the first third, {last:.1f} s in the last")
    return ok, "under VTC " + "; ".join(parts), f"all dispatched; {first:.1f} → {last:.1f} s as the other ramps 10×"


def _drr(res: Results) -> Verdict:
    w = "overload-multi"
    v, d = res[w, "vtc"].summary, res[w, "drr:1"].summary
    gap = max(abs(d.clients[c].service / v.clients[c].service - 1) for c in v.clients)
    # not identical: ties between equal counters and the order of a round are broken differently
    ok = gap <= 0.05 and d.max_backlogged_diff <= res[w, "vtc"].bound
    return (
        ok,
        (
            f"on {w} (8 clients) DRR with quantum 1 gave every client within {100 * gap:.1f}% of its service "
            f"under VTC; largest backlogged difference {d.max_backlogged_diff:,.0f} vs {v.max_backlogged_diff:,.0f}"
        ),
        f"per-client service within {100 * gap:.1f}% of VTC's",
    )


def _alternatives(res: Results) -> Verdict:
    """§5: every alternative fails in at least one workload, each on the experiment whose claim says it fails."""
    shown = {
        "FCFS on overload": _overload(res)[0],
        "LCF on dist-shift": _dist_shift(res)[0],
        "RPM on real": _rpm(res)[0],
    }
    ok = all(shown.values())
    return (
        ok,
        "; ".join(f"{k}: {'fails, while VTC holds' if v else 'not shown'}" for k, v in shown.items()),
        ", ".join(k.split()[0] for k, v in shown.items() if v) + " each fail on one workload",
    )


def _profiled_synthetic(res: Results) -> Verdict:
    s = {
        n: [c.service for c in res["overload-multi", n].summary.clients.values()]
        for n in ("vtc (profiled cost)", "fcfs (profiled cost)")
    }
    v, f = (max(x) / min(x) for x in s.values())
    return (
        v <= 1.2 and f >= 1.3,
        (
            f"on overload-multi the best-served client got {v:.2f}× the worst's service under "
            f"VTC and {f:.2f}× under FCFS (cost measured by h)"
        ),
        f"best/worst {v:.2f} (VTC) vs {f:.2f} (FCFS)",
    )
