"""GPU latency models for the continuous-batching simulator.

The simulator asks a `LatencyModel` for (a) `prefill_s(prompt_lens)`: one prefill pass over a mini-batch of new
requests, which also yields each request's first output token, (b) `decode_step_s(batch_size, context_tokens)`:
one decode step of the running batch, where context_tokens = sum over running requests of (prompt tokens + tokens
generated so far), and (c) `decode_lines(batch_size)`: (b) in the simulator's ticks (`sim/ticks.py`, 2^-64 s), as
the lines (a, b) whose largest a + b·context_tokens is a step's duration: a run of steps of an unchanged batch (the
context grows by batch_size a step) then sums in closed form, to the tick what a step-by-step loop adds. (b) is a
few float operations on precomputed constants. An empty prefill costs 0; decode expects batch_size >= 1. A model
without (c) still runs (`decode_lines` then gives None, and the engine adds its steps one by one).

Every model adds a `StepOverhead` to each pass: the server's work outside the model forward (sampling, device -> host
syncs, Python bookkeeping, handing tokens to the detokenizer), which a forward-only profile or a roofline does not see.

Presets (`get_latency_model`, names in `LATENCY_MODELS`); formulas and sources are in docs/latency.md:
- "a10g-llama2-7b" (default): `LinearLatency` fitted to the paper's A10G / Llama-2-7b profile in the batch range the
  paper's workloads run at, plus the S-LoRA server's per-step overhead (constants below). `SERVER_TOKENS` holds the
  preset's two token-level server effects (longer tokenized prompts, the per-adapter admission reserve).
- "MODEL@GPU", e.g. "llama-2-13b@a100-80gb": `RooflineLatency` from `hardware.MODELS` x `hardware.GPUS`.
- "constant": `ConstantLatency()`, for hand-checkable tests.
- a path (`*.json`, or with a directory): the `LinearLatency` fitted to a measured engine's profile
  (`sim/engine_profile.py`, written by `fairserve profile`), its KV pool the engine's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from ..workloads.base import DEFAULT_KV_TOKENS, DEFAULT_LATENCY_PROFILE
from .hardware import GPUS, MODELS, GpuSpec, ModelSpec
from .ticks import Lines, ticks

__all__ = [
    "LatencyModel",
    "StepOverhead",
    "ServerTokens",
    "SERVER_TOKENS",
    "server_tokens",
    "ConstantLatency",
    "LinearLatency",
    "LINEAR_COEFFICIENTS",
    "RooflineLatency",
    "ModelSpec",
    "GpuSpec",
    "MODELS",
    "GPUS",
    "A10G_LLAMA2_7B",
    "DEFAULT_LATENCY_PROFILE",
    "LATENCY_MODELS",
    "get_latency_model",
    "default_kv_tokens",
    "decode_lines",
    "prefill_cached_s",
]


@runtime_checkable
class LatencyModel(Protocol):
    @property
    def name(self) -> str: ...

    def prefill_s(self, prompt_lens: Sequence[int]) -> float: ...

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float: ...

    def decode_lines(self, batch_size: int) -> Lines: ...


def decode_lines(model: Any, batch_size: int) -> Lines | None:
    """`model.decode_lines(batch_size)`; None for a model that only has `decode_step_s` (its steps are then rounded
    to ticks one by one)."""
    lines = getattr(model, "decode_lines", None)
    return lines(batch_size) if lines is not None else None


def prefill_cached_s(model: Any, uncached: Sequence[int], cached: Sequence[int]) -> float:
    """One prefill pass in which request i computes `uncached[i]` prompt tokens after `cached[i]` tokens found in the
    prefix cache: its attention term is u·(c+u) (each new query attends to every earlier key), not u². A model
    without `prefill_cached_s` charges the uncached tokens as a plain prefill."""
    fn = getattr(model, "prefill_cached_s", None)
    if fn is not None:
        return float(fn(uncached, cached))
    return float(model.prefill_s(uncached))


def _check_non_negative(obj: Any, names: Sequence[str]) -> None:
    for n in names:
        v = getattr(obj, n)
        if not (v >= 0.0 and v != float("inf")):  # also rejects NaN
            raise ValueError(f"{type(obj).__name__}.{n} must be finite and >= 0, got {v!r}")


def _sums(prompt_lens: Sequence[int]) -> tuple[float, float]:
    """Σx and Σx² over a prefill batch's prompt lengths (attention cost grows with x²)."""
    return float(sum(prompt_lens)), float(sum([x * x for x in prompt_lens]))  # NOTE: whole numbers, summed exactly


def _cached_sums(uncached: Sequence[int], cached: Sequence[int]) -> tuple[float, float]:
    """Σu and Σu·(c+u): with c tokens cached, the u computed queries attend to c + their own earlier keys."""
    return float(sum(uncached)), float(sum(u * (c + u) for u, c in zip(uncached, cached, strict=True)))


