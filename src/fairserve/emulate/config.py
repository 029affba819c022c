"""The emulator's settings, and the per-request fault draw."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from enum import StrEnum

from ..core import check_policy
from ..sim.latency import DEFAULT_LATENCY_PROFILE, get_latency_model
from ..sim.requests import MODES
from ..workloads import DEFAULT_KV_TOKENS

# NOTE: the vllm mode runs offline only (sim/vllm_steps.py has no online API)
ENGINE_MODES = tuple(m for m in MODES if m != "vllm")
DEFAULT_MODEL = "fairserve-emulated"


@dataclass(frozen=True)
class EmulatorConfig:
    # NOTE: no models named: any `model` is accepted and echoed (a test bed for one-model gateways)
    models: tuple[str, ...] = ()  # the model ids served; requests for others get 404 model_not_found
    loras: tuple[str, ...] = ()  # LoRA adapters served on the first model (listed with it as `parent`)
    time_scale: float = 1.0  # simulated seconds per wall second (10 = ten times faster)
    profile: str = DEFAULT_LATENCY_PROFILE  # latency profile, as `fairserve.sim.get_latency_model` names it
    kv_tokens: int = DEFAULT_KV_TOKENS  # KV-cache pool of the simulated engine
    engine_mode: str = "reserve"  # "reserve" | "paged"
    policy: str = "fcfs"  # the engine's own scheduler (engine options too: vtc:preempt=500); fairness is the gateway's
    error_rate: float = 0.0  # fraction of requests answered 500 before any work
    extra_latency_s: float = 0.0  # wall seconds every request waits before it reaches the engine
    drop_rate: float = 0.0  # fraction whose connection is closed after half the tokens
    hang_rate: float = 0.0  # fraction never answered until the client disconnects
    seed: int = 0  # seeds the fault draw
    prefix_cache: bool = False  # paged mode: KV blocks shared by prompts with a common prefix (the simulator's cache)
    block_tokens: int = 16  # tokens per KV block of the prefix cache

    def __post_init__(self) -> None:
        for name in (*self.models, *self.loras):
            if not isinstance(name, str) or not name.strip():
                raise ValueError(f"model names must be non-empty strings, got {name!r}")
        if self.loras and not self.models:
            raise ValueError("LoRA adapters need a base model: name one with --model")
        if len(set(self.served)) < len(self.served):
            raise ValueError(f"model names must be distinct, got {', '.join(self.served)}")
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise ValueError(f"time_scale must be a finite number > 0, got {self.time_scale}")
        if isinstance(self.kv_tokens, bool) or not isinstance(self.kv_tokens, int) or self.kv_tokens < 2:
            raise ValueError(f"kv_tokens must be an integer >= 2, got {self.kv_tokens!r}")
        if self.prefix_cache and self.engine_mode != "paged":
            raise ValueError("--prefix-cache needs --engine-mode paged")
        if isinstance(self.block_tokens, bool) or not isinstance(self.block_tokens, int) or self.block_tokens < 1:
            raise ValueError(f"--block-tokens must be a whole number >= 1, got {self.block_tokens!r}")
        if self.engine_mode not in ENGINE_MODES:
            raise ValueError(f"engine mode must be one of {', '.join(ENGINE_MODES)}, got {self.engine_mode!r}")
        for name in ("error_rate", "drop_rate", "hang_rate"):
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:  # also rejects NaN
                raise ValueError(f"{name} must be a probability between 0 and 1, got {rate}")
        if not (math.isfinite(self.extra_latency_s) and self.extra_latency_s >= 0):
            raise ValueError(f"extra_latency_s must be a finite number >= 0, got {self.extra_latency_s}")
        get_latency_model(self.profile)  # ValueError naming the known profiles
        check_policy(self.policy, engine_options=True)  # ValueError naming the known policies or a bad option

    @property
    def model(self) -> str:
        """The model a request that names none gets (and /metrics' model_name)."""
        return self.models[0] if self.models else DEFAULT_MODEL

    @property
    def served(self) -> tuple[str, ...]:
        return (*self.models, *self.loras)

    def serves(self, model: str | None) -> bool:
        return not self.models or model is None or model in self.served


class Fault(StrEnum):
    NONE = "none"
    ERROR = "error"
    DROP = "drop"
    HANG = "hang"


class FaultDraw:
    """Decides each request's fault at arrival. Three draws per request whatever the rates, so one seed gives the
    same sequence of uniform numbers for any setting; an error wins over a hang, a hang over a drop."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)

    def __call__(self) -> Fault:
        c, u = self.config, [self.rng.random() for _ in range(3)]
        if u[0] < c.error_rate:
            return Fault.ERROR
        if u[1] < c.hang_rate:
            return Fault.HANG
        if u[2] < c.drop_rate:
            return Fault.DROP
        return Fault.NONE
