"""The paper's experiments (§5, appendix B): what to run, the claim, and the verdict computed from the numbers."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .analysis import demand_rate, difference_series, fair_level, mean_response, served, share_ratio
from .runs import REAL, RunOutput, RunSpec

Verdict = tuple[bool, str]


class Results(dict):
    """(workload, run name) -> RunOutput."""

    def has(self, workload: str) -> bool:
        return any(w == workload for w, _ in self)


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    claim: str
    runs: tuple[RunSpec, ...]
    judge: Callable[[Results], Verdict]
    figures: tuple[str, ...]            # figure kinds, drawn by report.py

    @property
    def workloads(self) -> list[str]:
        return list(dict.fromkeys(r.workload for r in self.runs))


def _runs(workloads: str | list[str], *policies: str, **kw) -> tuple[RunSpec, ...]:
    names = [workloads] if isinstance(workloads, str) else workloads
    return tuple(RunSpec(w, p, **kw) for w in names for p in policies)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


# ---- verdicts -----------------------------------------------------------------------------------------------------
def _overload(res: Results) -> Verdict:
    vtc, fcfs = res["overload", "vtc"], res["overload", "fcfs"]
    r_vtc, r_fcfs = share_ratio(vtc, "client-1", "client-0"), share_ratio(fcfs, "client-1", "client-0")
    d_vtc, d_fcfs = vtc.summary.max_backlogged_diff, fcfs.summary.max_backlogged_diff
    series = difference_series(fcfs)
    half, end = series[len(series) // 2], series[-1]
    ok = abs(r_vtc - 1) <= 0.05 and d_vtc <= vtc.bound and d_fcfs > vtc.bound and end >= 1.8 * half
    return ok, (f"while both were backlogged the fast sender got {r_vtc:.2f}× the slow one's service under VTC and "
                f"{r_fcfs:.2f}× under FCFS; the largest VTC difference was {d_vtc:,.0f} (bound {vtc.bound:,.0f}), "
                f"FCFS's difference grew from {half:,.0f} at mid-run to {end:,.0f}")


def _light_clients_served(workload: str, light: list[str], heavy: str) -> Callable[[Results], Verdict]:
    def judge(res: Results) -> Verdict:
        vtc, fcfs = res[workload, "vtc"], res[workload, "fcfs"]
        parts, ok = [], True
        for c in light:
            got = vtc.summary.clients[c].service_rate / demand_rate(vtc, c)
            rt_v, rt_f = mean_response(vtc, c), mean_response(fcfs, c)
            ok &= got >= 0.85 and rt_v is not None and rt_f is not None and rt_v <= rt_f / 4
            parts.append(f"{c} got {_pct(got)} of what it asked with mean response {rt_v:.1f} s (FCFS {rt_f:.1f} s)")
        rates = {c: s.service_rate for c, s in vtc.summary.clients.items()}
        fair = sum(rates.values()) / len(rates)
        ok &= rates[heavy] > fair
        parts.append(f"{heavy} received {rates[heavy]:,.0f}/s, above an equal split of {fair:,.0f}/s")
        return ok, "under VTC " + "; ".join(parts)
    return judge


def _equal_when_backlogged(workload: str) -> Callable[[Results], Verdict]:
    def judge(res: Results) -> Verdict:
        r_vtc = share_ratio(res[workload, "vtc"], "client-0", "client-1")
        r_fcfs = share_ratio(res[workload, "fcfs"], "client-0", "client-1")
        ok = r_vtc is not None and abs(r_vtc - 1) <= 0.1 and r_fcfs is not None and abs(r_fcfs - 1) > 0.1
        return ok, (f"while both were backlogged client-0 got {r_vtc:.2f}× client-1's service under VTC and "
                    f"{r_fcfs:.2f}× under FCFS")
    return judge


def _bounded(workload: str) -> Callable[[Results], Verdict]:
    def judge(res: Results) -> Verdict:
        vtc, fcfs = res[workload, "vtc"], res[workload, "fcfs"]
        d_v, d_f = vtc.summary.max_backlogged_diff, fcfs.summary.max_backlogged_diff
        ok = d_v <= vtc.bound < d_f
        return ok, f"largest difference {d_v:,.0f} under VTC, {d_f:,.0f} under FCFS; the bound 2U is {vtc.bound:,.0f}"
    return judge


def _increase(res: Results) -> Verdict:
    vtc, fcfs = res["increase", "vtc"], res["increase", "fcfs"]
    start = vtc.duration_s * 2 / 3           # the last third: the other client asks for more than the server has
    got = served(vtc, "client-0", start, vtc.duration_s) / (vtc.duration_s - start)
    asked = demand_rate(vtc, "client-0", start)
    rt_v, rt_f = mean_response(vtc, "client-0", start), mean_response(fcfs, "client-0", start)
    ok = got >= 0.85 * asked and rt_v <= rt_f / 2
    return ok, (f"in the last third client-0 received {got:,.0f}/s of the {asked:,.0f}/s it asked under VTC, with mean "
                f"response {rt_v:.1f} s against {rt_f:.1f} s under FCFS")


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
                f"{_pct(1 - v['share'])} (client-0 mean response {v['rt']:.1f} s)")


def _real(res: Results) -> Verdict:
    vtc, fcfs = res[REAL, "vtc"], res[REAL, "fcfs"]
    clients = sorted(vtc.summary.clients)
    demands = {c: demand_rate(vtc, c) for c in clients}
    level = fair_level(demands, vtc.summary.service_per_s)
    rt = {name: {c: mean_response(run, c) or 0.0 for c in clients} for name, run in (("vtc", vtc), ("fcfs", fcfs))}
    med_v, med_f = np.median(list(rt["vtc"].values())), np.median(list(rt["fcfs"].values()))
    slow = [c for c in clients if rt["vtc"][c] > 3 * med_v]
    above = [c for c in slow if demands[c] > level]
    ok = med_f >= 3 * med_v and len(above) == len(slow)
    return ok, (f"median client response {med_v:.1f} s under VTC and {med_f:.1f} s under FCFS; under VTC "
                f"{len(slow)} client(s) waited over 3× the median ({', '.join(slow) or 'none'}), of which "
                f"{len(above)} asked for more than the fair share of {level:,.0f}/s")


RPM_LIMITS = (5, 10, 15, 20, 30)


def _rpm(res: Results) -> Verdict:
    vtc = res[REAL, "vtc"].summary.output_tokens_per_s
    fcfs = res[REAL, "fcfs"].summary.output_tokens_per_s
    tput = [res[REAL, f"rpm:{n}"].summary.output_tokens_per_s for n in RPM_LIMITS]
    ok = tput[0] <= 0.6 * vtc and all(a <= b for a, b in zip(tput, tput[1:])) and tput[-1] >= 0.85 * fcfs
    return ok, (f"RPM {RPM_LIMITS[0]} reached {tput[0]:.0f} output tokens/s, {_pct(tput[0] / vtc)} of VTC's {vtc:.0f} "
                f"(paper: 44%); limits {', '.join(map(str, RPM_LIMITS))} gave "
                f"{', '.join(f'{t:.0f}' for t in tput)} tokens/s, approaching FCFS's {fcfs:.0f}")


ABLATION = ("overload-s4-256", "overload-s4-512", "overload-s4-768", "overload-s4-long")


def _ablation(res: Results) -> Verdict:
    runs = [res[w, "vtc"] for w in ABLATION]
    diffs = [r.summary.max_backlogged_diff for r in runs]
    # the trend, not every step: the longest s4 requests vs the shortest, and the larger pool vs all s4 runs
    ok = all(d <= r.bound for d, r in zip(diffs, runs)) and diffs[0] < diffs[2] and diffs[3] > max(diffs[:3])
    return ok, ("largest differences " + ", ".join(f"{w.removeprefix('overload-')}: {d:,.0f} (bound {r.bound:,.0f})"
                                                    for w, d, r in zip(ABLATION, diffs, runs)))


def _weighted(res: Results) -> Verdict:
    parts, ok = [], True
    for name, expect in (("weighted vtc", [1, 2, 3, 4]), ("vtc (no weights)", [1, 1, 1, 1])):
        s = res["overload-weighted", name].summary.clients
        got = [s[f"client-{i}"].service / s["client-0"].service for i in range(4)]
        ok &= all(abs(g / e - 1) <= 0.05 for g, e in zip(got, expect))
        parts.append(f"{name} split service {':'.join(f'{g:.2f}' for g in got)}")
    return ok, "; ".join(parts)


PROFILED = ("vtc (profiled cost)", "fcfs (profiled cost)")


def _profiled(res: Results) -> Verdict:
    parts, ok = [], True
    spread = {}
    for name in PROFILED:
        s = [c.service for c in res["overload-multi", name].summary.clients.values()]
        spread[name] = max(s) / min(s)
    v, f = (spread[n] for n in PROFILED)
    ok &= v <= 1.2 and f >= 1.3
    parts.append(f"on overload-multi the best-served client got {v:.2f}× the worst's service under VTC "
                 f"and {f:.2f}× under FCFS (cost measured by h)")
    if res.has(REAL):
        d_v, d_f = (res[REAL, n].summary.max_backlogged_diff for n in PROFILED)
        ok &= d_v * 2 <= d_f
        parts.append(f"on real the largest difference was {d_v:,.0f} under VTC and {d_f:,.0f} under FCFS")
    else:
        parts.append("real: skipped (no Arena trace)")
    return ok, "; ".join(parts)


PREDICTORS = ("vtc-predict:oracle", "vtc-predict:oracle±50", "vtc-predict:moving-average")


def _prediction(res: Results) -> Verdict:
    parts, ok = [], True
    for w in ("overload", "overload-multi", REAL):
        if not res.has(w):
            parts.append(f"{w}: skipped (no Arena trace)")
            continue
        base = res[w, "vtc"].summary.max_backlogged_diff
        d = {p: res[w, p].summary.max_backlogged_diff for p in PREDICTORS}
        ok &= d[PREDICTORS[0]] < base and d[PREDICTORS[1]] < base
        parts.append(f"{w}: VTC {base:,.0f}, " + ", ".join(f"{p.split(':')[1]} {v:,.0f}" for p, v in d.items()))
    return ok, "largest backlogged difference — " + "; ".join(parts)


WEIGHTED = RunSpec("overload-weighted", "vtc", label="weighted vtc")
BOUND_RUNS = (*_runs(["overload", "on-off-overload", "poisson-short-long", "poisson-short-long-2", "overload-multi"],
                     "vtc"), WEIGHTED, *_runs(list(ABLATION), "vtc"), RunSpec(REAL, "vtc"))


def _bound(res: Results) -> Verdict:
    rows = [(r.workload, res[r.workload, r.name]) for r in BOUND_RUNS if (r.workload, r.name) in res]
    worst = max(rows, key=lambda r: r[1].summary.max_backlogged_diff / r[1].bound)
    ok = all(r.summary.max_backlogged_diff <= r.bound for _, r in rows)
    ratio = worst[1].summary.max_backlogged_diff / worst[1].bound
    return ok, f"{len(rows)} workloads; the closest to its bound was {worst[0]} at {_pct(ratio)} of 2U"


EXPERIMENTS: tuple[Experiment, ...] = (
    Experiment("overload", "Overload: two clients, one sending twice as fast",
               "VTC gives equal service while both are backlogged and the difference stays bounded; under FCFS the "
               "difference grows without bound.", _runs("overload", "vtc", "fcfs"), _overload,
               ("service_rate", "difference")),
    Experiment("proportional", "Proportional: two light clients and one heavy",
               "Clients asking below their share are served as they ask, with low response time; the rest goes to "
               "the heavy client.", _runs("proportional", "vtc", "fcfs"),
               _light_clients_served("proportional", ["client-0", "client-1"], "client-2"),
               ("service_rate", "response_time")),
    Experiment("on-off-less", "On/off client below its share",
               "The on/off client keeps a low response time whenever it returns.", _runs("on-off-less", "vtc", "fcfs"),
               _light_clients_served("on-off-less", ["client-0"], "client-1"), ("service_rate", "response_time")),
    Experiment("on-off-overload", "On/off client above its share",
               "The two clients get equal service whenever both are backlogged.",
               _runs("on-off-overload", "vtc", "fcfs"), _equal_when_backlogged("on-off-overload"),
               ("service_rate", "response_time")),
    Experiment("poisson-short-long", "Poisson arrivals, short vs long requests",
               "The service difference stays bounded under VTC despite different request sizes.",
               _runs("poisson-short-long", "vtc", "fcfs"), _bounded("poisson-short-long"),
               ("service_rate", "difference")),
    Experiment("poisson-short-long-2", "Poisson arrivals, input-heavy vs output-heavy",
               "The service difference stays bounded under VTC with input-heavy vs output-heavy clients.",
               _runs("poisson-short-long-2", "vtc", "fcfs"), _bounded("poisson-short-long-2"),
               ("service_rate", "difference")),
    Experiment("increase", "Increasing load", "The steady client keeps its share as the other ramps up.",
               _runs("increase", "vtc", "fcfs"), _increase, ("service_rate", "response_time")),
    Experiment("dist-shift", "Distribution shift: VTC vs LCF",
               "LCF lets the client with old credit dominate after the shift; VTC does not.",
               _runs("dist-shift", "vtc", "lcf"), _dist_shift, ("service_rate", "response_time")),
    Experiment("real", "Real workload (Chatbot Arena trace, 27 clients)",
               "FCFS raises every client's response time; VTC confines large increases to clients above their share.",
               _runs(REAL, "vtc", "fcfs", "lcf"), _real, ("response_time",)),
    Experiment("rpm", "Request-per-minute limits vs VTC",
               "RPM limits waste capacity (about 44% of VTC's throughput at RPM 5) and converge to FCFS as the "
               "limit rises.", _runs(REAL, "vtc", "fcfs", *(f"rpm:{n}" for n in RPM_LIMITS)), _rpm,
               ("throughput", "mean_response")),
    Experiment("ablation", "Ablation: pool size and request length (Llama-2-13b, A100-80GB)",
               "Larger pools and longer requests widen the service difference, which stays bounded.",
               _runs(list(ABLATION), "vtc"), _ablation, ("difference_by_workload",)),
    Experiment("weighted", "Weighted VTC (weights 1:2:3:4)",
               "Weighted VTC splits service 1:2:3:4; plain VTC splits it equally.",
               (WEIGHTED, RunSpec("overload-weighted", "vtc", weighted=False, label="vtc (no weights)")), _weighted,
               ("client_service",)),
    Experiment("profiled-cost", "A profiled, nonlinear cost function",
               "Fairness holds under a nonlinear cost h(x, y).",
               tuple(RunSpec(w, p.split()[0], cost="profiled", label=p) for w in ("overload-multi", REAL)
                     for p in PROFILED), _profiled,
               ("service_rate", "response_time")),
    Experiment("length-prediction", "VTC with output-length prediction",
               "Prediction lowers the service discrepancy, even at ±50% error.",
               _runs(["overload", "overload-multi", REAL], "vtc", *PREDICTORS), _prediction,
               ("difference_by_policy",)),
    Experiment("bound", "Theorem 4.4: the bound on the service difference",
               "The difference between two backlogged clients never exceeds 2U = 2·max(w_p·L_in, w_q·M).",
               BOUND_RUNS, _bound, ("bound",)),
)


def _check_unique_names() -> None:
    """Results are keyed by (workload, run name): two different runs must not share one."""
    seen: dict[tuple[str, str], RunSpec] = {}
    for r in (r for e in EXPERIMENTS for r in e.runs):
        other = seen.setdefault((r.workload, r.name), r)
        if other != r:
            raise AssertionError(f"two different runs are both called {r.name!r} on {r.workload}")


_check_unique_names()
