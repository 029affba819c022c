"""The paper's experiments (§4's theorems, §5, appendices B and C), each with the claim and scope as the paper states
them (section, figure and page from its summary), the paper's own figure where it gives one, what to run, and the rule
that computes our verdict on exactly that scope. `OWN_FINDINGS` go beyond the paper's scope and are reported apart."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import fleet, locality, preemption, trees
from .runs import RunSpec
from .verdicts import (  # the rules behind each verdict, and the run sets they share with the catalogue
    A10G,
    ARTIFACT,
    BACKLOGGED,
    BELOW_SHARE,
    BOUND_RUNS,
    LENGTHS,
    ORIGINAL,
    POOL,
    PREDICTORS,
    REAL,
    RPM_LIMITS,
    S4,
    WEIGHTED,
    WEIGHTED_W,
    Results,
    Verdict,
    _ablation_length,
    _ablation_pool,
    _alternatives,
    _bound,
    _bounded,
    _dist_shift,
    _drr,
    _equal_when_backlogged,
    _increase,
    _light_clients_served,
    _non_backlogged,
    _overload,
    _prediction_on,
    _profile_shape,
    _profiled_real,
    _profiled_synthetic,
    _real,
    _rpm,
    _runs,
    _weighted,
)


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    claim: str  # as the paper states it
    runs: tuple[RunSpec, ...]
    judge: Callable[[Results], Verdict]
    figures: tuple[str, ...]  # figure kinds, drawn by plots.py
    source: str = ""  # section, figure and page of the paper (its summary)
    scope: str = ""  # workloads, policies, hardware and what is measured, as the paper states them
    paper: str = ""  # the paper's own number(s) and which run they come from; "" = none given
    own: bool = False  # beyond the paper's scope: our own finding, never the paper's claim failing
    brief: tuple[str, str] = ("", "")  # (claim, scope) in a few words, for the one-screen overview
    section: str = ""  # for our own findings: the report's section (default: beyond the paper's scope)

    @property
    def workloads(self) -> list[str]:
        return list(dict.fromkeys(r.workload for r in self.runs))


def _runs_of(*experiments: Experiment) -> tuple[RunSpec, ...]:
    return tuple(dict.fromkeys(r for e in experiments for r in e.runs))


def _e(name, title, claim, runs, judge, figures, source, scope, paper="", own=False, brief=("", "")) -> Experiment:
    return Experiment(name, title, claim, tuple(runs), judge, tuple(figures), source, scope, paper, own, brief)


_OVERLOAD = _e(
    "overload",
    "Overload: two clients, one sending twice as fast",
    "With constant request rates and both clients overloaded, VTC keeps their service difference small, whereas FCFS "
    "favors the higher-rate sender; VTC gives the two clients the same service level across time intervals.",
    _runs("overload", "vtc", "fcfs"),
    _overload,
    ("service_rate", "difference"),
    "§5.2, Fig. 3, p. 10",
    f"2 clients at 1.5 and 3 req/s (uniform), 256/256 tokens, 6 min; VTC vs FCFS; {A10G}; service rate per "
    "client over time, accumulated difference",
    f"service 1,340 / 1,305 per s, VTC / FCFS ({ARTIFACT})",
    brief=("equal service, bounded difference; FCFS favours the faster sender", "2 overloaded clients, 256/256"),
)
_PSL = _e(
    "poisson-short-long",
    "Poisson arrivals, short vs long requests",
    "With Poisson arrivals and unequal request lengths, VTC keeps service differences bounded while FCFS loses "
    "fairness.",
    _runs("poisson-short-long", "vtc", "fcfs"),
    _bounded("poisson-short-long"),
    ("service_rate", "difference"),
    "§5.2, p. 11",
    f"2 clients, Poisson 8 and 1.5 req/s, 64/64 vs 256/256 tokens, 10 min; VTC vs FCFS; {A10G}; largest difference "
    "between backlogged clients",
    f"service 2,035 / 2,230 per s, VTC / FCFS ({ARTIFACT})",
    brief=("bounded difference; FCFS unfair", "Poisson, 64/64 vs 256/256"),
)
_PSL2 = _e(
    "poisson-short-long-2",
    "Poisson arrivals, input-heavy vs output-heavy",
    "With Poisson arrivals and differing input/output length combinations, VTC keeps service differences bounded "
    "while FCFS loses fairness.",
    _runs("poisson-short-long-2", "vtc", "fcfs"),
    _bounded("poisson-short-long-2"),
    ("service_rate", "difference"),
    "§5.2, p. 11",
    f"2 clients, Poisson 8 and 1.5 req/s, 512/32 vs 32/512 tokens, 10 min; VTC vs FCFS; {A10G}; largest "
    "difference between backlogged clients",
    brief=("bounded difference; FCFS unfair", "Poisson, 512/32 vs 32/512"),
)
_POO = _e(
    "poisson-on-off-overload",
    "Poisson arrivals, on/off client below its share, variable lengths",
    "Under overload, a below-share client's response time stays roughly unchanged (VTC), while FCFS loses fairness.",
    _runs("poisson-on-off-overload", "vtc", "fcfs"),
    _light_clients_served("poisson-on-off-overload", ["client-0"], "client-1"),
    ("service_rate", "response_time"),
    "§5.2, p. 11",
    f"2 clients, Poisson 0.5 (on/off, 60 s periods) and 2 req/s, lengths uniform in [16, 512), 10 min; VTC vs "
    f"FCFS; {A10G}; the below-share client's service and response time",
    brief=("below-share client's response unchanged", "Poisson on/off, lengths 16–512"),
)
_PROP = _e(
    "proportional",
    "Proportional: two light clients and one heavy",
    "A client below its share is served immediately and another client uses the remaining capacity (VTC "
    "reallocates unused capacity to demand).",
    _runs("proportional", "vtc", "fcfs"),
    _light_clients_served("proportional", ["client-0", "client-1"], "client-2"),
    ("service_rate", "response_time"),
    "§5.2, pp. 10–12",
    f"3 clients at 0.25, 0.5 and 1.5 req/s, 256/256 tokens, 10 min; VTC vs FCFS; {A10G}; "
    "service and response time per client",
    brief=("below-share clients served at once, rest to the heavy one", "3 clients, 2 below share"),
)
_OOL = _e(
    "on-off-less",
    "On/off client below its share",
    "A client below its share is served immediately whenever it returns, and the other client uses the rest.",
    _runs("on-off-less", "vtc", "fcfs"),
    _light_clients_served("on-off-less", ["client-0"], "client-1"),
    ("service_rate", "response_time"),
    "§5.2, pp. 10–12",
    f"client-0 on/off (60 s periods) at 0.5 req/s, client-1 at 2 req/s, 256/256 tokens, 10 min; VTC vs FCFS; "
    f"{A10G}; service and response time",
    brief=("returning below-share client served at once", "on/off client below share"),
)
_OOO = _e(
    "on-off-overload",
    "On/off client above its share",
    "VTC keeps equal service for backlogged clients, also when one of them comes and goes.",
    _runs("on-off-overload", "vtc", "fcfs"),
    _equal_when_backlogged("on-off-overload"),
    ("service_rate", "response_time"),
    "§5.2, pp. 10–12",
    f"client-0 on/off at 2 req/s, client-1 at 3 req/s, 256/256 tokens, 10 min; VTC vs FCFS; {A10G}; service "
    "ratio while both are backlogged",
    brief=("equal service whenever both backlogged", "on/off client above share"),
)
_INC = _e(
    "increase",
    "Increasing load",
    "VTC reallocates capacity as demand changes: the steady client keeps its share as the other ramps up.",
    _runs("increase", "vtc", "fcfs"),
    _increase,
    ("service_rate", "response_time"),
    "§5.2, pp. 10–12",
    f"client-0 at 0.5 req/s, client-1 rising from 0.2 to 2 req/s, 256/256 tokens, 10 min; VTC vs FCFS; {A10G}; "
    "the steady client's service and response time in the overloaded last third",
    brief=("steady client keeps its share", "other client ramps 10×"),
)
_DIST = _e(
    "dist-shift",
    "Distribution shift: VTC vs LCF",
    "After distribution shifts, LCF carries an earlier deficit into overload; VTC does not.",
    _runs("dist-shift", "vtc", "lcf"),
    _dist_shift,
    ("service_rate", "response_time"),
    "§5.2, pp. 10–12",
    f"three phases over 15 min (client-0 on/off, then both at 1 req/s, then 0.5 and 1.5), 256/256 tokens; VTC "
    f"vs LCF; {A10G}; shares after the shift",
    brief=("LCF carries old credit into overload; VTC not", "3 phases, VTC vs LCF"),
)
_REAL = _e(
    "real",
    "Real workload (Chatbot Arena trace, 27 clients)",
    "On real traces, FCFS sharply increases response times for all clients, while VTC concentrates drastic "
    "increases among clients sending above their share.",
    _runs(REAL, "vtc", "fcfs", "lcf"),
    _real,
    ("response_time",),
    "§5.3, pp. 12–13",
    f"the Chatbot Arena trace, 27 clients, 10 min (mean prompt 136, output 256); VTC vs FCFS (LCF shown); {A10G}; "
    "response time per client over time",
    f"trace of 27 clients, mean lengths 136 / 256 ({ORIGINAL}; we run the artifact's re-sampled trace, same "
    "statistics)",
    brief=("FCFS slows all; VTC only above-share clients, drastically", "Arena trace, 27 clients"),
)
_RPM = _e(
    "rpm",
    "Request-per-minute limits vs VTC",
    "At RPM = 5 throughput is ≈ 340 output tokens/s versus ≈ 779 in VTC or FCFS; higher limits raise throughput "
    "(to 747) but weaken fairness, and response times grow and converge to FCFS.",
    _runs(REAL, "vtc", "fcfs", *(f"rpm:{n}" for n in RPM_LIMITS)),
    _rpm,
    ("throughput", "mean_response"),
    "§5.3, Fig. 14, p. 13",
    f"the Arena trace; RPM limits 5–30 vs VTC and FCFS; {A10G}; output tokens/s and response time",
    f"RPM 5: ≈ 340 vs ≈ 779 tokens/s (44%), up to 747 ({ORIGINAL}, original trace: compare the ratio)",
    brief=("RPM 5 ≈ 44% of VTC's throughput; converges to FCFS", "Arena trace, RPM 5–30"),
)
_ALT = _e(
    "alternatives",
    "Every alternative fails somewhere",
    "VTC confirms the fairness properties, while every alternative fails in at least one workload.",
    _runs_of(_OVERLOAD, _DIST, _RPM),
    _alternatives,
    (),
    "§5, p. 9",
    f"FCFS, LCF and RPM, each on the workload where the paper shows it failing (overload, dist-shift, real); {A10G}",
    brief=("every alternative fails somewhere", "FCFS, LCF, RPM"),
)
_ABL_LEN = _e(
    "ablation-length",
    "Ablation: request length",
    "With clients backlogged, longer requests increase the variation in the absolute difference of accumulated "
    "services; 512·2 and 768·2 have the same variance.",
    _runs(list(LENGTHS), "vtc"),
    _ablation_length,
    ("difference_by_workload",),
    "§5.4, Fig. 15, pp. 13–14",
    f"2 backlogged clients, uniform arrivals at different rates, 256·2 / 512·2 / 768·2 tokens, 35,000-token pool, "
    f"10 min; VTC; {S4} (the summary names no hardware); the largest backlogged difference (the amplitude of Fig. "
    "15's oscillation)",
    brief=("longer requests: larger variation; 512·2 ≈ 768·2", "35,000 pool, 2 backlogged"),
)
_ABL_POOL = _e(
    "ablation-pool",
    "Ablation: memory pool",
    "With clients backlogged, a 65,000- versus 35,000-token memory pool increases the variation in the absolute "
    "difference of accumulated services.",
    _runs(list(POOL), "vtc"),
    _ablation_pool,
    ("difference_by_workload",),
    "§5.4, Fig. 15, pp. 13–14",
    f"2 backlogged clients, 512·2 tokens, pools of 35,000 and 65,000 tokens, 10 min; VTC; {S4}; the largest "
    "backlogged difference",
    brief=("65,000 pool: larger variation than 35,000", "512·2, 2 backlogged"),
)
_WEIGHTED = _e(
    "weighted",
    "Weighted VTC (weights 1:2:3:4)",
    "Weights 1:2:3:4 yield a service distribution closely adhering to those ratios under weighted VTC, while "
    "standard VTC gives the four overloaded clients comparable service.",
    (WEIGHTED, RunSpec(WEIGHTED_W, "vtc", weighted=False, label="vtc (no weights)")),
    _weighted,
    ("client_service",),
    "§B.1, Fig. 16, p. 20",
    f"4 overloaded clients, 256/256 tokens, 10 min; weighted vs plain VTC; {A10G}; service per client",
    '1:2:3:4 ("closely adhering"; no numbers given)',
    brief=("weighted VTC 1:2:3:4; plain VTC equal", "4 overloaded clients, 10 min"),
)
_PROFILE = _e(
    "profile-shape",
    "The A10G profile: decode vs prefill",
    "Decode time for all-output-token scenarios is about 2 to 5 times prefill time for all-input-token scenarios "
    "with the same total token count.",
    (),
    _profile_shape,
    (),
    "§B.2, Fig. 17, pp. 20–21",
    "Llama-2-7b on an A10G, largest batch that fills the 10,000-token pool, per-request times; our profiled "
    "forward model of the same profile (the preset without the server overhead)",
    "about 2–5×",
    brief=("decode ≈ 2–5× prefill at equal tokens", "A10G profile"),
)
_PROFILED = _e(
    "profiled-cost",
    "Real trace with the profiled cost function (VTC, LCF, FCFS)",
    "With a profiled cost function, VTC maintains low response times for low-rate clients, unlike the baselines "
    "except LCF, which gives consistently high-rate clients excessively high response times.",
    (
        RunSpec(REAL, "vtc", cost="profiled", label="vtc (profiled cost)"),
        RunSpec(REAL, "lcf", cost="profiled", label="lcf (profiled cost)"),
        RunSpec(REAL, "fcfs", cost="profiled", label="fcfs (profiled cost)"),
    ),
    _profiled_real,
    ("response_time",),
    "§B.2, pp. 20–21; Fig. 18, p. 22",
    f"the Arena trace, 27 clients, 10 min; VTC and LCF charging the profiled cost, FCFS; {A10G}; response time "
    "per client over time",
    brief=("VTC keeps low-rate clients fast; LCF punishes steady heavy ones", "Arena trace, profiled cost"),
)
_PREDICT = _e(
    "length-prediction",
    "VTC with output-length prediction (2 and 8 backlogged clients)",
    "In synthetic workloads where all clients are overloaded, length prediction reduces service discrepancies "
    "compared with standard VTC, even with output-length predictions that err by up to 50%.",
    _runs(list(BACKLOGGED), "vtc", *PREDICTORS),
    _prediction_on(BACKLOGGED),
    ("difference_by_policy",),
    "§B.3, p. 21; Fig. 19, p. 22",
    f"2 and 8 continuously backlogged clients, 256/256 tokens, 10 min; VTC vs VTC with oracle and ±50% "
    f"predictions (moving average shown too); {A10G}; maximum accumulated service difference",
    brief=("prediction lowers the discrepancy, also at ±50%", "2 and 8 backlogged clients, 10 min"),
)
_BOUND = _e(
    "bound",
    "Theorem 4.4: the bound on the service difference",
    "For backlogged clients VTC's service difference is bounded, tight within a factor of 2: with w_q > w_p the "
    "upper bound is 2·w_q·M (2U = 2·max(w_p·L_in, w_q·M)).",
    BOUND_RUNS,
    _bound,
    ("bound",),
    "§4.1.1, p. 7",
    "any workload, work-conserving scheduling without preemption; M = the KV pool; measured on 11 of our runs",
    "bound 2U (theorem)",
    brief=("backlogged difference ≤ 2U", "11 of our runs"),
)
_NONBACK = _e(
    "non-backlogged",
    "Theorems 4.11 and 4.13: clients below their share",
    "For non-backlogged clients, VTC bounds a new request's response time independently of other clients' request "
    "rates, and dispatches all requests of a client whose rate stays below its share.",
    _runs([w for w, _ in dict.fromkeys(BELOW_SHARE)] + ["increase"], "vtc"),
    _non_backlogged,
    (),
    "§4.1.2, p. 8; App. A, pp. 19–20",
    f"the synthetic runs in which a client asks below its share (proportional, on-off-less, "
    f"poisson-on-off-overload) and `increase` (the other client's rate rises 10×); VTC; {A10G}",
    brief=("below-share clients all dispatched; response independent of others", "4 below-share clients; increase"),
)
_DRR = _e(
    "drr",
    "Adapted DRR equals VTC",
    "The adapted deficit round robin with a quantum smaller than one prompt token's cost functions like VTC.",
    _runs("overload-multi", "vtc", "drr:1"),
    _drr,
    (),
    "§C.2, pp. 22–24",
    f"our overload-multi (8 backlogged clients, 256/256 tokens, 6 min): DRR with quantum 1 vs VTC; {A10G}; "
    "service per client",
    brief=("DRR with a tiny quantum = VTC", "8 backlogged clients"),
)

EXPERIMENTS: tuple[Experiment, ...] = (
    _OVERLOAD,
    _PSL,
    _PSL2,
    _POO,
    _PROP,
    _OOL,
    _OOO,
    _INC,
    _DIST,
    _ALT,
    _REAL,
    _RPM,
    _ABL_LEN,
    _ABL_POOL,
    _WEIGHTED,
    _PROFILE,
    _PROFILED,
    _PREDICT,
    _BOUND,
    _NONBACK,
    _DRR,
)

# Beyond the paper's scope: our own findings, reported apart from the paper's claims.
OWN_FINDINGS: tuple[Experiment, ...] = (
    _e(
        "prediction-real",
        "Length prediction on the real trace",
        "Does prediction also lower the discrepancy on the Arena trace, where clients are not all backlogged?",
        _runs(REAL, "vtc", *PREDICTORS),
        _prediction_on((REAL,)),
        ("difference_by_policy",),
        "beyond §B.3 (the paper: synthetic overloaded workloads; §4.4: effectiveness depends on the workload)",
        f"the Arena trace; VTC vs oracle, ±50% and moving-average prediction; {A10G}; largest backlogged difference",
        own=True,
        brief=("does prediction help on the real trace?", "Arena trace"),
    ),
    _e(
        "profiled-synthetic",
        "The profiled cost on a synthetic overload",
        "Does VTC with the profiled cost also equalise service on a synthetic overload of 8 clients?",
        tuple(RunSpec("overload-multi", p, cost="profiled", label=f"{p} (profiled cost)") for p in ("vtc", "fcfs")),
        _profiled_synthetic,
        ("service_rate",),
        "beyond §B.2 (the paper: the real trace)",
        f"overload-multi, 8 clients; VTC and FCFS measured by the profiled cost; {A10G}; service per client",
        own=True,
        brief=("does the profiled cost equalise a synthetic overload?", "8 overloaded clients"),
    ),
)


def _section(section: str, source: str, figure: str, rows) -> tuple[Experiment, ...]:
    """Our own findings of one report section: (name, title, question, runs, rule, scope, brief) per finding; each
    drawn as `figure` (none if "")."""
    return tuple(
        Experiment(
            name,
            title,
            question,
            tuple(specs),
            rule,
            (figure,) if figure else (),
            source,
            scope,
            own=True,
            brief=brief,
            section=section,
        )
        for name, title, question, specs, rule, scope, brief in rows
    )


OWN_FINDINGS += _section(
    trees.SECTION,
    "beyond the paper (its clients are a flat list; fairserve's tenant tree and priority classes)",
    "group_service",
    (
        (name, title, question, specs, rule, trees.SCOPE, brief)
        for name, title, question, specs, rule, brief in trees.EXPERIMENTS
    ),
)
OWN_FINDINGS += _section(preemption.SECTION, preemption.SOURCE, "preemption_curve", preemption.EXPERIMENTS)
OWN_FINDINGS += _section(locality.SECTION, locality.SOURCE, "locality_curve", locality.EXPERIMENTS[:1])
OWN_FINDINGS += _section(locality.SECTION, locality.SOURCE, "", locality.EXPERIMENTS[1:])
for _row, _figure in zip(fleet.EXPERIMENTS, fleet.FIGURES, strict=True):
    OWN_FINDINGS += _section(fleet.SECTION, fleet.SOURCE, _figure, (_row,))
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
