"""Admission checks: does one more request fit in this round? One budget object per admission round.

`reserve` is the paper's testbed (S-LoRA / LightLLM router): admit only if, with every running request assumed to run
to its max output length, the peak future KV-pool use stays below the pool. `paged` is vLLM-like: admit if the prompt
fits now; the engine preempts when the pool runs out.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engine import SimRequest


class ReserveBudget:
    def __init__(self, running: list[SimRequest], step: int, kv_tokens: int, prefill_tokens: int,
                 running_max: int) -> None:
        # (tokens held now, tokens still to generate) per request, as LightLLM's `_init_cache_list`
        self.cache = [(r.prompt_tokens + r.generated_at(step), r.output_tokens - r.generated_at(step) - 1)
                      for r in running]
        self.kv_tokens = kv_tokens
        self.prefill_left = prefill_tokens
        self.running_max = running_max

    def try_add(self, req: SimRequest) -> bool:
        need_prefill = req.prompt_tokens + req.generated
        if need_prefill > self.prefill_left or len(self.cache) + 1 > self.running_max:
            return False
        cache = self.cache + [(need_prefill + 1, req.output_tokens - req.generated - 1)]
        cache.sort(key=lambda e: -e[1])
        peak = cum = 0
        for i, (held, left) in enumerate(cache, 1):
            cum += held
            if left * i + cum > peak:
                peak = left * i + cum
        if peak >= self.kv_tokens:
            return False
        self.cache = cache
        self.prefill_left -= need_prefill
        return True


class PagedBudget:
    def __init__(self, kv_used: int, n_running: int, kv_tokens: int, prefill_tokens: int, running_max: int) -> None:
        self.free = kv_tokens - kv_used
        self.prefill_left = prefill_tokens
        self.slots = running_max - n_running

    def try_add(self, req: SimRequest) -> bool:
        need = req.prompt_tokens + req.generated   # a preempted request recomputes what it had generated
        if need > self.prefill_left or need + 1 > self.free or self.slots < 1:
            return False
        self.free -= need + 1
        self.prefill_left -= need
        self.slots -= 1
        return True
