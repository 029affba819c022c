"""The simulated continuous-batching engine and its latency models."""

from __future__ import annotations

from dataclasses import replace

from ..core import Ledger, Policy, make_policy
from ..core.registry import check_policy, split_options
from ..workloads import DEFAULT_KV_TOKENS, Workload
from .cached import hit_rate, hit_rates
from .engine import SimEngine
from .latency import (
    DEFAULT_LATENCY_PROFILE,
    LATENCY_MODELS,
    LatencyModel,
    default_kv_tokens,
    get_latency_model,
    server_tokens,
)
from .prefix_cache import DEFAULT_BLOCK_TOKENS
from .requests import EngineConfig, Mode, SimRequest, SimResult

__all__ = [
    "EngineConfig",
    "SimEngine",
    "SimRequest",
    "SimResult",
    "LatencyModel",
    "LATENCY_MODELS",
    "get_latency_model",
    "hit_rate",
    "hit_rates",
    "engine_config",
    "simulate",
]


def engine_config(
    profile: str = DEFAULT_LATENCY_PROFILE, kv_tokens: int | None = None, mode: Mode = "reserve"
) -> EngineConfig:
    """The engine of a named preset: its pool (unless `kv_tokens` is given) and its server's token-level effects
    (`latency.SERVER_TOKENS`: longer tokenized prompts, the per-client admission reserve)."""
    server = server_tokens(profile)
    return EngineConfig(
        kv_tokens=kv_tokens if kv_tokens is not None else default_kv_tokens(profile),
        mode=mode,
        prompt_extra_tokens=server.prompt_extra_tokens,
        reserve_per_client_tokens=server.reserve_per_client_tokens,
    )


def simulate(
    workload: Workload,
    policy: str | Policy = "vtc",
    *,
    latency: str | LatencyModel | None = None,
    kv_tokens: int | None = None,
    mode: Mode = "reserve",
    until_s: float | None = None,
    drain: bool = False,
    weights: dict[str, float] | None = None,
    priorities: dict[str, int] | None = None,
    cost=None,
    w_p: float = 1.0,
    w_q: float = 2.0,
    seed: int = 0,
    prefix_cache: bool = False,
    w_cached: float | None = None,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
) -> SimResult:
    """Run `workload` under `policy` on the simulated engine. Defaults follow the workload (its pool, its hardware
    profile, its weights and priorities, by tenant or group path) and stop at its duration; `drain=True` runs until
    every request is done. A preset name brings its server's token-level effects; a `LatencyModel` object runs with
    none. A policy spec may end in engine options (`vtc:preempt=DELTA`, `:running-cap=TOKENS`; sim/preempt.py).
    `prefix_cache` (paged mode) shares the KV blocks of common prompt prefixes (`Arrival.prefix`), `block_tokens` a
    block; policies that order by cached prefix (`lpm`, `dlpm`) need it. `w_cached` prices the prompt tokens served
    from the cache (linear cost; None: w_p, as every other prompt token)."""
    options: dict[str, float | int] = {}
    if isinstance(policy, str):
        check_policy(policy, engine_options=True, prefix_cache=prefix_cache)  # NOTE: preempt= needs counters
        policy, options = split_options(policy)
    name = latency if latency is not None else (workload.latency_profile or DEFAULT_LATENCY_PROFILE)
    model = get_latency_model(name) if isinstance(name, str) else name
    kv = kv_tokens if kv_tokens is not None else workload.kv_tokens
    if isinstance(name, str):
        config = engine_config(name, kv, mode)
    else:
        config = EngineConfig(kv_tokens=kv if kv is not None else DEFAULT_KV_TOKENS, mode=mode)
    config = config.with_options(options)
    if prefix_cache:
        config = replace(config, prefix_cache=True, block_tokens=block_tokens)
    if isinstance(policy, str):
        policy = make_policy(policy, cost=cost, w_p=w_p, w_q=w_q, seed=seed, w_cached=w_cached)
    ledger = Ledger(
        policy,
        weights=weights if weights is not None else workload.weights,
        priorities=priorities if priorities is not None else workload.priorities,
    )
    engine = SimEngine(ledger, model, config)
    horizon = None if drain else (until_s if until_s is not None else workload.duration_s)
    return engine.run(workload.arrivals, until_s=horizon)
