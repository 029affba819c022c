"""The event engine's prefix cache (paged mode, `EngineConfig.prefix_cache`): the memory model `CachedMemory`.

The pool is `kv_tokens // block_tokens` blocks of a `PrefixCache`, used as vLLM's automatic prefix caching uses its
blocks. A request is admitted if its prompt's blocks that are not cached can be had, reusing the cached ones; only
the uncached tokens count against the prefill budget and are computed by the prefill (`latency.prefill_cached_s`).
Before a decode step, every running request whose input token (the one sampled last) starts a new block takes one;
if the pool cannot give them, the newest running requests are preempted until it can. A request that stops running
gives its blocks back with every full one it computed, output included, kept in the cache (a preempted request finds
its own prompt and output there when it is admitted again). With the cache on, the engine moves one decode
step at a time and tries an admission at every step (block boundaries are not forecast).

A policy that orders by cached prefix (`Capabilities.uses_prefix_cache`) is given `cached_tokens`: how many prompt
tokens of a waiting request the cache holds now (`Policy.cached`)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

from .latency import prefill_cached_s
from .memory import PagedMemory
from .prefix_cache import PrefixCache, prompt_keys

if TYPE_CHECKING:
    from ..core.ledger import Ledger
    from ..core.request import Request
    from .batch import Batch
    from .budget import Budget
    from .latency import LatencyModel
    from .requests import EngineConfig, SimRequest


class CachedMemory(PagedMemory):
    """The paged pool as the blocks of a `PrefixCache` (`cache`). A policy that orders by cached prefix is given
    `cached_tokens` (`Policy.cached`)."""

    stepwise = True  # NOTE: block boundaries are not forecast

    def __init__(
        self,
        cfg: EngineConfig,
        batch: Batch,
        latency: LatencyModel,
        preempt: Callable[[SimRequest], None],
        ledger: Ledger,
    ) -> None:
        super().__init__(cfg, batch, latency, preempt)
        self.cache: PrefixCache = PrefixCache(cfg.kv_tokens // cfg.block_tokens, cfg.block_tokens)  # type: ignore[assignment]
        if ledger.policy.capabilities.uses_prefix_cache:
            ledger.policy.cached = self.cached_tokens

    def budget(self) -> Budget:
        return BlockBudget(self, len(self.batch.running))

    def prefill_s(self, reqs: list[SimRequest], lens: list[int]) -> float:
        cached = [r.held.cached_tokens for r in reqs]  # type: ignore[union-attr]  # NOTE: held once admitted
        return prefill_cached_s(self.latency, [n - c for n, c in zip(lens, cached, strict=True)], cached)

    def keys_of(self, r: SimRequest) -> list:
        """The keys of the blocks its prefill would fill: its prompt's, and after a preemption the output it
        recomputes too (vLLM looks those up as well)."""
        need = r.prompt_tokens + self.extra + r.generated
        if r.keys is None or r.keys_for != need:
            r.keys, r.keys_for = self._chain(r, need), need
        return r.keys

    def _chain(self, r: SimRequest, tokens: int) -> list:
        """The keys of the full blocks of `r`'s first `tokens` tokens (its prompt, then its output)."""
        return prompt_keys(tokens, self.cache.block_tokens, own_name(r), r.prefix)

    def stopped(self, r: SimRequest) -> None:
        """`r` stops running: its blocks go back, every full one it computed kept in the cache (vLLM's rule). Its KV
        holds its prompt and every output token but the last sampled (which was never fed back)."""
        if r.held is not None:
            self.cache.release(r.held, self._chain(r, r.prompt_tokens + self.extra + r.generated - 1))
            r.held = None

    def cached_tokens(self, req: Request) -> int:
        """How many of a waiting request's prompt tokens the cache holds now (what its prefill would not compute)."""
        cache = self.cache
        r: SimRequest = req  # type: ignore[assignment]  # NOTE: the engine's ledger holds only SimRequests
        version, generated, tokens = r.probe
        if version != cache.version or generated != r.generated:  # NOTE: a policy asks at every peek: remember
            tokens = cache.cached_prefix(self.keys_of(r), r.prompt_tokens + self.extra + r.generated)
            tokens *= cache.block_tokens
            r.probe = (cache.version, r.generated, tokens)
        return tokens

    def before_decode(self, n: int) -> int:
        """A block for every running request whose input token (the last one sampled) starts one, as vLLM
        allocates; the newest running requests are preempted while the pool cannot give them."""
        cache, running = self.cache, self.batch.running
        size, extra, step = cache.block_tokens, self.extra - 1, self.batch.step
        while running:
            due = [r for r in running if (r.prompt_tokens + extra + r.generated_at(step)) % size == 0]
            if len(due) <= cache.available:
                break
            self.preempt(next(reversed(running)))
        for r in due if running else ():
            assert r.held is not None
            cache.grow(r.held)
        return len(running)


