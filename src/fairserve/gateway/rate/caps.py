"""Rate caps: a tenant or a group may send at most N requests and/or M tokens per minute (`rate = { requests = N,
tokens = M }`), a product limit beside quotas and fair share.

A request is counted at arrival, in the minute it arrives: one request, and its footprint's tokens (its prompt
estimate + its output bound, gateway/admission/footprint.py), on every cap of its path (its tenant's and its
groups'). It is let through while each of them is below its limit (`count < limit`, on each measure it caps), and
then counted on all of them at once; a request refused is counted on none (a client that retries when told is not
kept out by its own retries). So a minute's requests never exceed a cap, and its tokens end at most one request's
footprint above it. Windows are fixed UTC minutes [hh:mm:00, hh:mm+1:00): `Limited.retry_after_s` is the seconds to
the minute's end, rounded up, at least 1.

`RateBook` keeps the counts of one process (`LocalCounts`); gateway/rate/store.py shares them across replicas in
Redis, with the same check-and-count done atomically there.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

WINDOW_S = 60  # a cap's window: one UTC minute
MEASURES = ("requests", "tokens")


@dataclass(frozen=True)
class RateCap:
    requests: int | None = None  # requests per minute
    tokens: int | None = None  # footprint tokens (prompt + output bound) per minute

    def __post_init__(self) -> None:
        if self.requests is None and self.tokens is None:
            raise ValueError("a rate cap needs `requests`, `tokens` or both (per minute)")
        for name in MEASURES:
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                raise ValueError(f"a rate cap's `{name}` must be an integer > 0, got {v!r}")

    def limit(self, measure: str) -> int | None:
        return self.requests if measure == "requests" else self.tokens


def minute(now: float) -> tuple[int, int]:
    """The window [start, end) holding `now` (unix seconds): its UTC minute."""
    start = int(now // WINDOW_S) * WINDOW_S
    return start, start + WINDOW_S


@dataclass
class Count:
    """A node's count in one minute: the requests let through, and their footprints' tokens."""

    requests: int = 0
    tokens: int = 0

    def of(self, measure: str) -> int:
        return self.requests if measure == "requests" else self.tokens


Key = tuple[str, int]  # (path, the minute's start)
Wanted = Sequence[tuple[Key, RateCap]]


def over(cap: RateCap, count: Count) -> str | None:
    """The first measure of `cap` that `count` has reached, else None."""
    for measure in MEASURES:
        limit = cap.limit(measure)
        if limit is not None and count.of(measure) >= limit:
            return measure
    return None


def first_over(wanted: Wanted, counts: Sequence[Count]) -> int | None:
    """The index of the first key of `wanted` whose count has reached its cap, else None."""
    return next((i for i, ((_, cap), c) in enumerate(zip(wanted, counts, strict=True)) if over(cap, c)), None)


@dataclass(frozen=True)
class Limited:
    path: str  # the tenant or group at its cap
    measure: str  # "requests" or "tokens"
    limit: int
    used: int
    window_end: int  # unix seconds
    retry_after_s: int  # whole seconds to the minute's end, at least 1

    def message(self) -> str:
        ends = datetime.fromtimestamp(self.window_end, UTC).isoformat()
        return (
            f"{self.path!r} is at its rate cap of {self.limit} {self.measure} per minute (counted {self.used}); the "
            f"minute ends at {ends}"
        )


class RateStore(Protocol):
    """Where counts are kept: this process (`LocalCounts`) or Redis, shared by replicas."""

    async def read(self, key: Key) -> Count: ...

    async def try_count(self, wanted: Wanted, tokens: int, end: int) -> tuple[int | None, list[Count]]:
        """Atomically: if no key has reached its cap, add one request and `tokens` to each and return (None, the
        counts after); else change nothing and return (the index of the first key at its cap, the counts read)."""
        ...


@dataclass
class LocalCounts:
    counts: dict[Key, Count] = field(default_factory=dict)
    latest: int = 0  # the latest minute counted in

    async def read(self, key: Key) -> Count:
        return self.counts.get(key) or Count()

    async def try_count(self, wanted: Wanted, tokens: int, end: int) -> tuple[int | None, list[Count]]:
        counts = [await self.read(key) for key, _ in wanted]
        if (bad := first_over(wanted, counts)) is not None:
            return bad, counts
        return None, self.add([key for key, _ in wanted], tokens)

    def add(self, keys: Sequence[Key], tokens: int) -> list[Count]:
        """One request and `tokens` added to each key's count, unchecked; the counts after."""
        out = []
        for key in keys:
            count = self.counts.setdefault(key, Count())
            count.requests += 1
            count.tokens += tokens
            out.append(Count(count.requests, count.tokens))
        self.forget_before(keys[0][1])
        return out

    def forget_before(self, start: int) -> None:
        """Once a later minute starts, the ended ones are dropped (nothing reads them): once a minute."""
        if start > self.latest:
            self.latest = start
            self.counts = {k: c for k, c in self.counts.items() if k[1] >= start}


class RateBook:
    """The caps of the tree's nodes (by path) and their counts; `paths` of a request: its tenant and its groups."""

    def __init__(
        self, caps: dict[str, RateCap], store: RateStore | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.caps, self.store, self.clock = dict(caps), store or LocalCounts(), clock

    async def count(self, paths: Sequence[str], tokens: int) -> Limited | None:
        """At arrival: count one request of `tokens` on every cap of the path, or say which one it has reached."""
        now = self.clock()
        start, end = minute(now)
        wanted = [((p, start), self.caps[p]) for p in paths if p in self.caps]
        if not wanted:
            return None
        bad, counts = await self.store.try_count(wanted, tokens, end)
        if bad is None:
            return None
        (path, _), cap = wanted[bad]
        measure = over(cap, counts[bad]) or "requests"
        limit = cap.limit(measure)
        assert limit is not None
        retry = max(1, math.ceil(end - now))
        return Limited(path, measure, limit, counts[bad].of(measure), end, retry)

    async def status(self, path: str) -> dict[str, dict[str, int | str]]:
        """Limit, used and remaining of each measure a node caps in the current minute (admin, metrics)."""
        cap = self.caps.get(path)
        if cap is None:
            return {}
        start, end = minute(self.clock())
        count = await self.store.read((path, start))
        out: dict[str, dict[str, int | str]] = {}
        for measure in MEASURES:
            limit = cap.limit(measure)
            if limit is not None:
                used = count.of(measure)
                out[measure] = {
                    "limit": limit,
                    "used": used,
                    "remaining": max(0, limit - used),
                    "resets_at": datetime.fromtimestamp(end, UTC).isoformat(),
                }
        return out
