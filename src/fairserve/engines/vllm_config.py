"""The vLLM plugin's configuration: the FAIRSERVE_* environment of the engine process (vLLM builds the scheduler
itself, so there is no other way in), read once when the scheduler is constructed. docs/vllm.md has the table."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..core import Policy, describe, make_policy, parse_priorities, parse_weights
from ..core.registry import PolicySpec, parse_spec
from .queue import CLIENT_ARG
from .vllm_tenants import DEFAULT_SOURCES, parse_sources

LORA_WAIT_STEPS = 32  # default K of the LoRA-slot rule (engines/vllm_lora.py)


@dataclass(frozen=True)
class VTCConfig:
    policy: str = "vtc"
    weights: dict[str, float] | None = None  # by node path: a tenant or a group
    w_p: float = 1.0
    w_q: float = 2.0
    cost: str | None = None
    client_key: str = CLIENT_ARG
    priorities: dict[str, int] | None = None  # by node path
    allowed: dict[str, frozenset[int]] | None = None  # by tenant: the priorities its requests may name
    tenant_from: tuple[str, ...] = DEFAULT_SOURCES  # where a request's tenant comes from, first found wins
    lora_wait: int | None = LORA_WAIT_STEPS  # None: the LoRA-slot rule is off
    w_cached: float | None = None  # a prompt token served from vLLM's prefix cache (None: w_p, the paper's charge)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> VTCConfig:
        """Read the FAIRSERVE_* variables. ValueError names the bad one."""
        env = os.environ if env is None else env

        def get(name: str) -> str:
            return env.get(name, "").strip()

        config = cls(
            policy=get("FAIRSERVE_POLICY") or "vtc",
            weights=parse_weights(get("FAIRSERVE_WEIGHTS"), "FAIRSERVE_WEIGHTS"),
            w_p=_number(env, "FAIRSERVE_WP", 1.0),
            w_q=_number(env, "FAIRSERVE_WQ", 2.0),
            w_cached=_number(env, "FAIRSERVE_W_CACHED", 0.0) if get("FAIRSERVE_W_CACHED") else None,
            cost=get("FAIRSERVE_COST") or None,
            client_key=get("FAIRSERVE_CLIENT_KEY") or CLIENT_ARG,
            priorities=parse_priorities(get("FAIRSERVE_PRIORITIES"), "FAIRSERVE_PRIORITIES"),
            allowed=parse_allowed(get("FAIRSERVE_ALLOWED_PRIORITIES"), "FAIRSERVE_ALLOWED_PRIORITIES"),
            tenant_from=parse_sources(get("FAIRSERVE_TENANT_FROM"), "FAIRSERVE_TENANT_FROM"),
            lora_wait=_lora_wait(get("FAIRSERVE_LORA_WAIT_STEPS")),
        )
        spec = config.spec()  # NOTE: parsed here, so a bad spec or option fails when the engine starts
        config.preempt_options()
        if config.uses_priorities:
            entry = spec.entry
            if not entry.capabilities.tree:
                raise ValueError(
                    f"FAIRSERVE_PRIORITIES / FAIRSERVE_ALLOWED_PRIORITIES: policy {config.policy!r} does not order "
                    "by priority; use vtc (or weighted-vtc, lcf, vtc-predict)"
                )
        return config

    @property
    def uses_priorities(self) -> bool:
        """Whether any request can run at a priority other than 0."""
        return bool(self.priorities) or bool(self.allowed)

    def spec(self) -> PolicySpec:
        """FAIRSERVE_POLICY parsed (`core.registry.parse_spec`), its engine options included (`preempt=500`)."""
        try:
            spec = parse_spec(self.policy, engine_options=True, prefix_cache=True)
        except ValueError as e:
            raise ValueError(f"FAIRSERVE_POLICY: {e}") from None
        return spec

    @property
    def uses_prefix_cache(self) -> bool:
        """Whether the policy orders by vLLM's prefix cache (`lpm`, `dlpm`): the engine must have it on."""
        return self.spec().entry.capabilities.uses_prefix_cache

    def preempt_options(self) -> PreemptOptions:
        spec = self.spec()
        try:
            return PreemptOptions.from_options(spec.options, spec.entry.capabilities.shares_counters, spec.name)
        except ValueError as e:
            raise ValueError(f"FAIRSERVE_POLICY={self.policy!r}: {e}") from None

    def make_policy(self) -> Policy:
        spec = self.spec()
        if spec.entry.capabilities.rejects_at_arrival:
            raise ValueError(
                f"FAIRSERVE_POLICY={self.policy!r} rejects requests, which vLLM's scheduler cannot do; "
                f"use a policy that only orders ({describe(engine=True, prefix_cache=True)})"
            )
        return make_policy(spec, cost=self.cost, w_p=self.w_p, w_q=self.w_q, w_cached=self.w_cached)

    def check_engine(self, scheduling_policy: str) -> None:
        """ValueError if vLLM's `--scheduling-policy` does not fit: with priority levels vLLM must pick its
        memory-preemption victims by priority (`priority`), as under `fcfs` it preempts the request admitted last,
        which is a high-priority one more often than not."""
        if self.uses_priorities and scheduling_policy != "priority":
            raise ValueError(
                "FAIRSERVE_PRIORITIES / FAIRSERVE_ALLOWED_PRIORITIES need vLLM's --scheduling-policy priority "
                f"(LLM(..., scheduling_policy='priority')), got {scheduling_policy!r}: under 'fcfs' vLLM preempts "
                "the request it admitted last, which is a high-priority one more often than not"
            )