@dataclass(frozen=True, slots=True)
class StepOverhead:
    """Wall time a server spends per pass outside the model forward, added to every decode step and prefill pass:
    kernel launches the forward does not hide, sampling, device -> host syncs, Python loops over the batch, counter
    updates, handing the step's tokens to the detokenizer. One definition for every latency model."""

    decode_s: float = 0.0
    prefill_s: float = 0.0

    def __post_init__(self) -> None:
        _check_non_negative(self, ("decode_s", "prefill_s"))


NO_OVERHEAD = StepOverhead()


@dataclass(frozen=True, slots=True)
class ServerTokens:
    """Token-level effects of the serving software that a latency model does not capture (docs/latency.md).

    prompt_extra_tokens: the server's tokenizer makes a client's p-token prompt p + this many tokens (KV cache,
        prefill and admission use the longer prompt; service is still counted on the client's p).
    reserve_per_client_tokens: the reserve admission check subtracts this much of the KV pool for each distinct
        client (adapter) in the batch it would admit into (S-LoRA: 4 * LoRA rank per adapter)."""

    prompt_extra_tokens: int = 0
    reserve_per_client_tokens: int = 0

    def __post_init__(self) -> None:
        if self.prompt_extra_tokens < 0 or self.reserve_per_client_tokens < 0:
            raise ValueError("ServerTokens values must be >= 0")


@dataclass(frozen=True, slots=True)
class ConstantLatency:
    """prefill = prefill_s_fixed + prefill_s_per_token * sum(prompt_lens) (0 if empty); every decode step = decode_s."""

    prefill_s_per_token: float = 0.0
    prefill_s_fixed: float = 0.0
    decode_s: float = 0.01
    name: str = "constant"

    def __post_init__(self) -> None:
        _check_non_negative(self, ("prefill_s_per_token", "prefill_s_fixed", "decode_s"))

    def prefill_s(self, prompt_lens: Sequence[int]) -> float:
        if not prompt_lens:
            return 0.0
        return self.prefill_s_fixed + self.prefill_s_per_token * float(sum(prompt_lens))

    def prefill_cached_s(self, uncached: Sequence[int], cached: Sequence[int]) -> float:
        return self.prefill_s(uncached)

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        return self.decode_s

    def decode_lines(self, batch_size: int) -> Lines:
        return ((ticks(self.decode_s), 0),)


# the coefficients of a `LinearLatency`, in seconds (what a fit finds and a profile file records)
LINEAR_COEFFICIENTS = (
    "prefill_fixed_s",
    "prefill_per_token_s",
    "prefill_per_sq_token_s",
    "decode_fixed_s",
    "decode_per_seq_s",
    "decode_per_context_token_s",
    "large_batch_s",
)


@dataclass(frozen=True, slots=True)
class LinearLatency:
    """prefill = fixed + per_token * sum(x) + per_sq_token * sum(x^2) + overhead.prefill_s   (attention ~ x^2)
    decode  = fixed + per_seq * batch_size + per_context_token * context_tokens
              + large_batch_s (if batch_size > large_batch_from) + overhead.decode_s."""

    name: str
    prefill_fixed_s: float = 0.0
    prefill_per_token_s: float = 0.0
    prefill_per_sq_token_s: float = 0.0
    decode_fixed_s: float = 0.0
    decode_per_seq_s: float = 0.0
    decode_per_context_token_s: float = 0.0
    large_batch_s: float = 0.0  # added to a decode step of more than large_batch_from requests
    large_batch_from: int = 64
    overhead: StepOverhead = NO_OVERHEAD
    _pre0: float = field(init=False, repr=False, compare=False)
    _dec0: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_non_negative(self, LINEAR_COEFFICIENTS)
        object.__setattr__(self, "_pre0", self.prefill_fixed_s + self.overhead.prefill_s)
        object.__setattr__(self, "_dec0", self.decode_fixed_s + self.overhead.decode_s)

    def prefill_s(self, prompt_lens: Sequence[int]) -> float:
        if not prompt_lens:
            return 0.0
        tokens, squares = _sums(prompt_lens)
        return self._pre0 + self.prefill_per_token_s * tokens + self.prefill_per_sq_token_s * squares

    def prefill_cached_s(self, uncached: Sequence[int], cached: Sequence[int]) -> float:
        if not uncached:
            return 0.0
        tokens, squares = _cached_sums(uncached, cached)
        return self._pre0 + self.prefill_per_token_s * tokens + self.prefill_per_sq_token_s * squares

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        t = self._dec0 + self.decode_per_seq_s * batch_size + self.decode_per_context_token_s * context_tokens
        return t + self.large_batch_s if batch_size > self.large_batch_from else t

    def decode_lines(self, batch_size: int) -> Lines:
        fixed = self._dec0 + self.decode_per_seq_s * batch_size
        if batch_size > self.large_batch_from:
            fixed += self.large_batch_s
        return ((ticks(fixed), ticks(self.decode_per_context_token_s)),)

    def forward_only(self) -> LinearLatency:
        """The same model without the server overhead: what a forward-only profile measures."""
        return replace(self, overhead=NO_OVERHEAD)


