"""The simulated continuous-batching engine and its latency models."""
from __future__ import annotations

from ..core import Policy, make_policy
from ..workloads import Workload
from .engine import EngineConfig, SimEngine, SimRequest, SimResult
from .latency import DEFAULT_LATENCY_MODEL, LATENCY_MODELS, LatencyModel, default_kv_tokens, get_latency_model

__all__ = ["EngineConfig", "SimEngine", "SimRequest", "SimResult", "LatencyModel", "LATENCY_MODELS",
           "get_latency_model", "simulate"]


def simulate(workload: Workload, policy: str | Policy = "vtc", *, latency: str | LatencyModel | None = None,
             kv_tokens: int | None = None, mode: str = "reserve", until_s: float | None = None, drain: bool = False,
             weights: dict[str, float] | None = None, cost=None, w_p: float = 1.0, w_q: float = 2.0,
             seed: int = 0) -> SimResult:
    """Run `workload` under `policy` on the simulated engine. Defaults follow the workload (its pool, its hardware
    profile, its weights) and stop at its duration; `drain=True` runs until every request is done."""
    name = latency if latency is not None else (workload.latency_profile or DEFAULT_LATENCY_MODEL)
    model = get_latency_model(name) if isinstance(name, str) else name
    if kv_tokens is None:
        kv_tokens = workload.kv_tokens or (default_kv_tokens(name) if isinstance(name, str) else 10_000)
    if isinstance(policy, str):
        policy = make_policy(policy, weights=weights if weights is not None else workload.weights,
                             cost=cost, w_p=w_p, w_q=w_q, seed=seed)
    engine = SimEngine(policy, model, EngineConfig(kv_tokens=kv_tokens, mode=mode))
    horizon = None if drain else (until_s if until_s is not None else workload.duration_s)
    return engine.run(workload.arrivals, until_s=horizon)
