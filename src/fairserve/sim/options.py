"""`SimOptions`: everything that decides one simulated run besides the workload and its tenants' weights. The library's
`simulate()`, `fairserve simulate`, `fairserve sweep` and `fairserve reproduce` all build one, so every engine option
(preemption and the running cap in the policy spec, the prefix cache, its block size, the price of a cached token)
reaches every command. `check()` validates it with one-line errors before the first (slow) run."""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ..core.cost import make_cost
from ..core.policy import Policy
from ..core.registry import PolicySpec, parse_spec
from .autoscale import Scaling, parse_autoscale
from .prefix_cache import DEFAULT_BLOCK_TOKENS
from .requests import MODES, Mode

if TYPE_CHECKING:
    from ..gateway.dispatch.placement import Placement


@dataclass(frozen=True)
class SimOptions:
    policy: str | Policy = "vtc"  # a policy spec, engine options included (`vtc:preempt=500`), or a built policy
    latency: Any = None  # a latency preset's name or a `LatencyModel`; None: the workload's
    kv_tokens: int | None = None  # the KV pool; None: the workload's
    mode: Mode = "reserve"  # reserve: the paper's conservative admission; paged: vLLM-like; vllm: vLLM's steps
    prefix_cache: bool = False  # paged mode: KV blocks shared by prompts with a common prefix
    block_tokens: int = DEFAULT_BLOCK_TOKENS  # tokens per KV block of the prefix cache
    cost: Any = None  # "linear" (None), "profiled" or a cost function
    w_p: float = 1.0  # linear cost: a prompt token
    w_q: float = 2.0  # linear cost: an output token
    w_cached: float | None = None  # linear cost: a prompt token served from the prefix cache; None: w_p
    seed: int = 0  # the policy's random draws (`vtc-predict:oracle±X`)
    drain: bool = False  # run until every request is done, not to the workload's duration
    until_s: float | None = None  # stop here instead of at the workload's duration (unless `drain`)
    # a fleet (sim/fleet.py): this many engines behind the gateway's dispatch; None: one engine, no dispatcher
    engines: int | None = None
    dispatch: str = "least_loaded"  # the fleet's dispatch rule: least_loaded or shard:K (gateway/dispatch/placement.py)
    autoscale: str | None = None  # "MIN:MAX": the fleet scales between them (sim/autoscale.py)
    scale_wait_s: float = 10.0  # ask for an engine when the oldest queued request has waited this long
    scale_delay_s: float = 60.0  # a new engine takes requests this long after it is asked for
    scale_idle_s: float = 60.0  # let an engine go after this long with nothing in flight

    @property
    def fleet(self) -> bool:
        """A fleet behind a dispatcher, rather than the one engine."""
        return self.engines is not None or self.autoscale is not None

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
        if spec is not None and self.mode == "vllm" and set(spec.options) - {"victim"}:
            raise ValueError(
                f"policy {self.policy!r}: {', '.join(set(spec.options) - {'victim'})}= act in the reserve and paged "
                "modes; engine mode 'vllm' runs vLLM's own preemption (it takes victim=counter|vllm)"
            )
        make_cost(self.cost, self.w_p, self.w_q, self.w_cached)
        if self.fleet:
            self.fleet_parts()
        elif self.dispatch != "least_loaded":
            raise ValueError("--dispatch places requests on a fleet: give --engines N or --autoscale MIN:MAX")
        if isinstance(self.latency, str):
            from .latency import get_latency_model

            get_latency_model(self.latency)
        return self

    def fleet_parts(self) -> tuple[int, Placement, Scaling | None]:
        """The fleet's engines at start, its dispatch rule and its scaling, checked (ValueError, one line)."""
        from ..gateway.dispatch.placement import parse_placement  # NOTE: here: the gateway's package loads pydantic

        if self.mode == "vllm":
            raise ValueError("a fleet's engines run in the reserve or paged mode (--engine-mode vllm runs one engine)")
        spec = self.spec
        if spec is not None and spec.options:
            raise ValueError(
                f"policy {self.policy!r}: {', '.join(spec.options)}= act inside one engine; a fleet's engines run what "
                "the dispatcher sends them in arrival order (drop --engines, or the option)"
            )
        if spec is not None and spec.entry.capabilities.uses_prefix_cache:
            raise ValueError(f"policy {self.policy!r} orders by an engine's prefix cache: it does not run a fleet")
        if self.engines is not None and self.engines < 1:
            raise ValueError(f"--engines must be >= 1, got {self.engines}")
        scaling = None
        if self.autoscale is not None:
            low, high = parse_autoscale(self.autoscale)
            scaling = Scaling(low, high, self.scale_wait_s, self.scale_delay_s, self.scale_idle_s)
        start = self.engines if self.engines is not None else scaling.low if scaling else 1
        return start, parse_placement(self.dispatch), scaling

    def to_dict(self) -> dict[str, Any]:
        """The options as plain values (a built policy, latency model or cost function by its name)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = v if v is None or isinstance(v, str | int | float | bool) else getattr(v, "name", repr(v))
        return out


LEGACY = frozenset(f.name for f in fields(SimOptions)) - {"policy"}
