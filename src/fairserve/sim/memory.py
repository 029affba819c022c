"""The event engine's memory models (sim/engine.py): how the KV pool admits, when a request would fit, and what the
pool does before a decode step. One class per model, each building its own admission budget (sim/budget.py):

- `ReserveMemory`, the paper's testbed (S-LoRA / LightLLM router): a request is admitted if the peak future pool use,
  with every running request run to its max tokens, stays below the pool (less `per_client` tokens per distinct
  client); the running set is kept in a `ReserveIndex`, which also says at which step a request would fit.
- `PagedMemory`, vLLM-like: a request is admitted if its prompt fits the pool now; before a decode step the newest
  running requests are preempted while the pool cannot hold the step's tokens.
- `CachedMemory` (sim/cached.py): paged, in blocks of a prefix cache.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .batch import NEVER
from .budget import Budget, PagedBudget, ReserveBudget, ReserveIndex

if TYPE_CHECKING:
    from ..core.ledger import Ledger
    from ..core.request import Request
    from .batch import Batch
    from .latency import LatencyModel
    from .requests import EngineConfig, SimRequest


def memory_model(
    cfg: EngineConfig, batch: Batch, latency: LatencyModel, preempt: Callable[[SimRequest], None], ledger: Ledger
) -> ReserveMemory | PagedMemory:
    """The memory model `cfg` names, over `batch`; `preempt` evicts a running request (the engine's)."""
    from .cached import CachedMemory  # NOTE: here: it builds on PagedMemory

    policy = ledger.policy
    if cfg.prefix_cache:
        return CachedMemory(cfg, batch, latency, preempt, ledger)
    if policy.capabilities.uses_prefix_cache:
        raise ValueError(
            f"policy {policy.name!r} orders by cached prefix: run it on the paged engine with the prefix cache"
        )
    return (PagedMemory if cfg.mode == "paged" else ReserveMemory)(cfg, batch, latency, preempt)


class Memory:
    """What every memory model shares: the pool and the admission limits, the batch it reads and `preempt`, the
    engine's evict-and-recompute it calls when the pool runs out."""

    stepwise = False  # the engine moves one decode step at a time and tries an admission at every step
    cache = None  # the prefix cache (sim/cached.py)

    def __init__(
        self, cfg: EngineConfig, batch: Batch, latency: LatencyModel, preempt: Callable[[SimRequest], None]
    ) -> None:
        self.batch, self.latency, self.preempt = batch, latency, preempt
        self.kv, self.prefill_max, self.running_max = cfg.kv_tokens, cfg.prefill_tokens, cfg.running_max
        self.extra = cfg.prompt_extra_tokens
        self.fit_tokens = cfg.pool_tokens  # a request must need fewer (prompt + output)

    def prefill_s(self, reqs: list[SimRequest], lens: list[int]) -> float:
        """The duration of the prefill of `reqs` (`lens`: the tokens each computes)."""
        return self.latency.prefill_s(lens)

    def stopped(self, r: SimRequest) -> None:
        """`r` left the batch (it ended or was preempted)."""

    def before_decode(self, n: int) -> int:
        """Before a decode step of the `n` running requests: the requests still running after the pool's part."""
        return n

    def first_fit(self, req: Request, lo: int, hi: int) -> int:
        """The first step in [lo, hi) at which `req` fits the batch as it is (NEVER if none)."""
        r: SimRequest = req  # type: ignore[assignment]  # NOTE: the engine's ledger holds only SimRequests (no cast call)
        need = r.prompt_tokens + self.extra + r.generated
        if need > self.prefill_max or len(self.batch.running) >= self.running_max:
            return NEVER
        return self._fit_from(r, need, lo, hi)

    def _fit_from(self, r: SimRequest, need: int, lo: int, hi: int) -> int:
        raise NotImplementedError

    def first_fit_smallest(self, sizes: tuple[int, int] | None, lo: int, hi: int) -> tuple[int, int]:
        """A request made of the smallest prefill and the fewest tokens to go among the queued ones (`sizes`) fits
        no later than any queued request does: (the first step in [lo, hi) at which it fits, the last step it
        fits)."""
        raise NotImplementedError

    def budget(self) -> Budget:
        """An admission round's budget against the batch as it is."""
        raise NotImplementedError

    def budget_without(self, gone: list[SimRequest]) -> Budget:
        """The budget of the batch less the requests `gone` (would preempting them make a request fit?)."""
        raise NotImplementedError

    def room(self, n: int) -> int:
        """The decode steps the pool holds with `n` running (NEVER: it never runs out while they run)."""
        raise NotImplementedError

    def quiet_cap(self) -> int:
        """The first step whose try follows an event: the next finish (a finish comes before the try at its step)
        or, where the pool runs out, the step after (the try at that step comes before the preemption)."""
        raise NotImplementedError


class ReserveMemory(Memory):
    """Conservative reserve admission over the `ReserveIndex` of the running batch."""

    def __init__(
        self, cfg: EngineConfig, batch: Batch, latency: LatencyModel, preempt: Callable[[SimRequest], None]
    ) -> None:
        super().__init__(cfg, batch, latency, preempt)
        self.per_client = cfg.reserve_per_client_tokens
        self.fit_tokens -= self.per_client
        self.index = ReserveIndex()  # the running set (ReserveBudget.close adds, `stopped` removes)

    def budget(self) -> Budget:
        batch = self.batch
        return ReserveBudget(
            self.index,
            batch.step,
            self.kv,
            self.prefill_max,
            self.running_max,
            self.extra,
            self.per_client,
            batch.tenants,
        )

    def budget_without(self, gone: list[SimRequest]) -> Budget:
        out, extra = set(gone), self.extra
        rest = [r for r in self.batch.running if r not in out]
        index = ReserveIndex((r.end_step, r.prompt_tokens + extra + r.output_tokens) for r in rest)
        tenants = {r.tenant for r in rest}
        return ReserveBudget(
            index, self.batch.step, self.kv, self.prefill_max, self.running_max, extra, self.per_client, tenants
        )

    def stopped(self, r: SimRequest) -> None:
        self.index.remove(r.end_step, r.prompt_tokens + self.extra + r.output_tokens)

    def room(self, n: int) -> int:
        return NEVER

    def quiet_cap(self) -> int:
        return self.batch.next_finish()

    def _fit_from(self, r: SimRequest, need: int, lo: int, hi: int) -> int:
        tenants, index = self.batch.tenants, self.index
        limit = self.kv - self.per_client * (len(tenants) + (r.tenant not in tenants))
        left = r.output_tokens - r.generated - 1
        if hi == lo + 1:  # one step: the plain check
            return lo if index.peak_with(need + 1, left, lo) < limit else NEVER
        g = index.first_fit(need + 1, left, limit, lo, hi)
        return NEVER if g is None else g

    def first_fit_smallest(self, sizes: tuple[int, int] | None, lo: int, hi: int) -> tuple[int, int]:
        if sizes is None or sizes[0] > self.prefill_max or len(self.batch.running) >= self.running_max:
            return NEVER, -1
        need, left = sizes
        limit = self.kv - self.per_client * len(self.batch.tenants)
        g = self.index.first_fit(need + 1, left, limit, lo, hi)
        return (NEVER if g is None else g), NEVER


class PagedMemory(Memory):
    """vLLM-like admission (the prompt fits the pool now); the newest running requests are preempted by recompute
    when the pool runs out."""

    def budget(self) -> Budget:
        batch = self.batch
        return PagedBudget(batch.kv_used, len(batch.running), self.kv, self.prefill_max, self.running_max, self.extra)

    def budget_without(self, gone: list[SimRequest]) -> Budget:
        out, extra, step = set(gone), self.extra, self.batch.step
        rest = [r for r in self.batch.running if r not in out]
        freed = sum(r.prompt_tokens + extra + r.generated_at(step) for r in gone)
        return PagedBudget(
            self.batch.kv_used - freed, len(rest), self.kv, self.prefill_max, self.running_max, self.extra
        )

    def before_decode(self, n: int) -> int:
        batch = self.batch
        if batch.kv_used + n > self.kv:  # the pool cannot hold the step's tokens: preempt the newest
            running, preempt = batch.running, self.preempt
            while batch.kv_used + len(running) > self.kv:
                preempt(next(reversed(running)))
            n = len(running)
        return n

    def room(self, n: int) -> int:
        return (self.kv - self.batch.kv_used - n) // n + 1

    def quiet_cap(self) -> int:
        batch = self.batch
        cap, n = batch.next_finish(), len(batch.running)
        return min(cap, batch.step + (self.kv - batch.kv_used - n) // n + 2)

    def _fit_from(self, r: SimRequest, need: int, lo: int, hi: int) -> int:
        # NOTE: it fits while the pool has room for it, which only shrinks
        batch = self.batch
        free = self.kv - batch.kv_used - len(batch.running) * (lo - batch.step)
        return lo if lo < hi and need + 1 <= free else NEVER

    def first_fit_smallest(self, sizes: tuple[int, int] | None, lo: int, hi: int) -> tuple[int, int]:
        batch = self.batch
        if sizes is None or sizes[0] > self.prefill_max or len(batch.running) >= self.running_max:
            return NEVER, -1
        need = sizes[0]
        last = batch.step + (self.kv - batch.kv_used - need - 1) // len(batch.running)
        return (lo if lo <= last and lo < hi else NEVER), last
