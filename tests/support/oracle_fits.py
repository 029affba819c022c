"""The oracle's admission checks and prefix cache, plainly (`oracle.py`'s step-by-step engine uses them): LightLLM's
reserve check rebuilt from scratch for every running set, the paged check, the per-tenant cap in front of either,
and a prefix cache of reference-counted blocks evicted oldest release first. Nothing here is fast; each is the
definition the engine's faster structures (sim/budget.py, sim/prefix_cache.py) must agree with."""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING

from fairserve.sim.prefix_cache import Held
from fairserve.sim.requests import SimRequest

if TYPE_CHECKING:
    from .oracle import StepEngine


class Index:
    """LightLLM's reserve check for the running batch plus candidates: prefix/suffix maxima over the requests
    sorted by end step (most to go first), built from scratch for every running set (see sim/budget.py)."""

    def __init__(self, running: list[tuple[int, int]]) -> None:
        self.ends = sorted(running, key=lambda e: -e[0])
        self.neg_e = [-e for e, _ in self.ends]
        self.cum, self.prefix = [0], [0]
        for i, (e, t) in enumerate(self.ends, 1):
            self.cum.append(self.cum[-1] + t - e)
            self.prefix.append(max(self.prefix[-1], (e - 1) * i + self.cum[i]))
        n = len(self.ends)
        self.suffix = [float("-inf")] * (n + 2)
        for i in range(n, 0, -1):
            self.suffix[i] = max(self.suffix[i + 1], (self.ends[i - 1][0] - 1) * (i + 1) + self.cum[i])

    def peak_with(self, held: int, left: int, step: int) -> float:
        pos = bisect_right(self.neg_e, -(left + step + 1))
        own = left * (pos + 1) + self.cum[pos] + pos * step + held
        return max(self.prefix[pos], own, self.suffix[pos + 1] - step + held)


class ReserveFits:
    def __init__(self, engine: StepEngine, running: list[SimRequest] | None = None) -> None:
        cfg, self.extra, self.step = engine.config, engine.extra, engine.step
        entries = [
            (r.end_step, r.prompt_tokens + self.extra + r.output_tokens)
            for r in (engine.running if running is None else running)
        ]
        if running is not None:
            self.index = Index(entries)
        else:
            if engine.index is None:  # NOTE: cached while the running set stays the same, as the engine always did
                engine.index = Index(entries)
            self.index = engine.index
        self.kv, self.prefill_left, self.running_max, self.per_client = (
            cfg.kv_tokens,
            cfg.prefill_tokens,
            cfg.running_max,
            cfg.reserve_per_client_tokens,
        )
        self.clients = {r.tenant for r in (engine.running if running is None else running)}

    def __call__(self, req: SimRequest) -> bool:
        need = req.prompt_tokens + self.extra + req.generated
        if need > self.prefill_left or len(self.index.ends) + 1 > self.running_max:
            return False
        held, left = need + 1, req.output_tokens - req.generated - 1
        adapters = len(self.clients) + (req.tenant not in self.clients)
        if self.index.peak_with(held, left, self.step) >= self.kv - self.per_client * adapters:
            return False
        e = self.step + left + 1
        self.index = Index([*self.index.ends, (e, held + e - self.step)])
        self.prefill_left -= need
        self.clients.add(req.tenant)
        return True


