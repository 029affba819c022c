"""Admission checks: does one more request fit in this round? One budget object per admission round.

`reserve` is the paper's testbed (S-LoRA / LightLLM router): admit only if, with every running request assumed to run
to its max output length, the peak future KV-pool use stays below the pool. `paged` is vLLM-like: admit if the prompt
fits now; the engine preempts when the pool runs out. Both count a request's prompt as the server tokenized it
(`extra` tokens more than the client's); `reserve` also holds back `per_client` pool tokens for each distinct client
in the batch it admits into (S-LoRA's 4 * rank per adapter, one adapter per client).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engine import SimRequest


def reserve_peak(cache: list[tuple[int, int]]) -> int:
    """LightLLM's `_can_add_new_req` quantity, written plainly: with (tokens held, tokens still to generate) per
    request, sorted by tokens still to generate (most first), the peak future pool use is
    max_i(left_i * i + sum of held_1..i). The engine uses the equivalent `ReserveIndex`; tests compare the two."""
    peak = cum = 0
    for i, (held, left) in enumerate(sorted(cache, key=lambda e: -e[1]), 1):
        cum += held
        peak = max(peak, left * i + cum)
    return peak


class ReserveIndex:
    """`reserve_peak` for the running batch plus one candidate, in O(log n) per candidate.

    A running request is kept as (e, T): the decode step at which it ends and its prompt + output tokens; at step G
    it holds T - (e - G) tokens and has e - G - 1 still to generate. In the peak formula G then cancels out of every
    running request's term, so prefix/suffix maxima of those terms are computed once per running set and a candidate
    only needs a bisect for its position."""

    def __init__(self, running: list[tuple[int, int]]) -> None:
        self.ends = sorted(running, key=lambda e: -e[0])  # most tokens still to generate first
        self.neg_e = [-e for e, _ in self.ends]
        self.cum = [0]  # C_i = sum_{k<=i} (T_k - e_k)
        self.prefix = [0]  # max_{k<=i} (e_k - 1) * k + C_k
        for i, (e, t) in enumerate(self.ends, 1):
            self.cum.append(self.cum[-1] + t - e)
            self.prefix.append(max(self.prefix[-1], (e - 1) * i + self.cum[i]))
        n = len(self.ends)
        self.suffix = [float("-inf")] * (n + 2)  # max_{k>=i} (e_k - 1) * (k + 1) + C_k
        for i in range(n, 0, -1):
            self.suffix[i] = max(self.suffix[i + 1], (self.ends[i - 1][0] - 1) * (i + 1) + self.cum[i])

    def peak_with(self, held: int, left: int, step: int) -> float:
        pos = bisect_right(self.neg_e, -(left + step + 1))  # running requests with at least `left` to go
        own = left * (pos + 1) + self.cum[pos] + pos * step + held
        return max(self.prefix[pos], own, self.suffix[pos + 1] - step + held)

    def with_entry(self, held: int, left: int, step: int) -> ReserveIndex:
        e = step + left + 1
        return ReserveIndex(self.ends + [(e, held + e - step)])


class ReserveBudget:
    def __init__(
        self,
        index: ReserveIndex,
        step: int,
        kv_tokens: int,
        prefill_tokens: int,
        running_max: int,
        extra: int = 0,
        per_client: int = 0,
        clients: set[str] | None = None,
    ) -> None:
        self.index = index
        self.step = step
        self.kv_tokens = kv_tokens
        self.prefill_left = prefill_tokens
        self.running_max = running_max
        self.extra = extra
        self.per_client = per_client
        self.clients = set(clients or ())  # distinct clients in the running batch plus those admitted so far

    def try_add(self, req: SimRequest) -> bool:
        need_prefill = req.prompt_tokens + self.extra + req.generated
        if need_prefill > self.prefill_left or len(self.index.ends) + 1 > self.running_max:
            return False
        held, left = need_prefill + 1, req.output_tokens - req.generated - 1  # as LightLLM: (input + 1, max - 1)
        adapters = len(self.clients) + (req.tenant not in self.clients)
        if self.index.peak_with(held, left, self.step) >= self.kv_tokens - self.per_client * adapters:
            return False
        self.index = self.index.with_entry(held, left, self.step)
        self.prefill_left -= need_prefill
        self.clients.add(req.tenant)
        return True


class PagedBudget:
    def __init__(
        self, kv_used: int, n_running: int, kv_tokens: int, prefill_tokens: int, running_max: int, extra: int = 0
    ) -> None:
        self.free = kv_tokens - kv_used
        self.prefill_left = prefill_tokens
        self.slots = running_max - n_running
        self.extra = extra

    def try_add(self, req: SimRequest) -> bool:
        need = req.prompt_tokens + self.extra + req.generated  # a preempted request recomputes what it had generated
        if need > self.prefill_left or need + 1 > self.free or self.slots < 1:
            return False
        self.free -= need + 1
        self.prefill_left -= need
        self.slots -= 1
        return True
