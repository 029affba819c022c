"""The simulated continuous-batching engine and its latency models."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

from ..core import Ledger, Policy, make_policy
from ..workloads import DEFAULT_KV_TOKENS, Workload
from .cached import hit_rate, hit_rates
from .engine import SimEngine
from .engine_profile import is_profile_path, load_engine_profile
from .latency import (
    DEFAULT_LATENCY_PROFILE,
    LATENCY_MODELS,
    LatencyModel,
    default_kv_tokens,
    get_latency_model,
    server_tokens,
)
from .options import LEGACY, SimOptions
from .prefix_cache import DEFAULT_BLOCK_TOKENS
from .requests import MODES, EngineConfig, Mode, SimRequest, SimResult
from .vllm_steps import VllmEngine

__all__ = [
    "EngineConfig",
    "SimEngine",
    "SimOptions",
    "VllmEngine",
    "SimRequest",
    "SimResult",
    "LatencyModel",
    "LATENCY_MODELS",
    "MODES",
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
    (`latency.SERVER_TOKENS`: longer tokenized prompts, the per-client admission reserve). A profile file's engine
    brings its limits too: its batch cap (`max_num_seqs`), its prefill budget or token budget per step
    (`max_batched_tokens`), its KV block size and whether it chunks prefills (for `mode="vllm"`)."""
    if is_profile_path(profile):
        measured = load_engine_profile(profile)
        settings = measured.engine.get("settings")
        chunked = settings.get("chunked_prefill") if isinstance(settings, dict) else None
        return EngineConfig(
            kv_tokens=kv_tokens if kv_tokens is not None else measured.kv_tokens,
            mode=mode,
            batch_max_tokens=measured.max_batched_tokens,
            running_max=measured.max_num_seqs or EngineConfig.running_max,
            block_tokens=measured.block_tokens or DEFAULT_BLOCK_TOKENS,
            chunked_prefill=chunked if isinstance(chunked, bool) else True,
        )
    server = server_tokens(profile)
    return EngineConfig(
        kv_tokens=kv_tokens if kv_tokens is not None else default_kv_tokens(profile),
        mode=mode,
        prompt_extra_tokens=server.prompt_extra_tokens,
        reserve_per_client_tokens=server.reserve_per_client_tokens,
    )


def simulate(
    workload: Workload,
    options: SimOptions | str | Policy | None = None,
    *,
    weights: dict[str, float] | None = None,
    priorities: dict[str, int] | None = None,
    **legacy: Any,
) -> SimResult:
    """Run `workload` on the simulated engine as `options` say (`SimOptions`; default: VTC). Defaults follow the
    workload (its pool, its hardware profile, its weights and priorities, by tenant or group path) and stop at its
    duration (`drain=True`: until every request is done). A preset name brings its server's token-level effects; a
    `LatencyModel` object runs with none. A policy spec may end in engine options (`vtc:preempt=DELTA`,
    `:running-cap=TOKENS`; sim/preempt.py). `prefix_cache` (paged mode) shares the KV blocks of common prompt
    prefixes (`Arrival.prefix`), `block_tokens` a block; policies that order by cached prefix (`lpm`, `dlpm`) need
    it. `w_cached` prices the prompt tokens served from the cache (linear cost; None: w_p).

    Also callable as before the options object: `simulate(workload, "vtc", kv_tokens=..., mode=..., ...)`, the
    keywords being `SimOptions`'s fields."""
    if not isinstance(options, SimOptions):
        unknown = sorted(set(legacy) - LEGACY)
        if unknown:
            raise TypeError(f"simulate() got unexpected keyword arguments: {', '.join(unknown)}")
        options = SimOptions(policy="vtc" if options is None else options, **legacy)
    elif legacy:
        raise TypeError(f"simulate() takes the options object or keywords, not both ({', '.join(sorted(legacy))})")
    spec = options.check().spec
    name = options.latency if options.latency is not None else (workload.latency_profile or DEFAULT_LATENCY_PROFILE)
    model = get_latency_model(name) if isinstance(name, str) else name
    kv = options.kv_tokens if options.kv_tokens is not None else workload.kv_tokens
    if isinstance(name, str):
        config = engine_config(name, kv, options.mode)
    else:
        config = EngineConfig(kv_tokens=kv if kv is not None else DEFAULT_KV_TOKENS, mode=options.mode)
    if spec is not None:
        config = config.with_options(spec.options)
    if options.prefix_cache:
        config = replace(config, prefix_cache=True, block_tokens=options.block_tokens)
    policy: Policy = (
        cast(Policy, options.policy)  # NOTE: a built policy (`spec` is None only then)
        if spec is None
        else make_policy(
            spec, cost=options.cost, w_p=options.w_p, w_q=options.w_q, seed=options.seed, w_cached=options.w_cached
        )
    )
    ledger = Ledger(
        policy,
        weights=weights if weights is not None else workload.weights,
        priorities=priorities if priorities is not None else workload.priorities,
    )
    horizon = None if options.drain else (options.until_s if options.until_s is not None else workload.duration_s)
    if options.fleet:
        from .fleet import Fleet

        return Fleet(ledger, model, config, *options.fleet_parts()).run(workload.arrivals, until_s=horizon)
    if config.mode == "vllm":
        return VllmEngine(ledger, model, config).run(workload.arrivals, until_s=horizon)
    return SimEngine(ledger, model, config).run(workload.arrivals, until_s=horizon)
