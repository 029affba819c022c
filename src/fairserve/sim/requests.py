"""What the simulated engine is configured with, what it simulates and what it returns: `EngineConfig` (the pool,
the admission mode, preemption options), `SimRequest` (a request as the engine runs it), `SimResult`, and the
conversions between them and the workload's arrivals and the JSON records."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from operator import attrgetter
from typing import Any, Literal

from ..core.ledger import Ledger
from ..core.request import Request, RequestState
from ..records import RequestRecord
from ..workloads.base import DEFAULT_KV_TOKENS
from .prefix_cache import DEFAULT_BLOCK_TOKENS, Held

Mode = Literal["reserve", "paged", "vllm"]
MODES: tuple[Mode, ...] = ("reserve", "paged", "vllm")  # sim/engine.py runs the first two, sim/vllm_steps.py vLLM's


@dataclass(frozen=True)
class EngineConfig:
    kv_tokens: int = DEFAULT_KV_TOKENS  # KV-cache pool (A10G + Llama-2-7b in the paper)
    batch_max_tokens: int | None = None  # prefill budget per round; None = max(kv_tokens // 6, 3072)
    max_wait_steps: int | None = None  # decode steps between admission rounds; None = 10 (reserve), 0 (paged)
    mode: Mode = "reserve"
    running_max: int = 1000
    prompt_extra_tokens: int = 0  # the server tokenizes a p-token prompt as p + this (latency.ServerTokens)
    reserve_per_client_tokens: int = 0  # reserve admission: pool held back per distinct client in the batch
    preempt_delta: float | None = None  # preempt at a counter gap above this (sim/preempt.py); None: never
    preempt_max: int = 1  # times one request may be preempted for fairness
    running_cap: int | None = None  # most KV tokens (prompt + max_tokens) one tenant's running requests may reserve
    preempt_priority: bool = False  # a waiting request of a better level preempts running ones of worse levels
    prefix_cache: bool = False  # paged mode: KV blocks shared by prompts with a common prefix (sim/prefix_cache.py)
    block_tokens: int = DEFAULT_BLOCK_TOKENS  # tokens per KV block of the prefix cache, and of the vllm mode's pool
    chunked_prefill: bool = True  # vllm mode: a prompt may be prefilled over several steps (sim/vllm_steps.py)
    victim_by_counter: bool | None = None  # vllm mode's `victim=`; None: by counter where the policy shares them

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"engine mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.kv_tokens < 2:
            raise ValueError(f"kv_tokens must be >= 2, got {self.kv_tokens}")
        if self.prompt_extra_tokens < 0 or self.reserve_per_client_tokens < 0:
            raise ValueError("prompt_extra_tokens and reserve_per_client_tokens must be >= 0")
        if self.preempt_delta is not None and not self.preempt_delta >= 0:
            raise ValueError(f"preempt_delta must be >= 0, got {self.preempt_delta}")
        if self.preempt_max < 1 or (self.running_cap is not None and self.running_cap < 1):
            raise ValueError("preempt_max and running_cap must be >= 1")
        if self.mode == "vllm":
            if not 1 <= self.block_tokens <= self.kv_tokens // 2:
                raise ValueError(f"block_tokens must be between 1 and kv_tokens / 2, got {self.block_tokens}")
            if self.preempt_delta is not None or self.running_cap is not None or self.preempt_priority:
                raise ValueError(
                    "engine mode 'vllm' runs vLLM's own preemption: preempt=, preempt-priority= and running-cap= act "
                    "in the reserve and paged modes"
                )
        if self.prefix_cache:
            if self.mode != "paged":
                raise ValueError("the prefix cache needs the paged engine (mode 'paged')")
            if not 1 <= self.block_tokens <= self.kv_tokens // 2:
                raise ValueError(f"block_tokens must be between 1 and kv_tokens / 2, got {self.block_tokens}")
            if self.preempt_delta is not None or self.running_cap is not None or self.preempt_priority:
                raise ValueError("the prefix cache does not combine with preempt=, preempt-priority= or running-cap=")

    @property
    def pool_tokens(self) -> int:
        """The tokens a request may hold: the pool, in whole blocks with the prefix cache and in vllm mode."""
        if self.prefix_cache or self.mode == "vllm":
            return self.kv_tokens // self.block_tokens * self.block_tokens
        return self.kv_tokens

    def with_options(self, options: Mapping[str, float | int]) -> EngineConfig:
        """This engine with a policy spec's engine options (`core.registry.split_options`): `preempt`,
        `preempt-max`, `running-cap`, `preempt-priority`."""
        if not options:
            return self
        # NOTE: the vLLM plugin's own victim rule (core.registry.VLLM_OPTIONS): refused, not ignored, by this engine
        if "victim" in options:
            if self.mode != "vllm" or len(options) > 1:
                raise ValueError(
                    "engine option 'victim' applies to the vLLM plugin (docs/vllm.md) and engine mode 'vllm' alone; "
                    "the reserve and paged modes take preempt, preempt-max, preempt-priority and running-cap"
                )
            return replace(self, victim_by_counter=bool(options["victim"]))
        return replace(
            self,
            preempt_delta=float(options["preempt"]) if "preempt" in options else self.preempt_delta,
            preempt_max=int(options.get("preempt-max", self.preempt_max)),
            running_cap=int(options["running-cap"]) if "running-cap" in options else self.running_cap,
            preempt_priority=bool(options.get("preempt-priority", self.preempt_priority)),
        )

    @cached_property
    def prefill_tokens(self) -> int:
        return self.batch_max_tokens if self.batch_max_tokens else max(self.kv_tokens // 6, 3072)

    @cached_property
    def wait_steps(self) -> int:
        if self.max_wait_steps is not None:
            return self.max_wait_steps
        return 10 if self.mode == "reserve" else 0


@dataclass(slots=True, eq=False, kw_only=True)
class SimRequest(Request):
    output_tokens: int  # the true length; the client sends max_tokens = output_tokens (ignore_eos)
    generated: int = 0  # output tokens produced before the current run (non-zero after a preemption)
    step_base: int = 0  # decode-step counter when the current run's prefill finished
    end_step: int = 0  # decode step at which the current run has produced every token
    fair_preemptions: int = 0  # times it was preempted for fairness (EngineConfig.preempt_delta)
    prefix: tuple[tuple[str, int], ...] = ()  # the workload's `Arrival.prefix`
    continued_as: str | None = None  # the workload's `Arrival.continued_as`: the id of what follows the prefix
    keys: list | None = None  # the block keys of the tokens its prefill fills (prefix cache) ...
    keys_for: int = 0  # ... computed for this many tokens (its prompt, and any output it recomputes)
    held: Held | None = None  # the blocks it holds while running (prefix cache)
    probe: tuple[int, int, int] = (-1, 0, 0)  # the cache's version and `generated` at the last look-up, its answer
    admit_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    last_token_s: float | None = None

    @property
    def level(self) -> int:
        """The priority level it runs at (0 the best; `core.preemption.Leveled`)."""
        return self.priority or 0

    def generated_at(self, step: int) -> int:
        """Output tokens produced by decode step `step` (the prefill produced one)."""
        return self.generated + (step - self.step_base) if self.state is RequestState.RUNNING else self.generated


@dataclass
class SimResult:
    records: list[RequestRecord]
    ledger: Ledger
    end_s: float
    decode_steps: int
    prefills: int
    preemptions: int
    busy_s: float  # time spent prefilling or decoding (the rest the engine was idle)
    config: EngineConfig
    fair_preemptions: int = 0  # of `preemptions`, those for fairness (EngineConfig.preempt_delta)
    cached_tokens: list[int] | None = None  # prefix cache: per record, its prompt tokens served from the cache
    fleet: Any = None  # `--engines`: the fleet's `FleetReport` (sim/fleet.py): its engines, their cost


def too_large(cfg: EngineConfig, prompt_tokens: int, output_tokens: int) -> str | None:
    """Why a request of this size could never be admitted, or None if it can be."""
    prompt = prompt_tokens + cfg.prompt_extra_tokens
    pool = cfg.pool_tokens - (cfg.reserve_per_client_tokens if cfg.mode == "reserve" else 0)
    if prompt + output_tokens >= pool:
        return (
            f"This request needs {prompt + output_tokens} tokens of KV cache ({prompt} in the prompt + "
            f"{output_tokens} max_tokens), but the engine's pool holds {pool}. "
            "Reduce the prompt or max_tokens."
        )
    if cfg.mode == "vllm":
        # NOTE: without chunks, a preempted request re-prefills its output too, in one step
        if not cfg.chunked_prefill and prompt + output_tokens > cfg.prefill_tokens:
            return (
                f"This request needs {prompt + output_tokens} tokens in one step ({prompt} in the prompt + "
                f"{output_tokens} max_tokens), but the engine schedules at most {cfg.prefill_tokens} tokens a step "
                "without chunked prefill."
            )
        return None
    if prompt > cfg.prefill_tokens:
        return f"The prompt has {prompt} tokens; the engine prefills at most {cfg.prefill_tokens} at once."
    return None


def sim_requests(arrivals: Iterable) -> list[SimRequest]:
    """One `SimRequest` per arrival (`id` = its index), in arrival order (stable for ties)."""
    reqs = [
        SimRequest(
            id=i,
            tenant=a.client,
            prompt_tokens=a.prompt_tokens,
            max_tokens=a.output_tokens,
            predicted_output=a.output_tokens,
            arrival_s=a.arrival_s,
            output_tokens=a.output_tokens,
            prefix=getattr(a, "prefix", ()),
            continued_as=getattr(a, "continued_as", None),
        )
        for i, a in enumerate(arrivals)
    ]
    reqs.sort(key=attrgetter("arrival_s"))
    return reqs


_STATUS = {RequestState.FINISHED: "finished", RequestState.REJECTED: "rejected"}


def record_of(r: SimRequest, step: int, end_s: float) -> RequestRecord:
    state = r.state
    status = _STATUS.get(state, "unfinished")
    if state is RequestState.RUNNING:
        r.last_token_s = end_s
        output = r.generated + (step - r.step_base)  # NOTE: generated_at(step), inline: every request passes here
    else:
        output = r.generated if r.admit_s is not None else 0
    return RequestRecord(  # NOTE: positional (as the fields are declared): keywords cost twice as much here
        r.id,
        r.tenant,
        r.arrival_s,
        r.admit_s,
        r.first_token_s,
        r.finish_s,
        r.last_token_s,
        r.prompt_tokens,
        output,
        r.output_tokens,
        status,
        r.cached_tokens,
    )
