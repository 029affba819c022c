"""`SimOptions`: everything that decides one simulated run besides the workload and its tenants' weights. The library's
`simulate()`, `fairserve simulate`, `fairserve sweep` and `fairserve reproduce` all build one, so every engine option
(preemption and the running cap in the policy spec, the prefix cache, its block size, the price of a cached token)
reaches every command. `check()` validates it with one-line errors before the first (slow) run."""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

from ..core.cost import make_cost
from ..core.policy import Policy
from ..core.registry import PolicySpec, parse_spec
from .prefix_cache import DEFAULT_BLOCK_TOKENS
from .requests import Mode

MODES = ("reserve", "paged")


@dataclass(frozen=True)
class SimOptions:
    policy: str | Policy = "vtc"  # a policy spec, engine options included (`vtc:preempt=500`), or a built policy
    latency: Any = None  # a latency preset's name or a `LatencyModel`; None: the workload's
    kv_tokens: int | None = None  # the KV pool; None: the workload's
    mode: Mode = "reserve"  # reserve: the paper's conservative admission; paged: vLLM-like
    prefix_cache: bool = False  # paged mode: KV blocks shared by prompts with a common prefix
    block_tokens: int = DEFAULT_BLOCK_TOKENS  # tokens per KV block of the prefix cache
    cost: Any = None  # "linear" (None), "profiled" or a cost function
    w_p: float = 1.0  # linear cost: a prompt token
    w_q: float = 2.0  # linear cost: an output token
    w_cached: float | None = None  # linear cost: a prompt token served from the prefix cache; None: w_p
    seed: int = 0  # the policy's random draws (`vtc-predict:oracle±X`)
    drain: bool = False  # run until every request is done, not to the workload's duration
    until_s: float | None = None  # stop here instead of at the workload's duration (unless `drain`)

    @cached_property
    def spec(self) -> PolicySpec | None:
        """The policy spec, parsed once and checked against this engine (None for a built policy). ValueError."""
        if not isinstance(self.policy, str):
            return None
        return parse_spec(self.policy, engine_options=True, prefix_cache=self.prefix_cache)

    def check(self) -> SimOptions:
        """Every option, checked: the policy spec against this engine, the cost, the mode and the latency preset.
        ValueError with one line; returns self."""
        if self.mode not in MODES:
            raise ValueError(f"engine mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.prefix_cache and self.mode != "paged":
            raise ValueError("--prefix-cache needs --engine-mode paged")
        if self.block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {self.block_tokens}")
        spec = self.spec
        if spec is not None and self.prefix_cache and spec.options:
            raise ValueError(
                f"policy {self.policy!r}: the prefix cache does not combine with {', '.join(spec.options)}="
            )
        make_cost(self.cost, self.w_p, self.w_q, self.w_cached)
        if isinstance(self.latency, str):
            from .latency import get_latency_model

            get_latency_model(self.latency)
        return self

    def to_dict(self) -> dict[str, Any]:
        """The options as plain values (a built policy, latency model or cost function by its name)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = v if v is None or isinstance(v, str | int | float | bool) else getattr(v, "name", repr(v))
        return out


LEGACY = frozenset(f.name for f in fields(SimOptions)) - {"policy"}
