"""One simulation of the reproduction suite: what to run, and what comes back (picklable, for worker processes)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..core import theorem_bound
from ..core.account import SEP
from ..core.cost import CostFunction, make_cost
from ..metrics import backlogged, response_times, service_curves, service_rates, summarize, time_grid
from ..records import RequestRecord
from ..sim import SimOptions, simulate
from ..sim.requests import Mode
from ..workloads import PREFIX_WORKLOADS, Arrival, Workload, get_workload, load_trace
from ..workloads.flood import FLOOD

REAL = "real"
FLEET = (
    "engines",
    "dispatch",
    "autoscale",
    "scale_wait_s",
    "scale_delay_s",
)  # a fleet's options: RunSpec's and SimOptions'
# --quick halves durations (at least 240 s), except where the claim needs the whole run: `increase` only overloads
# the server in its last third, `dist-shift` needs the phase after the shift, and `real` is a fixed trace.
QUICK_DURATION_S = {"increase": 600.0, "dist-shift": 600.0, REAL: 600.0}


@dataclass(frozen=True)
class RunSpec:
    workload: str
    policy: str  # a policy spec, engine options included (`vtc:preempt=1000`, `vtc:running-cap=5000`)
    cost: str = "linear"  # "linear" or "profiled"
    weighted: bool = True  # use the workload's weights (False: plain VTC on a weighted workload)
    label: str = ""  # shown in figures and tables; default: the policy
    flat: bool = False  # the tenant tree flattened: every tenant at the top (`org/user` -> `org.user`), no groups
    mode: Mode = "reserve"  # the engine's admission: the paper's conservative reserve, or vLLM-like paged
    kv_tokens: int | None = None  # the KV pool; None: the workload's
    prefix_cache: bool = False  # paged mode: the prefix cache (sim/cached.py)
    w_cached: float | None = None  # the linear cost's price of a prompt token served from the cache; None: w_p
    # a fleet (sim/fleet.py, docs/fleet.md); all None: the one engine, no dispatcher
    engines: int | None = None  # engines behind the gateway's dispatch (at start, with `autoscale`)
    dispatch: str | None = None  # least_loaded (None) or shard:K
    autoscale: str | None = None  # "MIN:MAX"
    scale_wait_s: float | None = None  # None: SimOptions' default
    scale_delay_s: float | None = None  # None: SimOptions' default
    without: str | None = None  # a tenant left out of the workload: the same arrivals without its requests

    @property
    def name(self) -> str:
        """The label, or the policy with what sets the run apart: `vtc (paged)`, `vtc (8 engines, shard:2)`."""
        if self.label:
            return self.label
        parts: list[str] = [] if self.mode == "reserve" else [self.mode]
        if self.engines is not None:
            parts.append(f"{self.engines} engine{'s' if self.engines != 1 else ''}")
        parts += [p for p in (self.dispatch, self.autoscale and f"autoscale {self.autoscale}") if p]
        if self.scale_wait_s is not None:
            parts.append(f"wait {self.scale_wait_s:g} s")
        if self.scale_delay_s is not None:
            parts.append(f"start-up {self.scale_delay_s:g} s")
        if self.without is not None:
            parts.append(f"without {self.without}")
        return f"{self.policy} ({', '.join(parts)})" if parts else self.policy

    def options(self) -> SimOptions:
        """The run's engine options, as `fairserve simulate` and `sweep` take them (a fleet's where set)."""
        engine = SimOptions(
            policy=self.policy,
            cost=self.cost,
            mode=self.mode,
            kv_tokens=self.kv_tokens,
            prefix_cache=self.prefix_cache,
            w_cached=self.w_cached,
        )
        fleet = {k: getattr(self, k) for k in FLEET if getattr(self, k) is not None}
        return replace(engine, **fleet) if fleet else engine  # NOTE: SimOptions' defaults for those not set


@dataclass
class RunOutput:
    spec: RunSpec
    records: list[RequestRecord]
    duration_s: float
    kv_tokens: int
    busy_s: float
    weights: dict[str, float] | None
    max_prompt: int
    wall_s: float = 0.0
    preemptions: int = 0  # all of them (paged mode also evicts when the pool runs out)
    fair_preemptions: int = 0  # of those, for fairness (`preempt=DELTA`)
    lost: int = 0  # requests neither finished nor still queued or running at the horizon (rejected)
    cached_tokens: list[int] | None = None  # with the prefix cache: per record, prompt tokens served from it
    # a fleet's (sim/fleet.py `FleetReport`), as plain data: its cost, and (time, engines up or starting) at each change
    engine_seconds: float | None = None
    counts: list[tuple[float, int]] | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def cost(self) -> CostFunction:
        return make_cost(self.spec.cost, w_cached=self.spec.w_cached)

    @property
    def times(self) -> np.ndarray:
        return self._memo("times", lambda: time_grid(self.duration_s))

    @property
    def curves(self) -> dict[str, np.ndarray]:
        return self._memo("curves", lambda: service_curves(self.records, self.times, cost=self.cost))

    @property
    def busy(self) -> dict[str, np.ndarray]:
        return self._memo("busy", lambda: backlogged(self.records, self.times))

    @property
    def rates(self) -> dict[str, np.ndarray]:
        return self._memo("rates", lambda: service_rates(self.curves, self.times))

    @property
    def response(self) -> dict[str, np.ndarray]:
        return self._memo("response", lambda: response_times(self.records, self.times))

    @property
    def summary(self):
        return self._memo(
            "summary", lambda: summarize(self.records, self.duration_s, weights=self.weights, cost=self.cost)
        )

    @property
    def engines(self) -> int:
        """The most engines up or starting at once (1 without a fleet)."""
        return max((n for _, n in self.counts), default=1) if self.counts else 1

    @property
    def bound(self) -> float:
        """Theorem 4.4's 2U = 2 max(w_p L_in, w_q M) for this run's pool and prompts (linear cost); for a fleet, M
        is its engines' pools together (docs/fleet.md, "The fleet's bound"), at the most engines it had at once."""
        return theorem_bound(self.max_prompt, self.kv_tokens * self.engines)

    def _memo(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]


