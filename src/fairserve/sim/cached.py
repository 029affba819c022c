"""The event engine's prefix cache (paged mode, `EngineConfig.prefix_cache`), as a mixin of `SimEngine`.

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

from .prefix_cache import PrefixCache, prompt_keys

if TYPE_CHECKING:
    from ..core.ledger import Ledger
    from ..core.request import Request
    from .requests import EngineConfig, SimRequest


class PrefixCaching:
    """The prefix cache's part of `SimEngine`, which holds the state it reads."""

    ledger: Ledger
    config: EngineConfig
    step: int
    running: dict[SimRequest, None]
    cache: PrefixCache | None
    _extra: int
    _preempt: Callable[[SimRequest], None]

    def _open_cache(self) -> None:
        cfg, policy = self.config, self.ledger.policy
        self.cache = PrefixCache(cfg.kv_tokens // cfg.block_tokens, cfg.block_tokens) if cfg.prefix_cache else None
        if policy.capabilities.uses_prefix_cache:
            if self.cache is None:
                raise ValueError(
                    f"policy {policy.name!r} orders by cached prefix: run it on the paged engine with the prefix cache"
                )
            policy.cached = self.cached_tokens

    def keys_of(self, r: SimRequest) -> list:
        """The keys of the blocks its prefill would fill: its prompt's, and after a preemption the output it
        recomputes too (vLLM looks those up as well)."""
        need = r.prompt_tokens + self._extra + r.generated
        if r.keys is None or r.keys_for != need:
            r.keys, r.keys_for = self._chain(r, need), need
        return r.keys

    def _chain(self, r: SimRequest, tokens: int) -> list:
        """The keys of the full blocks of `r`'s first `tokens` tokens (its prompt, then its output)."""
        assert self.cache is not None
        return prompt_keys(tokens, self.cache.block_tokens, own_name(r), r.prefix)

    def _release(self, r: SimRequest) -> None:
        """`r` stops running: its blocks go back, every full one it computed kept in the cache (vLLM's rule). Its KV
        holds its prompt and every output token but the last sampled (which was never fed back)."""
        assert self.cache is not None and r.held is not None
        self.cache.release(r.held, self._chain(r, r.prompt_tokens + self._extra + r.generated - 1))
        r.held = None

    def cached_tokens(self, req: Request) -> int:
        """How many of a waiting request's prompt tokens the cache holds now (what its prefill would not compute)."""
        cache = self.cache
        assert cache is not None
        r: SimRequest = req  # type: ignore[assignment]  # NOTE: the engine's ledger holds only SimRequests
        version, generated, tokens = r.probe
        if version != cache.version or generated != r.generated:  # NOTE: a policy asks at every peek: remember
            tokens = cache.cached_prefix(self.keys_of(r), r.prompt_tokens + self._extra + r.generated)
            tokens *= cache.block_tokens
            r.probe = (cache.version, r.generated, tokens)
        return tokens

    def _grow_blocks(self) -> None:
        """Before a decode step: a block for every running request whose input token (the last one sampled) starts
        one, as vLLM allocates; the newest running requests are preempted while the pool cannot give them."""
        cache = self.cache
        assert cache is not None
        size, extra, step = cache.block_tokens, self._extra - 1, self.step
        while self.running:
            due = [r for r in self.running if (r.prompt_tokens + extra + r.generated_at(step)) % size == 0]
            if len(due) <= cache.available:
                break
            self._preempt(next(reversed(self.running)))
        for r in due if self.running else ():
            assert r.held is not None
            cache.grow(r.held)


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
