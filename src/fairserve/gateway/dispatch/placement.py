"""Which of its pool's backends a request may go to: every one (`least_loaded`, the default: the least-loaded backend
with room takes it), or its tenant's hand (`shard:K`: shuffle sharding).

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


@dataclass(frozen=True)
class Placement:
    """`least_loaded` (shard None) or `shard:K`."""

    shard: int | None = None  # K: the backends in a tenant's hand; None: every backend of the pool
    _hands: dict[tuple[str, tuple[str, ...]], tuple[int, ...]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def name(self) -> str:
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
    """`least_loaded` or `shard:K` (K >= 1); ValueError with one line otherwise."""
    text = text.strip()
    if text == LEAST_LOADED:
        return Placement()
    name, _, k = text.partition(":")
    if name == "shard" and k.isdigit() and int(k) >= 1:
        return Placement(int(k))
    raise ValueError(f"dispatch must be {LEAST_LOADED} or shard:K with K >= 1 (backends per tenant), got {text!r}")
