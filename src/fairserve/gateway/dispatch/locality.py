"""Prefix dispatch (`dispatch = "prefix[:DELTA]"`): where a request's prompt prefix most likely is cached.

The gateway keeps, per backend, the prefix blocks it recently sent there: each request's chained block digests
(api/prefix.py: a digest per full block of 16 tokens of its text, each naming everything before it), in a record of
the most recently used `DEFAULT_BLOCKS` per backend. A request's **home** is the backend whose record holds the
longest run of its leading digests; a prefix seen nowhere gets as home the backend whose record is the smallest, so
new prefixes spread evenly over the backends, each backend's cache holding a share of them, and every later request
of one prefix has the same home (measured in the simulated fleet: spreading new prefixes by load found half the
cache hits, the overflow of one prefix making homes of both backends; hashing them split eight prefixes unevenly). A
request without a whole block has no home (least-loaded, as `least_loaded`).

The record is the gateway's own view, not the backend's cache: a backend that evicted a prefix is still its home
until the record forgets it; sending it there again fills the cache again. The admission rule that uses the home,
and what it costs in fairness, is in gateway/dispatch/pools.py (`Dispatch._near`) and docs/gateway.md (Dispatch).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from ...api.prefix import block_digests
from ...api.tokens import messages_text

DEFAULT_BLOCKS = 65_536  # digests kept per backend (about 1M tokens of prompts at 16 tokens a block)
BLOCK_TOKENS = 16  # tokens per block of a request's digests


class HasUrl(Protocol):
    @property
    def url(self) -> str: ...


B = TypeVar("B", bound=HasUrl)


class Locality:
    """Per backend URL, the prefix digests recently sent to it, least recently used first."""

    def __init__(self, blocks: int = DEFAULT_BLOCKS) -> None:
        self.blocks = blocks
        self.sent: dict[str, OrderedDict[str, None]] = {}

    def matched(self, url: str, digests: Sequence[str]) -> int:
        """How many of `digests`, from the first, the backend's record holds."""
        seen = self.sent.get(url)
        if not seen:
            return 0
        n = 0
        for d in digests:
            if d not in seen:
                break
            n += 1
        return n

    def home(self, digests: Sequence[str], backends: Sequence[B]) -> B | None:
        """The backend of `backends` whose record holds the longest run of `digests` from the first (the first such
        on a tie), else the one whose record is the smallest; None without digests or backends."""
        if not digests or not backends:
            return None
        best, most = None, 0
        for b in backends:
            n = self.matched(b.url, digests)
            if n > most:
                best, most = b, n
        if best is not None:
            return best
        return min(backends, key=lambda b: len(self.sent.get(b.url, ())))

    def record(self, url: str, digests: Sequence[str]) -> None:
        """`digests` were sent to the backend at `url`: the most recently used there now."""
        seen = self.sent.setdefault(url, OrderedDict())
        for d in digests:
            seen[d] = None
            seen.move_to_end(d)
        while len(seen) > self.blocks:
            seen.popitem(last=False)


def prompt_digests(body: dict[str, Any], chat: bool, prompt_tokens: int) -> tuple[str, ...]:
    """A request body's prompt blocks (api/prefix.py): a chat's messages' text, a completion's prompt (its text or
    token ids; of a list of prompts, the first)."""
    if chat:
        prompt: Any = messages_text(body.get("messages") or [])
    else:
        prompt = body.get("prompt", "")
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            prompt = prompt[0]
    if not isinstance(prompt, str | list):
        return ()
    return tuple(block_digests(prompt, prompt_tokens, BLOCK_TOKENS))
