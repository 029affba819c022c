"""The lower-bound construction of §4.1.1 (docs/preemption.md): a workload on which every work-conserving scheduler
without preemption lets one tenant's backlogged service run ahead of another's by about w_q·M, half of VTC's bound
2·max(w_p·L_in, w_q·M).

Tenant `hog` sends its requests at time 0, while it is the only tenant: a work-conserving scheduler must admit them,
and `batch` of them (short prompts, long outputs) fill the pool. Tenant `late` arrives just after, with requests of
the same size, none of which fits until the hog's batch ends. Both stay backlogged (each sends `rounds` batches).
Without preemption, the hog's batch decodes about M output tokens (w_q·M service) while `late` gets nothing.
"""

from __future__ import annotations

from ..workloads import LOWER_BOUND, Arrival, Workload
from .requests import EngineConfig

PROMPT = 8  # tokens: short prompts, so that the pool goes to output tokens (w_q·M dominates w_p·L_in)


def output_length(config: EngineConfig, batch: int = 8) -> int:
    """The output length of the construction's requests: `batch` of them (prompt as the server counts it + output)
    fill the pool that two tenants leave (reserve admission: the peak stays below it), one more does not fit."""
    pool = config.kv_tokens - 2 * config.reserve_per_client_tokens  # NOTE: two tenants hold adapter reserves
    output = (pool - 1) // batch - PROMPT - config.prompt_extra_tokens
    if output < 2 or PROMPT + config.prompt_extra_tokens > config.prefill_tokens:
        raise ValueError(f"a pool of {config.kv_tokens} tokens is too small for a batch of {batch}")
    return output


def held_back(config: EngineConfig, batch: int = 8, w_q: float = 2.0) -> float:
    """The non-preemptive lower bound on the construction: w_q times the output of the hog's batch, which `late`
    waits out while both are backlogged (19,696 for the default engine: 8 × 1,231 output tokens)."""
    return w_q * batch * output_length(config, batch)


def lower_bound_workload(
    config: EngineConfig, *, batch: int = 8, rounds: int = 6, late_s: float = 1.0, duration_s: float = 360.0
) -> Workload:
    """The construction for the engine `config` (its pool, its server's prompt tokens and per-client reserve). Every
    work-conserving order without preemption lets the hog's service run ahead by about w_q·batch·output."""
    output = output_length(config, batch)
    hog = [Arrival(0.0, "hog", PROMPT, output) for _ in range(batch * rounds)]
    late = [Arrival(late_s, "late", PROMPT, output) for _ in range(batch * rounds)]
    return Workload(LOWER_BOUND, hog + late, duration_s=duration_s, kv_tokens=config.kv_tokens)