@dataclass(frozen=True, slots=True)
class RooflineLatency:
    """max(compute time, memory time) + a fixed per-pass overhead, from a ModelSpec and a GpuSpec.

    decode: compute = (2*params*batch + 4*layers*hidden*context) / (peak_flops*mfu)
            memory  = (weight_bytes + context*kv_bytes_per_token) / (mem_bandwidth*bandwidth_efficiency)
    prefill: compute = (2*params*sum(x) + 4*layers*hidden*sum(x^2)) / (peak_flops*mfu)
             memory  = (weight_bytes + sum(x)*kv_bytes_per_token) / (mem_bandwidth*bandwidth_efficiency)
    """

    model: ModelSpec
    gpu: GpuSpec
    mfu: float = 0.5  # achieved / peak tensor FLOP/s (docs/latency.md justifies the defaults)
    bandwidth_efficiency: float = 0.8  # achieved / datasheet memory bandwidth
    # decode: kernel launches + scheduler/sampling on the CPU; prefill: the above + batching prompts, allocating KV
    overhead: StepOverhead = StepOverhead(decode_s=0.003, prefill_s=0.01)
    name: str = ""  # "" -> "MODEL@GPU"
    _w_mem: float = field(init=False, repr=False, compare=False)
    _kv_mem: float = field(init=False, repr=False, compare=False)
    _tok_flop: float = field(init=False, repr=False, compare=False)
    _attn_flop: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not (0.0 < self.mfu <= 1.0 and 0.0 < self.bandwidth_efficiency <= 1.0):
            raise ValueError("mfu and bandwidth_efficiency must be in (0, 1]")
        m, g = self.model, self.gpu
        flops, bw = g.peak_flops * self.mfu, g.mem_bandwidth * self.bandwidth_efficiency
        s = object.__setattr__
        s(self, "name", self.name or f"{m.name}@{g.name}")
        s(self, "_w_mem", m.weight_bytes / bw)  # s to stream the weights once
        s(self, "_kv_mem", m.kv_bytes_per_token / bw)  # s to read (decode) or write (prefill) one token's KV
        s(self, "_tok_flop", 2.0 * m.params / flops)  # s of dense matmuls per token
        s(self, "_attn_flop", 4.0 * m.layers * m.hidden / flops)  # s of QK^T + AV per (query, key) pair

    def prefill_s(self, prompt_lens: Sequence[int]) -> float:
        if not prompt_lens:
            return 0.0
        tokens, squares = _sums(prompt_lens)
        compute = self._tok_flop * tokens + self._attn_flop * squares
        memory = self._w_mem + self._kv_mem * tokens
        return (compute if compute > memory else memory) + self.overhead.prefill_s

    def prefill_cached_s(self, uncached: Sequence[int], cached: Sequence[int]) -> float:
        """As `prefill_s`, the attention term u·(c+u); the cached keys are read once more (KV traffic c)."""
        if not uncached:
            return 0.0
        tokens, squares = _cached_sums(uncached, cached)
        compute = self._tok_flop * tokens + self._attn_flop * squares
        memory = self._w_mem + self._kv_mem * (tokens + float(sum(cached)))
        return (compute if compute > memory else memory) + self.overhead.prefill_s

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        compute = self._tok_flop * batch_size + self._attn_flop * context_tokens
        memory = self._w_mem + self._kv_mem * context_tokens
        return (compute if compute > memory else memory) + self.overhead.decode_s

    def decode_lines(self, batch_size: int) -> Lines:
        over = self.overhead.decode_s
        compute = (ticks(self._tok_flop * batch_size + over), ticks(self._attn_flop))
        return (compute, (ticks(self._w_mem + over), ticks(self._kv_mem)))

    @property
    def decode_overhead_s(self) -> float:
        return self.overhead.decode_s

    @property
    def prefill_overhead_s(self) -> float:
        return self.overhead.prefill_s


OPERATING_MAX_BATCH = 64  # the paper's workloads run at batch <= ~52; larger profile rows jump (docs/latency.md)

