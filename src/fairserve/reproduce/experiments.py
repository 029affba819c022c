"""The paper's experiments (§4's theorems, §5, appendices B and C), each with the claim and scope as the paper states
them (section, figure and page from its summary), the paper's own figure where it gives one, what to run, and the rule
that computes our verdict on exactly that scope. `OWN_FINDINGS` go beyond the paper's scope and are reported apart."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    claim: str                          # as the paper states it
    runs: tuple[RunSpec, ...]
    judge: Callable[[Results], Verdict]
    figures: tuple[str, ...]            # figure kinds, drawn by plots.py
    source: str = ""                    # section, figure and page of the paper (its summary)
    scope: str = ""                     # workloads, policies, hardware and what is measured, as the paper states them
    paper: str = ""                     # the paper's own number(s) and which run they come from; "" = none given
    own: bool = False                   # beyond the paper's scope: our own finding, never the paper's claim failing
    brief: tuple[str, str] = ("", "")   # (claim, scope) in a few words, for the one-screen overview

    @property
    def workloads(self) -> list[str]:
        return list(dict.fromkeys(r.workload for r in self.runs))


def _runs(workloads: str | list[str], *policies: str, **kw) -> tuple[RunSpec, ...]:
    names = [workloads] if isinstance(workloads, str) else workloads
    return tuple(RunSpec(w, p, **kw) for w in names for p in policies)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


# ---- verdicts: each on the scope its experiment states ---------------------------------------------------------
def _overload(res: Results) -> Verdict:
    vtc, fcfs = res["overload", "vtc"], res["overload", "fcfs"]
    r_vtc, r_fcfs = share_ratio(vtc, "client-1", "client-0"), share_ratio(fcfs, "client-1", "client-0")
    d_vtc, d_fcfs = vtc.summary.max_backlogged_diff, fcfs.summary.max_backlogged_diff
    series = difference_series(fcfs)
    half, end = series[len(series) // 2], series[-1]
    ok = abs(r_vtc - 1) <= 0.05 and d_vtc <= vtc.bound and d_fcfs > vtc.bound and end >= 1.8 * half
    return ok, (f"while both were backlogged the fast sender got {r_vtc:.2f}× the slow one's service under VTC and "
                f"{r_fcfs:.2f}× under FCFS; the largest VTC difference was {d_vtc:,.0f} (bound {vtc.bound:,.0f}), "
                f"FCFS's difference grew from {half:,.0f} at mid-run to {end:,.0f}; service "
                f"{vtc.summary.service_per_s:,.0f}/s (VTC) and {fcfs.summary.service_per_s:,.0f}/s (FCFS)"), \
        (f"fast:slow {r_vtc:.2f} (VTC) vs {r_fcfs:.2f} (FCFS); service {vtc.summary.service_per_s:,.0f} / "
         f"{fcfs.summary.service_per_s:,.0f} /s")


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
        return ok, (f"while both were backlogged client-0 got {r_vtc:.2f}× client-1's service under VTC and "
                    f"{r_fcfs:.2f}× under FCFS"), f"{r_vtc:.2f} (VTC) vs {r_fcfs:.2f} (FCFS)"
    return judge


def _bounded(workload: str) -> Callable[[Results], Verdict]:
    def judge(res: Results) -> Verdict:
        vtc, fcfs = res[workload, "vtc"], res[workload, "fcfs"]
        d_v, d_f = vtc.summary.max_backlogged_diff, fcfs.summary.max_backlogged_diff
        ok = d_v <= vtc.bound < d_f
        return ok, (f"largest difference {d_v:,.0f} under VTC, {d_f:,.0f} under FCFS; the bound 2U is "
                    f"{vtc.bound:,.0f}; service {vtc.summary.service_per_s:,.0f}/s (VTC) and "
                    f"{fcfs.summary.service_per_s:,.0f}/s (FCFS)"), \
            f"VTC {d_v:,.0f}, FCFS {d_f:,.0f} (2U {vtc.bound:,.0f})"
    return judge


def _increase(res: Results) -> Verdict:
    vtc, fcfs = res["increase", "vtc"], res["increase", "fcfs"]
    start = vtc.duration_s * 2 / 3           # the last third: the other client asks for more than the server has
    got = served(vtc, "client-0", start, vtc.duration_s) / (vtc.duration_s - start)
    asked = demand_rate(vtc, "client-0", start)
    rt_v, rt_f = mean_response(vtc, "client-0", start), mean_response(fcfs, "client-0", start)
    ok = got >= 0.85 * asked and rt_v <= rt_f / 2
    return ok, (f"in the last third client-0 received {got:,.0f}/s of the {asked:,.0f}/s it asked under VTC, with mean "
                f"response {rt_v:.1f} s against {rt_f:.1f} s under FCFS"), \
        f"{got:,.0f} of {asked:,.0f}/s; {rt_v:.1f} s vs {rt_f:.1f} s (FCFS)"


def _dist_shift(res: Results) -> Verdict:
    t0, t1 = 300.0, min(600.0, res["dist-shift", "vtc"].duration_s)
    got = {}
    for name in ("vtc", "lcf"):
        run = res["dist-shift", name]
        a, b = served(run, "client-0", t0, t1), served(run, "client-1", t0, t1)
        got[name] = dict(share=a / (a + b), asked=a / (t1 - t0) / demand_rate(run, "client-0", t0, t1), other=b,
                         rt=mean_response(run, "client-0", t0, t1))
    v, lcf = got["vtc"], got["lcf"]
    ok = (abs(v["share"] - 0.5) <= 0.05 and lcf["asked"] >= 0.95 and lcf["rt"] <= v["rt"] / 2
          and lcf["other"] < v["other"])
    return ok, (f"in the phase after the shift (from 300 s) LCF served client-0, which had built up credit while "
                f"idle, {_pct(lcf['asked'])} of what it asked, first (mean response {lcf['rt']:.1f} s), and client-1 "
                f"only the rest ({_pct(1 - lcf['share'])} of the service); VTC split it {_pct(v['share'])} / "
                f"{_pct(1 - v['share'])} (client-0 mean response {v['rt']:.1f} s)"), \
        f"LCF: client-1 gets {_pct(1 - lcf['share'])}; VTC {_pct(v['share'])} / {_pct(1 - v['share'])}"


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
    raised = [c for c in within if rt["fcfs"][c] > rt["vtc"][c]]
    drastic = [(c, t0, r, d, lvl) for c, t0, r, d, lvl in client_windows(vtc) if r >= med_f]
    above = [w for w in drastic if w[3] > w[4]]
    ok = med_f >= 3 * med_v and len(raised) == len(within) and len(above) == len(drastic)
    cells = ", ".join(f"{c} at {t0:.0f} s ({r:.0f} s; asked {d:,.0f}/s vs {lvl:,.0f})" for c, t0, r, d, lvl in drastic)
    return ok, (f"median client response {med_v:.1f} s under VTC and {med_f:.1f} s under FCFS; FCFS raised the mean "
                f"response of {len(raised)} of the {len(within)} clients asking at most their fair share over the run; "
                f"under VTC {len(drastic)} client-minutes reached the FCFS median ({cells or 'none'}), "
                f"{len(above)} of them from clients asking above their share at that time"), \
        (f"median {med_v:.1f} s (VTC) vs {med_f:.1f} s (FCFS); {len(above)}/{len(drastic)} drastic client-minutes "
         f"above share")


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
    ok = (tput[0] <= 0.6 * vtc and all(a <= b for a, b in zip(tput, tput[1:])) and tput[-1] >= 0.85 * fcfs
          and rts[-1] > rts[0])
    return ok, (f"RPM {RPM_LIMITS[0]} reached {tput[0]:.0f} output tokens/s, {_pct(tput[0] / vtc)} of VTC's {vtc:.0f}; "
                f"limits {', '.join(map(str, RPM_LIMITS))} gave {', '.join(f'{t:.0f}' for t in tput)} tokens/s, "
                f"approaching FCFS's {fcfs:.0f}, with mean response {', '.join(f'{t:.1f}' for t in rts)} s "
                f"(FCFS {rt_f:.1f} s)"), \
        f"RPM 5: {tput[0]:.0f} vs {vtc:.0f} tokens/s ({_pct(tput[0] / vtc)}); RPM 30: {tput[-1]:.0f}"


LENGTHS = ("overload-s4-256", "overload-s4-512", "overload-s4-768")
POOL = ("overload-s4-512", "overload-s4-long")


def _ablation_length(res: Results) -> Verdict:
    runs = [res[w, "vtc"] for w in LENGTHS]
    d = [r.summary.max_backlogged_diff for r in runs]
    ok = all(x <= r.bound for x, r in zip(d, runs)) and d[0] < min(d[1:]) and abs(d[2] / d[1] - 1) <= 0.15
    return ok, ("largest backlogged difference with 35,000-token pool, by request length: " + ", ".join(
        f"{w.removeprefix('overload-s4-')}·2: {x:,.0f}" for w, x in zip(LENGTHS, d))
        + f" (bound {runs[0].bound:,.0f}); 768·2 is {d[2] / d[1]:.2f}× 512·2"), \
        " / ".join(f"{x:,.0f}" for x in d) + " (256·2 / 512·2 / 768·2)"


def _ablation_pool(res: Results) -> Verdict:
    small, large = (res[w, "vtc"] for w in POOL)
    d_s, d_l = small.summary.max_backlogged_diff, large.summary.max_backlogged_diff
    ok = d_l > d_s and d_s <= small.bound and d_l <= large.bound
    return ok, (f"512·2 requests: largest backlogged difference {d_s:,.0f} with a 35,000-token pool (bound "
                f"{small.bound:,.0f}), {d_l:,.0f} with 65,000 (bound {large.bound:,.0f})"), \
        f"{d_s:,.0f} (35,000) vs {d_l:,.0f} (65,000)"


WEIGHTED_W = "overload-weighted@600s"


def _weighted(res: Results) -> Verdict:
    parts, ok, short = [], True, []
    for name, expect in (("weighted vtc", [1, 2, 3, 4]), ("vtc (no weights)", [1, 1, 1, 1])):
        s = res[WEIGHTED_W, name].summary.clients
        got = [s[f"client-{i}"].service / s["client-0"].service for i in range(4)]
        ok &= all(abs(g / e - 1) <= 0.05 for g, e in zip(got, expect))
        parts.append(f"{name} split service {':'.join(f'{g:.2f}' for g in got)}")
        short.append(":".join(f"{g:.2f}" for g in got))
    return ok, "; ".join(parts), f"{short[0]} (weighted), {short[1]} (plain)"


def _profile_shape(res: Results) -> Verdict:
    ratios = {n: profile_decode_to_prefill(n) for n in (64, 128, 196, 256)}
    ok = all(1.5 <= r <= 5.5 for r in ratios.values())
    return ok, ("per-request decode time of n output tokens over prefill time of n input tokens, each in the largest "
                "batch a 10,000-token pool holds, on the profiled A10G forward model: "
                + ", ".join(f"n = {n}: {r:.1f}×" for n, r in ratios.items())
                + " (n = 64 decodes at batch 138, which the model under-estimates by 27%)"), \
        f"{min(ratios.values()):.1f}–{max(ratios.values()):.1f}× (n = 64–256)"


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
    return ok, (f"median over the {len(low)} low-rate clients of their mean response: {low_v:.1f} s (VTC), "
                f"{low_l:.1f} s (LCF), {low_f:.1f} s (FCFS); over the consistently high-rate clients "
                f"({', '.join(steady) or 'none'}): {hi_v:.1f} s (VTC), {hi_l:.1f} s (LCF); high-rate but bursty "
                f"(not judged): " + (", ".join(f"{c} ({mean_response(vtc, c):.1f} s VTC, {mean_response(lcf, c):.1f} "
                                               f"s LCF)" for c in bursty) or "none")), \
        f"low-rate {low_v:.1f} s (VTC) vs {low_f:.1f} s (FCFS); steady heavy {hi_l:.1f} s (LCF) vs {hi_v:.1f} s (VTC)"


PREDICTORS = ("vtc-predict:oracle", "vtc-predict:oracle±50", "vtc-predict:moving-average")
BACKLOGGED = ("overload@600s", "overload-multi@600s")     # two and eight backlogged clients, 256/256, 10 minutes


def _prediction_on(workloads: tuple[str, ...]) -> Callable[[Results], Verdict]:
    def judge(res: Results) -> Verdict:
        parts, ok, short = [], True, []
        for w in workloads:
            base = res[w, "vtc"].summary.max_backlogged_diff
            d = {p: res[w, p].summary.max_backlogged_diff for p in PREDICTORS if (w, p) in res}
            ok &= d[PREDICTORS[0]] < base and d[PREDICTORS[1]] < base
            n = len(res[w, "vtc"].summary.clients)
            parts.append(f"{w} ({n} clients): VTC {base:,.0f}, "
                         + ", ".join(f"{p.split(':')[1]} {v:,.0f}" for p, v in d.items()))
            short.append(f"{n} clients: {base:,.0f} → {d[PREDICTORS[0]]:,.0f} / {d[PREDICTORS[1]]:,.0f}")
        return ok, "largest backlogged difference — " + "; ".join(parts), \
            "; ".join(short) + " (VTC → oracle / ±50%)"
    return judge


WEIGHTED = RunSpec(WEIGHTED_W, "vtc", label="weighted vtc")
BOUND_RUNS = (*_runs(["overload", "on-off-overload", "poisson-short-long", "poisson-short-long-2", "overload-multi"],
                     "vtc"), WEIGHTED, *_runs([*LENGTHS, POOL[1]], "vtc"), RunSpec(REAL, "vtc"))


def _bound(res: Results) -> Verdict:
    rows = [(r.workload, res[r.workload, r.name]) for r in BOUND_RUNS if (r.workload, r.name) in res]
    worst = max(rows, key=lambda r: r[1].summary.max_backlogged_diff / r[1].bound)
    ok = all(r.summary.max_backlogged_diff <= r.bound for _, r in rows)
    ratio = worst[1].summary.max_backlogged_diff / worst[1].bound
    return ok, f"{len(rows)} workloads; the closest to its bound was {worst[0]} at {_pct(ratio)} of 2U", \
        f"≤ {_pct(ratio)} of 2U on {len(rows)} workloads"


BELOW_SHARE = (("proportional", "client-0"), ("proportional", "client-1"), ("on-off-less", "client-0"),
               ("poisson-on-off-overload", "client-0"))


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
    first, last = mean_response(inc, "client-0", 0, third), mean_response(inc, "client-0", 2 * third)
    ok &= last <= 2 * first + 1.0
    parts.append(f"increase/client-0 mean response {first:.1f} s in the first third, {last:.1f} s in the last")
    return ok, "under VTC " + "; ".join(parts), f"all dispatched; {first:.1f} → {last:.1f} s as the other ramps 10×"


def _drr(res: Results) -> Verdict:
    w = "overload-multi"
    v, d = res[w, "vtc"].summary, res[w, "drr:1"].summary
    gap = max(abs(d.clients[c].service / v.clients[c].service - 1) for c in v.clients)
    # not identical: ties between equal counters and the order of a round are broken differently
    ok = gap <= 0.05 and d.max_backlogged_diff <= res[w, "vtc"].bound
    return ok, (f"on {w} (8 clients) DRR with quantum 1 gave every client within {100 * gap:.1f}% of its service "
                f"under VTC; largest backlogged difference {d.max_backlogged_diff:,.0f} vs {v.max_backlogged_diff:,.0f}"), \
        f"per-client service within {100 * gap:.1f}% of VTC's"


def _alternatives(res: Results) -> Verdict:
    """§5: every alternative fails in at least one workload, each on the experiment whose claim says it fails."""
    shown = {"FCFS on overload": _overload(res)[0], "LCF on dist-shift": _dist_shift(res)[0],
             "RPM on real": _rpm(res)[0]}
    ok = all(shown.values())
    return ok, "; ".join(f"{k}: {'fails, while VTC holds' if v else 'not shown'}" for k, v in shown.items()), \
        ", ".join(k.split()[0] for k, v in shown.items() if v) + " each fail on one workload"


def _profiled_synthetic(res: Results) -> Verdict:
    s = {n: [c.service for c in res["overload-multi", n].summary.clients.values()]
         for n in ("vtc (profiled cost)", "fcfs (profiled cost)")}
    v, f = (max(x) / min(x) for x in s.values())
    return v <= 1.2 and f >= 1.3, (f"on overload-multi the best-served client got {v:.2f}× the worst's service under "
                                   f"VTC and {f:.2f}× under FCFS (cost measured by h)"), \
        f"best/worst {v:.2f} (VTC) vs {f:.2f} (FCFS)"


def _runs_of(*experiments: Experiment) -> tuple[RunSpec, ...]:
    return tuple(dict.fromkeys(r for e in experiments for r in e.runs))


def _e(name, title, claim, runs, judge, figures, source, scope, paper="", own=False, brief=("", "")) -> Experiment:
    return Experiment(name, title, claim, tuple(runs), judge, tuple(figures), source, scope, paper, own, brief)


_OVERLOAD = _e(
    "overload", "Overload: two clients, one sending twice as fast",
    "With constant request rates and both clients overloaded, VTC keeps their service difference small, whereas FCFS "
    "favors the higher-rate sender; VTC gives the two clients the same service level across time intervals.",
    _runs("overload", "vtc", "fcfs"), _overload, ("service_rate", "difference"), "§5.2, Fig. 3, p. 10",
    f"2 clients at 1.5 and 3 req/s (uniform), 256/256 tokens, 6 min; VTC vs FCFS; {A10G}; service rate per "
    "client over time, accumulated difference",
    f"service 1,340 / 1,305 per s, VTC / FCFS ({ARTIFACT})",
    brief=('equal service, bounded difference; FCFS favours the faster sender', '2 overloaded clients, 256/256'))
_PSL = _e(
    "poisson-short-long", "Poisson arrivals, short vs long requests",
    "With Poisson arrivals and unequal request lengths, VTC keeps service differences bounded while FCFS loses "
    "fairness.", _runs("poisson-short-long", "vtc", "fcfs"), _bounded("poisson-short-long"),
    ("service_rate", "difference"), "§5.2, p. 11",
    f"2 clients, Poisson 8 and 1.5 req/s, 64/64 vs 256/256 tokens, 10 min; VTC vs FCFS; {A10G}; largest difference "
    "between backlogged clients", f"service 2,035 / 2,230 per s, VTC / FCFS ({ARTIFACT})",
    brief=('bounded difference; FCFS unfair', 'Poisson, 64/64 vs 256/256'))
_PSL2 = _e(
    "poisson-short-long-2", "Poisson arrivals, input-heavy vs output-heavy",
    "With Poisson arrivals and differing input/output length combinations, VTC keeps service differences bounded "
    "while FCFS loses fairness.", _runs("poisson-short-long-2", "vtc", "fcfs"), _bounded("poisson-short-long-2"),
    ("service_rate", "difference"), "§5.2, p. 11",
    f"2 clients, Poisson 8 and 1.5 req/s, 512/32 vs 32/512 tokens, 10 min; VTC vs FCFS; {A10G}; largest "
    "difference between backlogged clients",
    brief=('bounded difference; FCFS unfair', 'Poisson, 512/32 vs 32/512'))
_POO = _e(
    "poisson-on-off-overload", "Poisson arrivals, on/off client below its share, variable lengths",
    "Under overload, a below-share client's response time stays roughly unchanged (VTC), while FCFS loses fairness.",
    _runs("poisson-on-off-overload", "vtc", "fcfs"),
    _light_clients_served("poisson-on-off-overload", ["client-0"], "client-1"), ("service_rate", "response_time"),
    "§5.2, p. 11",
    f"2 clients, Poisson 0.5 (on/off, 60 s periods) and 2 req/s, lengths uniform in [16, 512), 10 min; VTC vs "
    f"FCFS; {A10G}; the below-share client's service and response time",
    brief=("below-share client's response unchanged", 'Poisson on/off, lengths 16–512'))
_PROP = _e(
    "proportional", "Proportional: two light clients and one heavy",
    "A client below its share is served immediately and another client uses the remaining capacity (VTC "
    "reallocates unused capacity to demand).", _runs("proportional", "vtc", "fcfs"),
    _light_clients_served("proportional", ["client-0", "client-1"], "client-2"), ("service_rate", "response_time"),
    "§5.2, pp. 10–12", f"3 clients at 0.25, 0.5 and 1.5 req/s, 256/256 tokens, 10 min; VTC vs FCFS; {A10G}; "
    "service and response time per client",
    brief=('below-share clients served at once, rest to the heavy one', '3 clients, 2 below share'))
_OOL = _e(
    "on-off-less", "On/off client below its share",
    "A client below its share is served immediately whenever it returns, and the other client uses the rest.",
    _runs("on-off-less", "vtc", "fcfs"), _light_clients_served("on-off-less", ["client-0"], "client-1"),
    ("service_rate", "response_time"), "§5.2, pp. 10–12",
    f"client-0 on/off (60 s periods) at 0.5 req/s, client-1 at 2 req/s, 256/256 tokens, 10 min; VTC vs FCFS; "
    f"{A10G}; service and response time",
    brief=('returning below-share client served at once', 'on/off client below share'))
_OOO = _e(
    "on-off-overload", "On/off client above its share",
    "VTC keeps equal service for backlogged clients, also when one of them comes and goes.",
    _runs("on-off-overload", "vtc", "fcfs"), _equal_when_backlogged("on-off-overload"),
    ("service_rate", "response_time"), "§5.2, pp. 10–12",
    f"client-0 on/off at 2 req/s, client-1 at 3 req/s, 256/256 tokens, 10 min; VTC vs FCFS; {A10G}; service "
    "ratio while both are backlogged",
    brief=('equal service whenever both backlogged', 'on/off client above share'))
_INC = _e(
    "increase", "Increasing load",
    "VTC reallocates capacity as demand changes: the steady client keeps its share as the other ramps up.",
    _runs("increase", "vtc", "fcfs"), _increase, ("service_rate", "response_time"), "§5.2, pp. 10–12",
    f"client-0 at 0.5 req/s, client-1 rising from 0.2 to 2 req/s, 256/256 tokens, 10 min; VTC vs FCFS; {A10G}; "
    "the steady client's service and response time in the overloaded last third",
    brief=('steady client keeps its share', 'other client ramps 10×'))
_DIST = _e(
    "dist-shift", "Distribution shift: VTC vs LCF",
    "After distribution shifts, LCF carries an earlier deficit into overload; VTC does not.",
    _runs("dist-shift", "vtc", "lcf"), _dist_shift, ("service_rate", "response_time"), "§5.2, pp. 10–12",
    f"three phases over 15 min (client-0 on/off, then both at 1 req/s, then 0.5 and 1.5), 256/256 tokens; VTC "
    f"vs LCF; {A10G}; shares after the shift",
    brief=('LCF carries old credit into overload; VTC not', '3 phases, VTC vs LCF'))
_REAL = _e(
    "real", "Real workload (Chatbot Arena trace, 27 clients)",
    "On real traces, FCFS sharply increases response times for all clients, while VTC concentrates drastic "
    "increases among clients sending above their share.", _runs(REAL, "vtc", "fcfs", "lcf"), _real,
    ("response_time",), "§5.3, pp. 12–13",
    f"the Chatbot Arena trace, 27 clients, 10 min (mean prompt 136, output 256); VTC vs FCFS (LCF shown); {A10G}; "
    "response time per client over time",
    f"trace of 27 clients, mean lengths 136 / 256 ({ORIGINAL}; we run the artifact's re-sampled trace, same "
    "statistics)",
    brief=('FCFS slows all; VTC only above-share clients, drastically', 'Arena trace, 27 clients'))
_RPM = _e(
    "rpm", "Request-per-minute limits vs VTC",
    "At RPM = 5 throughput is ≈ 340 output tokens/s versus ≈ 779 in VTC or FCFS; higher limits raise throughput "
    "(to 747) but weaken fairness, and response times grow and converge to FCFS.",
    _runs(REAL, "vtc", "fcfs", *(f"rpm:{n}" for n in RPM_LIMITS)), _rpm, ("throughput", "mean_response"),
    "§5.3, Fig. 14, p. 13",
    f"the Arena trace; RPM limits 5–30 vs VTC and FCFS; {A10G}; output tokens/s and response time",
    f"RPM 5: ≈ 340 vs ≈ 779 tokens/s (44%), up to 747 ({ORIGINAL}, original trace: compare the ratio)",
    brief=("RPM 5 ≈ 44% of VTC's throughput; converges to FCFS", 'Arena trace, RPM 5–30'))
_ALT = _e(
    "alternatives", "Every alternative fails somewhere",
    "VTC confirms the fairness properties, while every alternative fails in at least one workload.",
    _runs_of(_OVERLOAD, _DIST, _RPM), _alternatives, (), "§5, p. 9",
    "FCFS, LCF and RPM, each on the workload where the paper shows it failing (overload, dist-shift, real); "
    f"{A10G}",
    brief=('every alternative fails somewhere', 'FCFS, LCF, RPM'))
_ABL_LEN = _e(
    "ablation-length", "Ablation: request length",
    "With clients backlogged, longer requests increase the variation in the absolute difference of accumulated "
    "services; 512·2 and 768·2 have the same variance.",
    _runs(list(LENGTHS), "vtc"), _ablation_length, ("difference_by_workload",), "§5.4, Fig. 15, pp. 13–14",
    f"2 backlogged clients, uniform arrivals at different rates, 256·2 / 512·2 / 768·2 tokens, 35,000-token pool, "
    f"10 min; VTC; {S4} (the summary names no hardware); the largest backlogged difference (the amplitude of Fig. "
    "15's oscillation)",
    brief=('longer requests: larger variation; 512·2 ≈ 768·2', '35,000 pool, 2 backlogged'))
_ABL_POOL = _e(
    "ablation-pool", "Ablation: memory pool",
    "With clients backlogged, a 65,000- versus 35,000-token memory pool increases the variation in the absolute "
    "difference of accumulated services.", _runs(list(POOL), "vtc"), _ablation_pool, ("difference_by_workload",),
    "§5.4, Fig. 15, pp. 13–14",
    f"2 backlogged clients, 512·2 tokens, pools of 35,000 and 65,000 tokens, 10 min; VTC; {S4}; the largest "
    "backlogged difference",
    brief=('65,000 pool: larger variation than 35,000', '512·2, 2 backlogged'))
_WEIGHTED = _e(
    "weighted", "Weighted VTC (weights 1:2:3:4)",
    "Weights 1:2:3:4 yield a service distribution closely adhering to those ratios under weighted VTC, while "
    "standard VTC gives the four overloaded clients comparable service.",
    (WEIGHTED, RunSpec(WEIGHTED_W, "vtc", weighted=False, label="vtc (no weights)")), _weighted,
    ("client_service",), "§B.1, Fig. 16, p. 20",
    f"4 overloaded clients, 256/256 tokens, 10 min; weighted vs plain VTC; {A10G}; service per client",
    "1:2:3:4 (\"closely adhering\"; no numbers given)",
    brief=('weighted VTC 1:2:3:4; plain VTC equal', '4 overloaded clients, 10 min'))
_PROFILE = _e(
    "profile-shape", "The A10G profile: decode vs prefill",
    "Decode time for all-output-token scenarios is about 2 to 5 times prefill time for all-input-token scenarios "
    "with the same total token count.", (), _profile_shape, (), "§B.2, Fig. 17, pp. 20–21",
    "Llama-2-7b on an A10G, largest batch that fills the 10,000-token pool, per-request times; our profiled "
    "forward model of the same profile (the preset without the server overhead)", "about 2–5×",
    brief=('decode ≈ 2–5× prefill at equal tokens', 'A10G profile'))
_PROFILED = _e(
    "profiled-cost", "Real trace with the profiled cost function (VTC, LCF, FCFS)",
    "With a profiled cost function, VTC maintains low response times for low-rate clients, unlike the baselines "
    "except LCF, which gives consistently high-rate clients excessively high response times.",
    (RunSpec(REAL, "vtc", cost="profiled", label="vtc (profiled cost)"),
     RunSpec(REAL, "lcf", cost="profiled", label="lcf (profiled cost)"),
     RunSpec(REAL, "fcfs", cost="profiled", label="fcfs (profiled cost)")),
    _profiled_real, ("response_time",), "§B.2, pp. 20–21; Fig. 18, p. 22",
    f"the Arena trace, 27 clients, 10 min; VTC and LCF charging the profiled cost, FCFS; {A10G}; response time "
    "per client over time",
    brief=('VTC keeps low-rate clients fast; LCF punishes steady heavy ones', 'Arena trace, profiled cost'))
_PREDICT = _e(
    "length-prediction", "VTC with output-length prediction (2 and 8 backlogged clients)",
    "In synthetic workloads where all clients are overloaded, length prediction reduces service discrepancies "
    "compared with standard VTC, even with output-length predictions that err by up to 50%.",
    _runs(list(BACKLOGGED), "vtc", *PREDICTORS), _prediction_on(BACKLOGGED), ("difference_by_policy",),
    "§B.3, p. 21; Fig. 19, p. 22",
    f"2 and 8 continuously backlogged clients, 256/256 tokens, 10 min; VTC vs VTC with oracle and ±50% "
    f"predictions (moving average shown too); {A10G}; maximum accumulated service difference",
    brief=('prediction lowers the discrepancy, also at ±50%', '2 and 8 backlogged clients, 10 min'))
_BOUND = _e(
    "bound", "Theorem 4.4: the bound on the service difference",
    "For backlogged clients VTC's service difference is bounded, tight within a factor of 2: with w_q > w_p the "
    "upper bound is 2·w_q·M (2U = 2·max(w_p·L_in, w_q·M)).", BOUND_RUNS, _bound, ("bound",), "§4.1.1, p. 7",
    "any workload, work-conserving scheduling without preemption; M = the KV pool; measured on 11 of our runs",
    "bound 2U (theorem)",
    brief=('backlogged difference ≤ 2U', '11 of our runs'))
_NONBACK = _e(
    "non-backlogged", "Theorems 4.11 and 4.13: clients below their share",
    "For non-backlogged clients, VTC bounds a new request's response time independently of other clients' request "
    "rates, and dispatches all requests of a client whose rate stays below its share.",
    _runs([w for w, _ in dict.fromkeys(BELOW_SHARE)] + ["increase"], "vtc"), _non_backlogged, (),
    "§4.1.2, p. 8; App. A, pp. 19–20",
    f"the synthetic runs in which a client asks below its share (proportional, on-off-less, "
    f"poisson-on-off-overload) and `increase` (the other client's rate rises 10×); VTC; {A10G}",
    brief=('below-share clients all dispatched; response independent of others', '4 below-share clients; increase'))
_DRR = _e(
    "drr", "Adapted DRR equals VTC",
    "The adapted deficit round robin with a quantum smaller than one prompt token's cost functions like VTC.",
    _runs("overload-multi", "vtc", "drr:1"), _drr, (), "§C.2, pp. 22–24",
    f"our overload-multi (8 backlogged clients, 256/256 tokens, 6 min): DRR with quantum 1 vs VTC; {A10G}; "
    "service per client",
    brief=('DRR with a tiny quantum = VTC', '8 backlogged clients'))

EXPERIMENTS: tuple[Experiment, ...] = (
    _OVERLOAD, _PSL, _PSL2, _POO, _PROP, _OOL, _OOO, _INC, _DIST, _ALT, _REAL, _RPM, _ABL_LEN, _ABL_POOL, _WEIGHTED,
    _PROFILE, _PROFILED, _PREDICT, _BOUND, _NONBACK, _DRR)

# Beyond the paper's scope: our own findings, reported apart from the paper's claims.
OWN_FINDINGS: tuple[Experiment, ...] = (
    _e("prediction-real", "Length prediction on the real trace",
       "Does prediction also lower the discrepancy on the Arena trace, where clients are not all backlogged?",
       _runs(REAL, "vtc", *PREDICTORS), _prediction_on((REAL,)), ("difference_by_policy",),
       "beyond §B.3 (the paper: synthetic overloaded workloads; §4.4: effectiveness depends on the workload)",
       f"the Arena trace; VTC vs oracle, ±50% and moving-average prediction; {A10G}; largest backlogged difference",
       own=True,
    brief=('does prediction help on the real trace?', 'Arena trace')),
    _e("profiled-synthetic", "The profiled cost on a synthetic overload",
       "Does VTC with the profiled cost also equalise service on a synthetic overload of 8 clients?",
       tuple(RunSpec("overload-multi", p, cost="profiled", label=f"{p} (profiled cost)") for p in ("vtc", "fcfs")),
       _profiled_synthetic, ("service_rate",), "beyond §B.2 (the paper: the real trace)",
       f"overload-multi, 8 clients; VTC and FCFS measured by the profiled cost; {A10G}; service per client",
       own=True,
    brief=('does the profiled cost equalise a synthetic overload?', '8 overloaded clients')),
)
ALL_EXPERIMENTS: tuple[Experiment, ...] = EXPERIMENTS + OWN_FINDINGS


def _check_unique_names() -> None:
    """Results are keyed by (workload, run name): two different runs must not share one."""
    seen: dict[tuple[str, str], RunSpec] = {}
    names: set[str] = set()
    for e in ALL_EXPERIMENTS:
        if e.name in names:
            raise AssertionError(f"two experiments are both called {e.name!r}")
        names.add(e.name)
        for r in e.runs:
            other = seen.setdefault((r.workload, r.name), r)
            if other != r:
                raise AssertionError(f"two different runs are both called {r.name!r} on {r.workload}")


_check_unique_names()