def split_name(name: str) -> tuple[str, float | None]:
    """ "overload@600s" -> ("overload", 600.0): a named workload run for a duration other than its default."""
    base, at, dur = name.partition("@")
    return (base, float(dur.removesuffix("s"))) if at else (base, None)


def load_workload(name: str, quick: bool, trace: str | None) -> Workload:
    base, duration = split_name(name)
    if base == REAL and trace:
        w = load_trace(trace)
        return Workload(name=REAL, arrivals=w.arrivals, duration_s=max(w.duration_s, 1.0))
    w = get_workload(base, duration_s=duration)
    if quick:
        w = get_workload(base, duration_s=quick_duration(w.duration_s, base))
    return w


def quick_duration(full_s: float, name: str) -> float:
    if name in PREFIX_WORKLOADS or name == FLOOD:
        return full_s  # NOTE: sized short already (reproduce/locality.py, workloads/flood.py)
    return QUICK_DURATION_S.get(name, max(240.0, full_s / 2))


def run(spec: RunSpec, quick: bool = False, trace: str | None = None) -> RunOutput:
    import time

    workload = load_workload(spec.workload, quick, trace)
    if spec.flat:
        flat = [
            Arrival(a.arrival_s, a.client.replace(SEP, "."), a.prompt_tokens, a.output_tokens)
            for a in workload.arrivals
        ]
        workload = Workload(
            workload.name, flat, workload.duration_s, None, workload.kv_tokens, workload.latency_profile
        )
    if spec.without is not None:
        workload = replace(workload, arrivals=[a for a in workload.arrivals if a.client != spec.without])
    weights = workload.weights if spec.weighted else {}
    start = time.perf_counter()
    result = simulate(workload, spec.options(), weights=weights)
    return RunOutput(
        spec=spec,
        records=result.records,
        duration_s=workload.duration_s,
        kv_tokens=result.config.kv_tokens,
        busy_s=result.busy_s,
        weights=weights or None,
        max_prompt=max(a.prompt_tokens for a in workload.arrivals),
        wall_s=time.perf_counter() - start,
        preemptions=result.preemptions,
        fair_preemptions=result.fair_preemptions,
        lost=len(workload.arrivals) - sum(r.status in ("finished", "unfinished") for r in result.records),
        cached_tokens=result.cached_tokens,
        engine_seconds=result.fleet.engine_seconds if result.fleet else None,
        counts=list(result.fleet.counts) if result.fleet else None,
    )


def trace_available(trace: str | None) -> bool:
    from ..workloads import find_arena_trace

    return bool(trace and Path(trace).is_file()) or find_arena_trace() is not None
