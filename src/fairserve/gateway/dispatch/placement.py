"""Which of its pool's backends a request may go to: every one (`least_loaded`, the default: the least-loaded backend
with room takes it), its tenant's hand (`shard:K`: shuffle sharding), or, first, its prefix's home (`prefix[:DELTA]`:
gateway/dispatch/locality.py; the rule in gateway/dispatch/pools.py `Dispatch._near`).

Shuffle sharding deals each tenant a deterministic hand of K of the pool's N backends, as Kubernetes' API Priority
and Fairness deals queues: a tenant that floods can fill at most its K backends, and another tenant shares all K
with it only with probability 1 / C(N, K). A hand is drawn by rendezvous hashing (the K backends whose hash with
the tenant's name is highest), so it depends on the tenant and the backends' URLs only: the same on every replica
and across restarts, and adding or removing a backend changes only the hands that held it or now rank it in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar


class HasUrl(Protocol):
    @property
    def url(self) -> str: ...


B = TypeVar("B", bound=HasUrl)

LEAST_LOADED = "least_loaded"
DEFAULT_PREFIX_DELTA = 4096.0  # prefix dispatch: how far (in counter) a request may be overtaken for locality


@dataclass(frozen=True)
class Placement:
    """`least_loaded` (shard None) or `shard:K`."""

    shard: int | None = None  # K: the backends in a tenant's hand; None: every backend of the pool
    prefix_delta: float | None = None  # prefix dispatch: the counter gap a request may be overtaken by; None: off
    _hands: dict[tuple[str, tuple[str, ...]], tuple[int, ...]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def name(self) -> str:
        if self.prefix_delta is not None:
            return f"prefix:{self.prefix_delta:g}"
        return LEAST_LOADED if self.shard is None else f"shard:{self.shard}"

    def hand(self, tenant: str, backends: Sequence[B]) -> Sequence[B]:
        """The backends of `backends` a request of `tenant` may go to (all of them, or its hand of K)."""
        k = self.shard
        if k is None or len(backends) <= k:
            return backends
        urls = tuple(b.url for b in backends)
        picked = self._hands.get((tenant, urls))
        if picked is None:
            ranked = sorted(range(len(urls)), key=lambda i: _score(tenant, urls[i]), reverse=True)
            picked = self._hands[(tenant, urls)] = tuple(sorted(ranked[:k]))
        return [backends[i] for i in picked]


def _score(tenant: str, url: str) -> int:
    digest = hashlib.blake2b(f"{tenant}\n{url}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def parse_placement(text: str) -> Placement:
    """`least_loaded`, `shard:K` (K >= 1) or `prefix[:DELTA]` (DELTA >= 0); ValueError with one line otherwise."""
    text = text.strip()
    if text == LEAST_LOADED:
        return Placement()
    name, _, k = text.partition(":")
    if name == "shard" and k.isdigit() and int(k) >= 1:
        return Placement(int(k))
    if name == "prefix":
        try:
            delta = float(k) if k else DEFAULT_PREFIX_DELTA
        except ValueError:
            delta = -1.0
        if 0 <= delta < float("inf"):
            return Placement(prefix_delta=delta)
    raise ValueError(
        f"dispatch must be {LEAST_LOADED}, shard:K with K >= 1 (backends per tenant) or prefix[:DELTA] with DELTA >= 0 "
        f"(the counter gap a request may be overtaken by for locality), got {text!r}"
    )
