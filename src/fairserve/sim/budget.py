"""Admission checks: does one more request fit in this round? One budget object per admission round.

`reserve` is the paper's testbed (S-LoRA / LightLLM router): admit only if, with every running request assumed to run
to its max output length, the peak future KV-pool use stays below the pool. `paged` is vLLM-like: admit if the prompt
fits now; the engine preempts when the pool runs out. Both count a request's prompt as the server tokenized it
(`extra` tokens more than the client's); `reserve` also holds back `per_client` pool tokens for each distinct client
in the batch it admits into (S-LoRA's 4 * rank per adapter, one adapter per client).

The engine also asks the reserve index *when* a request would fit (`ReserveIndex.first_fit`), so that it does not
retry an admission at every decode step.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .requests import SimRequest

NONE = -(1 << 62)  # the maximum of no terms (an int, so the arithmetic stays exact)
CLEAN = 1 << 62  # ReserveIndex._from when nothing is out of date


class Budget(Protocol):
    """One admission round: `try_add` (does one more request fit? it counts, if so), `take` (an accepted request was
    taken from the queue), `close` (the round is over)."""

    def try_add(self, req: SimRequest) -> bool: ...

    def take(self, req: SimRequest) -> None: ...

    def close(self) -> None: ...


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
    running request's term, so prefix/suffix maxima of those terms only change when the running set does. Entries
    are added and removed as requests start and end (a sorted insert); the maxima are repaired when next read, from
    the first changed position on (a term depends only on the entries before it): a finish, the entry with the
    fewest tokens to go, costs O(1)."""

    def __init__(self, running: Iterable[tuple[int, int]] = ()) -> None:
        self.ends = sorted(running, key=lambda e: -e[0])  # most tokens still to generate first
        self._neg_e = [-e for e, _ in self.ends]
        self._cum = [0]  # C_i = sum_{k<=i} (T_k - e_k)
        self._prefix = [0]  # max_{k<=i} (e_k - 1) * k + C_k
        self._behind = [NONE]  # (e_i - 1) * (i + 1) + C_i: the term of a request behind the candidate
        self._suffix = [NONE]  # max_{k>=i} of those, then NONE at n + 1
        self._from = 1  # the first position (1-based) whose values are out of date, CLEAN if none

    def __len__(self) -> int:
        return len(self.ends)

    def add(self, e: int, t: int) -> None:
        i = bisect_right(self._neg_e, -e)
        self._neg_e.insert(i, -e)
        self.ends.insert(i, (e, t))
        self._from = min(self._from, i + 1)

    def remove(self, e: int, t: int) -> None:
        i = self._find(e, t)
        del self._neg_e[i], self.ends[i]
        self._from = min(self._from, i + 1)

    def _find(self, e: int, t: int) -> int:
        i = bisect_left(self._neg_e, -e)
        while self.ends[i] != (e, t):  # NOTE: among requests ending at the same step; a missing entry raises
            i += 1
        return i

    def _repair(self) -> None:
        ends, j = self.ends, self._from
        cum, prefix, behind, suffix = self._cum, self._prefix, self._behind, self._suffix
        del cum[j:], prefix[j:], behind[j:], suffix[j:]
        c, p = cum[-1], prefix[-1]
        add_cum, add_prefix, add_behind = cum.append, prefix.append, behind.append
        i = j - 1
        for e, t in ends[j - 1 :]:
            i += 1
            c += t - e
            add_cum(c)
            term = (e - 1) * i + c
            if term > p:
                p = term
            add_prefix(p)
            add_behind(term + e - 1)
        s = NONE
        tail = behind[j:]
        for k in range(len(tail) - 1, -1, -1):  # NOTE: the suffix maxima of the new terms, in one backward pass
            b = tail[k]
            if b > s:
                s = b
            tail[k] = s
        suffix.extend(tail)
        suffix.append(NONE)
        for i in range(j - 1, 0, -1):  # the unchanged terms before j: their maxima change only up to the first same
            b = behind[i]
            if b > s:
                s = b
            if s == suffix[i]:
                break
            suffix[i] = s
        self._from = CLEAN

    def peak_with(self, held: int, left: int, step: int) -> int:
        if self._from != CLEAN:
            self._repair()
        pos = bisect_right(self._neg_e, -(left + step + 1))  # running requests with at least `left` to go
        own = left * (pos + 1) + self._cum[pos] + pos * step + held
        return max(self._prefix[pos], own, self._suffix[pos + 1] - step + held)

    def peak_with_entries(self, extra: list[tuple[int, int]]) -> int:
        """`reserve_peak` of the running set plus `extra` entries (e, T), in one pass over the running requests
        from the first that ends no later than some entry (the terms before it are the index's prefix maxima)."""
        if self._from != CLEAN:
            self._repair()
        xs, j = sorted(extra, reverse=True), 0  # NOTE: the order among equal ends does not matter
        xs.append((NONE, 0))  # NOTE: a sentinel that ends before every entry
        xe, xt = xs[0]
        i = bisect_left(self._neg_e, -xe)  # the running requests that end after every entry: their terms stay
        peak, c = self._prefix[i], self._cum[i]
        for e, t in self.ends[i:]:
            while xe >= e:  # NOTE: among equal ends the order does not change the peak
                i, c = i + 1, c + xt - xe
                term = (xe - 1) * i + c
                if term > peak:
                    peak = term
                j += 1
                xe, xt = xs[j]
            i, c = i + 1, c + t - e
            term = (e - 1) * i + c
            if term > peak:
                peak = term
        for xe, xt in xs[j:-1]:
            i, c = i + 1, c + xt - xe
            peak = max(peak, (xe - 1) * i + c)
        return peak

    def first_fit(self, held: int, left: int, limit: int, lo: int, hi: int) -> int | None:
        """The first step G in [lo, hi) with peak_with(held, left, G) < limit (None if there is none), the running
        set staying as it is. As G grows, the running requests with at least `left` to go become fewer; while their
        number p stays the same, the peak is max(prefix[p], a + p*G, b - G): the steps that fit form an interval,
        found in O(1). So the search costs O(log n) plus one step per distinct end step it passes."""
        if self._from != CLEAN:
            self._repair()
        ends, cum, prefix, suffix = self.ends, self._cum, self._prefix, self._suffix
        p = bisect_right(self._neg_e, -(left + lo + 1))
        g = lo
        while g < hi:
            last = min(hi - 1, ends[p - 1][0] - left - 1) if p else hi - 1  # p stays the same up to here
            if prefix[p] < limit:
                first = max(g, suffix[p + 1] + held - limit + 1)  # the requests behind the candidate
                if p:  # the candidate's own term grows with G
                    first_over = (limit - 1 - held - left * (p + 1) - cum[p]) // p
                    last_ok = min(last, first_over)
                else:
                    last_ok = last if left + held < limit else g - 1
                if first <= last_ok:
                    return first
            g = last + 1
            while p and ends[p - 1][0] < left + g + 1:
                p -= 1
        return None