def parse_allowed(text: str | None, source: str) -> dict[str, frozenset[int]] | None:
    """`tenant=0|1,other=2` (each tenant's priorities its requests may name); None for no text."""
    if not text:
        return None
    out: dict[str, frozenset[int]] = {}
    for part in text.split(","):
        tenant, _, values = (x.strip() for x in part.partition("="))
        try:
            levels = frozenset(int(v) for v in values.split("|"))
        except ValueError:
            levels = frozenset()
        if not tenant or not levels:
            raise ValueError(f"bad {source} entry {part!r}: expected TENANT=PRIORITY|PRIORITY|... (integers)")
        out[tenant] = levels
    return out


def _lora_wait(text: str) -> int | None:
    if not text:
        return LORA_WAIT_STEPS
    if text.lower() == "off":
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"FAIRSERVE_LORA_WAIT_STEPS must be a number of engine steps >= 0, or off; got {text!r}")
    return value


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"{name} must be a number >= 0, got {text!r}")
    return value


@dataclass(frozen=True)
class PreemptOptions:
    """The spec's options for the engine: `victim=counter|vllm`, `preempt-priority=1`, `preempt=DELTA`,
    `preempt-max=K`."""

    victim_by_counter: bool = True
    priority: bool = False
    delta: float | None = None
    preempt_max: int = 1

    @classmethod
    def from_options(cls, options: Mapping[str, float | int], counters: bool, policy: str) -> PreemptOptions:
        """From a parsed spec's options (`core.registry.parse_spec`); `counters`: the policy keeps them.
        ValueError for an option the engine cannot honour."""
        if "running-cap" in options:
            raise ValueError("running-cap= is the simulator's: the vLLM plugin has no per-tenant cap")
        by_counter = bool(options.get("victim", 1 if counters else 0))
        if by_counter and not counters:
            raise ValueError(f"victim=counter compares tenants' counters: policy {policy!r} keeps none")
        delta = options.get("preempt")
        return cls(
            victim_by_counter=by_counter,
            priority=bool(options.get("preempt-priority", 0)),
            delta=None if delta is None else float(delta),
            preempt_max=int(options.get("preempt-max", 1)),
        )

    @property
    def admits(self) -> bool:
        """Whether a waiting request may preempt running ones."""
        return self.priority or self.delta is not None

    def describe(self) -> str:
        parts = [f"victim={'counter' if self.victim_by_counter else 'vllm'}"]
        if self.priority:
            parts.append("preempt-priority=1")
        if self.delta is not None:
            parts.append(f"preempt={self.delta:g}")
        if self.admits:
            parts.append(f"preempt-max={self.preempt_max}")
        return ":".join(parts)