class PlainCache:
    """The prefix cache, plainly: a block with content has a key and a reference count; an unreferenced one keeps
    the tick at which it was released (a request's blocks tail first); room is made by evicting the smallest tick."""

    def __init__(self, blocks: int, block_tokens: int) -> None:
        self.blocks, self.block_tokens = blocks, block_tokens
        self.refs: dict = {}  # key -> references (0: cached, evictable)
        self.released: dict = {}  # key -> tick, for refs 0
        self.tick = self.own = 0

    def free(self) -> int:
        return self.blocks - self.own - len(self.refs)

    def available(self) -> int:
        return self.free() + len(self.released)

    def hit(self, keys: list, prompt: int) -> int:
        n, limit = 0, min(len(keys), (prompt - 1) // self.block_tokens)
        while n < limit and keys[n] in self.refs:
            n += 1
        return n

    def take(self, blocks: int) -> None:
        while self.free() < blocks:
            oldest = min(self.released, key=self.released.__getitem__)
            del self.released[oldest], self.refs[oldest]

    def admit(self, keys: list, prompt: int, dry: bool = False) -> Held | None:
        hit = self.hit(keys, prompt)
        total = -(-prompt // self.block_tokens)  # the first output token's slot comes with the first decode step
        if total - hit > self.available() - sum(1 for k in keys[:hit] if self.refs[k] == 0):
            return None
        if dry:
            return Held()
        for k in keys[:hit]:
            self.refs[k] += 1
            self.released.pop(k, None)
        self.take(total - hit)
        fresh = [k for k in keys[hit:] if k not in self.refs]
        for k in fresh:
            self.refs[k] = 1
        held = Held(keys=keys[:hit] + fresh, own=total - hit - len(fresh), cached_tokens=hit * self.block_tokens)
        self.own += held.own
        return held

    def grow(self, held: Held) -> None:
        assert self.available() >= 1
        self.take(1)
        held.own += 1
        self.own += 1

    def release(self, held: Held, chain: list) -> None:
        """Every full block in `chain` (the request's, in order) it holds as its own is named and kept too, unless
        that content is cached already; then tail first, as the engine."""
        own, order = held.own, []
        for k in chain:
            if k in held.keys:
                order.append(k)
            elif own and k not in self.refs:
                self.refs[k] = 1
                own -= 1
                order.append(k)
        assert set(held.keys) <= set(order)
        for k in reversed(order):
            self.refs[k] -= 1
            if self.refs[k] == 0:
                self.tick += 1
                self.released[k] = self.tick
        self.own -= held.own


class CachedFits:
    """Paged admission on the prefix cache's blocks: the uncached tokens count against the prefill budget."""

    def __init__(self, engine: StepEngine) -> None:
        self.engine, self.prefill_left = engine, engine.config.prefill_tokens
        self.slots = engine.config.running_max - len(engine.running)
        self.alone = not engine.running  # nothing running, nothing taken yet: one request may exceed the budget

    def __call__(self, req: SimRequest) -> bool:
        cache, keys = self.engine.cache, self.engine.keys(req)
        assert cache is not None
        need = req.prompt_tokens + self.engine.extra + req.generated
        new = need - cache.hit(keys, need) * cache.block_tokens
        if (new > self.prefill_left and not self.alone) or self.slots < 1 or cache.admit(keys, need, dry=True) is None:
            return False
        self.prefill_left -= new
        self.slots -= 1
        self.alone = False
        return True

    def take(self, req: SimRequest) -> None:
        """Admitted (after the ledger's pop, which asks the policy again: it must see the cache unchanged)."""
        cache = self.engine.cache
        assert cache is not None
        req.held = cache.admit(self.engine.keys(req), req.prompt_tokens + self.engine.extra + req.generated)
        assert req.held is not None


class PagedFits:
    def __init__(self, engine: StepEngine, running: list[SimRequest] | None = None) -> None:
        cfg, self.extra = engine.config, engine.extra
        used = engine.kv_used  # the running requests' prompts and generated tokens
        if running is not None:
            used = sum(r.prompt_tokens + self.extra + r.generated_at(engine.step) for r in running)
        self.free, self.prefill_left = cfg.kv_tokens - used, cfg.prefill_tokens
        self.slots = cfg.running_max - len(engine.running if running is None else running)
        self.alone = not (engine.running if running is None else running)

    def __call__(self, req: SimRequest) -> bool:
        need = req.prompt_tokens + self.extra + req.generated
        if (need > self.prefill_left and not self.alone) or need + 1 > self.free or self.slots < 1:
            return False
        self.free -= need + 1
        self.prefill_left -= need
        self.slots -= 1
        self.alone = False
        return True


class CapFits:
    """The per-tenant cap on reserved running memory (prompt + max_tokens), in front of the pool's check."""

    def __init__(self, engine: StepEngine, inner: ReserveFits | PagedFits) -> None:
        self.inner, self.cap, self.extra = inner, engine.config.running_cap, engine.extra
        self.held: dict[str, int] = {}
        for r in engine.running:
            self.held[r.tenant] = self.held.get(r.tenant, 0) + r.prompt_tokens + self.extra + r.output_tokens

    def __call__(self, req: SimRequest) -> bool:
        held, tokens = self.held.get(req.tenant, 0), req.prompt_tokens + self.extra + req.output_tokens
        if self.cap is not None and held and held + tokens > self.cap:
            return False
        if not self.inner(req):
            return False
        self.held[req.tenant] = held + tokens
        return True
