"""The paged engine's prefix cache: KV blocks named by the prefix they hold, shared while referenced, kept after use
and evicted least recently used when the pool needs room (vLLM's automatic prefix caching, in block counts).

A block's key names its content and everything before it (vLLM chains a hash over the prefix; here a block of a
shared prefix is keyed by the id of the prefix segment that holds its last token and the block's end, which names the
same thing: `Arrival.prefix`, docs/workloads.md). At admission the prompt's full blocks get a key; the partial last
block and decode blocks are the request's own (`Held.own`); when it ends, those that are full are named by the
request's chain too and kept (vLLM caches every full block), the rest freed (and reused first, as vLLM's free queue
hands out blocks without a hash before it evicts cached ones). A block is in exactly one place: `free` (no
content), `unused` (content, no reference: evictable, oldest first) or `refs` (content, referenced by running
requests)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

DEFAULT_BLOCK_TOKENS = 16  # vLLM's default on GPUs; its CPU build needs a multiple of 32


def prompt_keys(
    prompt_tokens: int, block_tokens: int, own: Hashable, prefix: Sequence[tuple[Hashable, int]] = ()
) -> list[Hashable]:
    """The keys of a prompt's full blocks. `prefix` is `Arrival.prefix`: segments (id, tokens), each id naming the
    whole prefix up to its segment's end. A block inside the prefix is `(id of the segment holding its last token,
    its end)`; a block past it is `(own, its end)`: once a request stops sharing, the rest of its chain is its own."""
    keys: list[Hashable] = []
    covered = 0
    segments = iter(prefix)
    name: Hashable = own
    for end in range(block_tokens, prompt_tokens + 1, block_tokens):
        while covered < end:
            seg = next(segments, None)
            if seg is None:
                name, covered = own, prompt_tokens
                break
            name, covered = seg[0], covered + seg[1]
        keys.append((name, end))
    return keys


@dataclass
class Held:
    """What one running request holds: its keyed prompt blocks (each one reference) and its own blocks."""

    keys: list[Hashable] = field(default_factory=list)
    own: int = 0
    cached_tokens: int = 0  # prompt tokens found in the cache at admission (not computed by its prefill)


class PrefixCache:
    def __init__(self, num_blocks: int, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> None:
        if num_blocks < 1 or block_tokens < 1:
            raise ValueError(f"a prefix cache needs >= 1 block of >= 1 token, got {num_blocks} x {block_tokens}")
        self.num_blocks, self.block_tokens = num_blocks, block_tokens
        self.free = num_blocks
        self.unused: OrderedDict[Hashable, None] = OrderedDict()  # least recently used first
        self.refs: dict[Hashable, int] = {}
        self.own = 0  # blocks held by running requests outside any key
        self.hit_tokens = self.queried_tokens = 0  # over admissions: prompt tokens found / looked up
        self.version = 0  # changes whenever the set of cached keys does (what `cached_prefix` answers from)

    @property
    def available(self) -> int:
        """Blocks a request could get now: the free ones and the evictable ones."""
        return self.free + len(self.unused)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    def cached_prefix(self, keys: Sequence[Hashable], prompt_tokens: int) -> int:
        """How many leading keys are in the cache, at most the blocks before the prompt's last token (as vLLM: the
        last token is always computed, for the logits of the first output token)."""
        limit = min(len(keys), (prompt_tokens - 1) // self.block_tokens)
        n = 0
        while n < limit and (keys[n] in self.refs or keys[n] in self.unused):
            n += 1
        return n

    def fits(self, keys: Sequence[Hashable], prompt_tokens: int, extra_tokens: int = 0) -> bool:
        """Whether `admit` would succeed now (nothing changes)."""
        hit = self.cached_prefix(keys, prompt_tokens)
        reused = sum(1 for k in keys[:hit] if k in self.unused)
        # NOTE: reused unreferenced blocks leave `unused` without freeing anything, so they do not count as room
        return self.blocks_for(prompt_tokens + extra_tokens) - hit <= self.free + len(self.unused) - reused

    def admit(self, keys: Sequence[Hashable], prompt_tokens: int, extra_tokens: int = 0) -> Held | None:
        """Blocks for a prompt (and `extra_tokens` beyond it, e.g. the first output token), reusing its cached
        prefix; None, with nothing changed, when the pool cannot make room."""
        if not self.fits(keys, prompt_tokens, extra_tokens):
            return None
        hit = self.cached_prefix(keys, prompt_tokens)
        total = self.blocks_for(prompt_tokens + extra_tokens)
        for k in keys[:hit]:
            self._ref(k)
        self._take(total - hit)
        # NOTE: after the evictions: a block evicted to make room is computed again, so it is named again
        fresh = [k for k in keys[hit:] if k not in self.refs and k not in self.unused]
        held = Held(keys=list(keys[:hit]), own=total - hit, cached_tokens=hit * self.block_tokens)
        # the prompt's newly computed full blocks get their key: a later request can hit them
        for k in fresh:
            self.refs[k] = 1
        if fresh:
            self.version += 1
        held.keys += fresh
        held.own -= len(fresh)
        self.own += held.own
        self.hit_tokens += held.cached_tokens
        self.queried_tokens += prompt_tokens
        return held

    def grow(self, held: Held, blocks: int = 1) -> bool:
        """`blocks` more own blocks for a running request (decode crossing a block boundary); False if no room."""
        if blocks > self.available:
            return False
        self._take(blocks)
        held.own += blocks
        self.own += blocks
        return True

    def release(self, held: Held, chain: Sequence[Hashable] = ()) -> None:
        """The request ended or was preempted: its own blocks are freed, its keyed blocks lose a reference (and are
        kept while nothing else needs the room). `chain`: the keys of every full block the request computed, in
        order (`prompt_keys` over the tokens in its KV cache, its output included): its own blocks among them are
        kept too, named (vLLM caches every full block), unless their content is cached already. NOTE: tail first,
        so a prefix's last blocks are evicted before its first ones (as vLLM), and what stays cached is still a
        prefix."""
        order: Sequence[Hashable] = held.keys
        own = held.own
        if chain:
            mine, named = set(held.keys), []
            for k in chain:
                if k in mine:
                    named.append(k)
                elif own and k not in self.refs and k not in self.unused:
                    self.refs[k] = 1  # NOTE: one of its own blocks, named now
                    own -= 1
                    named.append(k)
            if len(named) - (held.own - own) != len(held.keys):
                raise ValueError("release: the chain does not hold every keyed block of the request")
            if own != held.own:
                self.version += 1
            order = named
        for k in reversed(order):
            n = self.refs[k] - 1
            if n:
                self.refs[k] = n
            else:
                del self.refs[k]
                self.unused[k] = None
        self.free += own
        self.own -= held.own
        held.keys, held.own = [], 0

    def _ref(self, key: Hashable) -> None:
        if key in self.unused:
            del self.unused[key]
            self.refs[key] = 1
        else:
            self.refs[key] += 1

    def _take(self, blocks: int) -> None:
        """Takes `blocks` blocks (the caller checked there is room), evicting the least recently used first."""
        from_free = min(blocks, self.free)
        self.free -= from_free
        if blocks > from_free:
            self.version += 1
        for _ in range(blocks - from_free):
            self.unused.popitem(last=False)

    def check(self) -> None:
        """Every block is in one place (for tests)."""
        assert self.free >= 0 and self.own >= 0
        assert self.free + len(self.unused) + len(self.refs) + self.own == self.num_blocks
        assert not (self.unused.keys() & self.refs.keys())