class BlockBudget:
    """An admission round in blocks: the cached prefix is reused, only the rest is taken (and only the rest counts
    against the prefill budget); an admitted request holds its blocks (`take`, `req.held`)."""

    __slots__ = ("memory", "cache", "prefill_left", "slots", "alone")

    def __init__(self, memory: CachedMemory, n_running: int) -> None:
        self.memory, self.cache = memory, memory.cache
        self.prefill_left = memory.prefill_max
        self.slots = memory.running_max - n_running
        # NOTE: a preempted request's prompt and recomputed output may exceed the prefill budget: it prefills alone
        self.alone = n_running == 0

    def try_add(self, req: SimRequest) -> bool:
        memory, cache = self.memory, self.cache
        need = req.prompt_tokens + memory.extra + req.generated  # a preempted request recomputes its output too
        keys = memory.keys_of(req)
        new = need - cache.cached_prefix(keys, need) * cache.block_tokens
        if (new > self.prefill_left and not self.alone) or self.slots < 1 or not cache.fits(keys, need):
            return False
        self.prefill_left -= new
        self.slots -= 1
        self.alone = False
        if not req.admitted:
            req.cached_tokens = memory.cached_tokens(req)  # NOTE: before the ledger's pop, which charges them
        return True

    def take(self, req: SimRequest) -> None:
        """`req`, accepted by `try_add`, was admitted: it takes its blocks now. NOTE: not in `try_add`, because the
        ledger's `pop` asks the policy again, which must then see the cache as `try_add`'s caller did (lpm and dlpm
        order by it)."""
        held = self.cache.admit(self.memory.keys_of(req), req.prompt_tokens + self.memory.extra + req.generated)
        assert held is not None  # NOTE: its first output token's slot comes with the first decode step
        req.held = held

    def close(self) -> None:
        pass


def own_name(r: SimRequest) -> Hashable:
    """What names the blocks past a request's declared prefix: the segment id its workload continues it as (a later
    prompt that declares that segment shares them, its answer included, as vLLM matching tokens), else its own."""
    return ("own", r.id) if r.continued_as is None else r.continued_as


def hit_rates(records: list, cached: list[int]) -> dict[str, float]:
    """Per client: prompt tokens served from the cache / prompt tokens, over its admitted requests."""
    hits: dict[str, list[int]] = {}
    for rec, c in zip(records, cached, strict=True):
        if rec.admit_s is None:
            continue
        h = hits.setdefault(rec.client, [0, 0])
        h[0] += c
        h[1] += rec.prompt_tokens
    return {client: (h / n if n else 0.0) for client, (h, n) in hits.items()}


def hit_rate(records: list, cached: list[int]) -> float:
    """Over every admitted request: prompt tokens served from the cache / prompt tokens."""
    pairs = [(rec.prompt_tokens, c) for rec, c in zip(records, cached, strict=True) if rec.admit_s is not None]
    total = sum(p for p, _ in pairs)
    return sum(c for _, c in pairs) / total if total else 0.0