class ReserveBudget:
    """One admission round against the engine's index of the running batch. An admitted candidate counts as LightLLM
    counts a new request (input + 1 held, max - 1 to go); the index takes it, as running, when the round closes.
    With candidates admitted, a bound settles most checks: one more candidate raises the peak by at most its held +
    to-go tokens, and never lowers it; the rest take one pass over the batch."""

    def __init__(
        self,
        index: ReserveIndex,
        step: int,
        kv_tokens: int,
        prefill_tokens: int,
        running_max: int,
        extra: int = 0,
        per_client: int = 0,
        clients: Collection[str] | None = None,
    ) -> None:
        self.index = index
        self.step = step
        self.kv_tokens = kv_tokens
        self.prefill_left = prefill_tokens
        self.running_max = running_max
        self.running = len(index)  # requests in the index
        self.extra = extra
        self.per_client = per_client
        self.clients: Collection[str] = clients if clients is not None else ()  # distinct clients running
        self.n_clients = len(self.clients)  # ... and the new ones admitted this round (in `added`)
        self.added: set[str] = set()
        self.entered: list[tuple[int, int]] = []  # the candidates admitted this round, as index entries
        self.low = self.high = 0  # bounds on the peak with them

    def try_add(self, req: SimRequest) -> bool:
        need_prefill = req.prompt_tokens + self.extra + req.generated
        if need_prefill > self.prefill_left or self.running + len(self.entered) >= self.running_max:
            return False
        held, left = need_prefill + 1, req.output_tokens - req.generated - 1  # as LightLLM: (input + 1, max - 1)
        new = req.tenant not in self.clients and req.tenant not in self.added
        limit = self.kv_tokens - self.per_client * (self.n_clients + new)
        e = self.step + left + 1
        entry = (e, held + e - self.step)
        if not self.entered:
            self.low = self.high = self.index.peak_with(held, left, self.step)
        elif self.high + held + left < limit:
            self.high += held + left
        elif self.low >= limit:
            return False
        else:
            self.low = self.high = self.index.peak_with_entries([*self.entered, entry])
        if self.low >= limit:
            return False
        self.entered.append(entry)
        self.prefill_left -= need_prefill
        if new:
            self.added.add(req.tenant)
            self.n_clients += 1
        return True

    def take(self, req: SimRequest) -> None:
        """`req`, accepted by `try_add`, was admitted (the index takes it when the round closes)."""

    def close(self) -> None:
        """The round is over: its candidates run now, which the index counts as one token fewer to go."""
        for e, t in self.entered:
            self.index.add(e - 1, t - 1)
        self.entered.clear()


class PagedBudget:
    """vLLM-like: a request fits if its prompt fits the pool now (the prefix cache's blocks: sim/cached.py)."""

    def __init__(
        self, kv_used: int, n_running: int, kv_tokens: int, prefill_tokens: int, running_max: int, extra: int = 0
    ) -> None:
        self.free = kv_tokens - kv_used
        self.prefill_left = prefill_tokens
        self.slots = running_max - n_running
        self.extra = extra
        # NOTE: a preempted request's prompt and recomputed output may exceed the prefill budget: it prefills alone
        self.alone = n_running == 0

    def try_add(self, req: SimRequest) -> bool:
        need = req.prompt_tokens + self.extra + req.generated  # a preempted request recomputes what it had generated
        if (need > self.prefill_left and not self.alone) or need + 1 > self.free or self.slots < 1:
            return False
        self.free -= need + 1
        self.prefill_left -= need
        self.slots -= 1
        self.alone = False
        return True

    def take(self, req: SimRequest) -> None:
        pass

    def close(self) -> None:
        pass