# Fitted to the paper's A10G / Llama-2-7b profile (shared/profiles/a10g_llama2_7b_batch_profile.json) by
# benchmarks/fit_profile.py, which reproduces these constants and prints the per-row error (docs/latency.md).
# Non-negative least squares on relative error; decode on the rows with batch <= 64 only. prefill_per_sq_token_s is
# 0: unconstrained it fits slightly negative (-1.0e-8 s), i.e. no attention x^2 growth up to 512-token prompts.
A10G_FORWARD = LinearLatency(
    name="a10g-llama2-7b",
    prefill_fixed_s=0.05316486426127616,
    prefill_per_token_s=0.00020893483944306907,
    prefill_per_sq_token_s=0.0,
    decode_fixed_s=0.02938750999063876,
    decode_per_seq_s=5.022472174770765e-05,
    decode_per_context_token_s=9.874547913822942e-07,
    large_batch_s=0.005999094232314123,
    large_batch_from=64,
)
# The S-LoRA server's work per pass outside the forward the profile timed (docs/latency.md, "Server overhead"):
# calibrated on the paper's four measured calibration runs (benchmarks/fidelity.py).
A10G_STEP_OVERHEAD = StepOverhead(decode_s=0.0025, prefill_s=0.0025)
A10G_LLAMA2_7B = replace(A10G_FORWARD, overhead=A10G_STEP_OVERHEAD)

# S-LoRA as the paper ran it: "Hello " * p tokenizes to p + 2 (BOS and a trailing piece); admission reserves
# 4 * rank (8) = 32 pool tokens per distinct adapter, one adapter per client (docs/latency.md).
SERVER_TOKENS: dict[str, ServerTokens] = {
    DEFAULT_LATENCY_PROFILE: ServerTokens(prompt_extra_tokens=2, reserve_per_client_tokens=32)
}


def server_tokens(name: str = DEFAULT_LATENCY_PROFILE) -> ServerTokens:
    """The preset's token-level server effects (none for presets without a measured server)."""
    return SERVER_TOKENS.get(name.strip().lower(), ServerTokens())


KV_MEMORY_FRACTION = 0.9  # of GPU memory usable for weights + KV (rest: CUDA context, activations, fragmentation)


def _roofline_kv_tokens(model: ModelSpec, gpu: GpuSpec) -> int:
    return int((gpu.memory_bytes * KV_MEMORY_FRACTION - model.weight_bytes) // model.kv_bytes_per_token)


_ROOFLINE_NAMES = [f"{m}@{g}" for m in MODELS for g in GPUS if _roofline_kv_tokens(MODELS[m], GPUS[g]) > 0]
LATENCY_MODELS: list[str] = [DEFAULT_LATENCY_PROFILE, "constant", *_ROOFLINE_NAMES]


def _unknown(name: str, why: str = "unknown latency model") -> ValueError:
    return ValueError(f"{why} {name!r}; valid names: {', '.join(LATENCY_MODELS)}")


def _roofline_pair(name: str) -> tuple[ModelSpec, GpuSpec]:
    model, _, gpu = name.partition("@")
    if model not in MODELS or gpu not in GPUS:
        raise _unknown(name)
    if name not in _ROOFLINE_NAMES:
        raise _unknown(
            name,
            f"{model} weights ({MODELS[model].weight_bytes / 1e9:.1f} GB fp16) leave no room for a "
            f"KV cache in {KV_MEMORY_FRACTION:.0%} of {gpu} memory:",
        )
    return MODELS[model], GPUS[gpu]


def get_latency_model(name: str = DEFAULT_LATENCY_PROFILE) -> LatencyModel:
    """A preset by name, or the model fitted to a profile file `fairserve profile` wrote (a path)."""
    from .engine_profile import is_profile_path, load_engine_profile  # NOTE: it imports this module

    if is_profile_path(name):
        return load_engine_profile(name).latency()
    key = name.strip().lower()
    if key == DEFAULT_LATENCY_PROFILE:
        return A10G_LLAMA2_7B
    if key == "constant":
        return ConstantLatency()
    if "@" in key:
        return RooflineLatency(*_roofline_pair(key))
    raise _unknown(name)


def default_kv_tokens(name: str = DEFAULT_LATENCY_PROFILE) -> int:
    """KV-cache pool size in tokens: the paper's 10,000 for the profiled A10G (and "constant"); for a roofline
    preset, (gpu memory * 0.9 - weight bytes) // kv_bytes_per_token; for a profile file, the engine's pool."""
    from .engine_profile import is_profile_path, load_engine_profile

    if is_profile_path(name):
        return load_engine_profile(name).kv_tokens
    key = name.strip().lower()
    if key in (DEFAULT_LATENCY_PROFILE, "constant"):
        return DEFAULT_KV_TOKENS
    if "@" in key:
        return _roofline_kv_tokens(*_roofline_pair(key))
    raise _unknown(name)
