"""Quotas beside fair share: a tenant or a group may use at most N tokens (raw prompt + output tokens, what is
billed) and/or S service (`w_p·prompt + w_q·output`, the fairness unit) per hour, day or calendar month, in windows
aligned to UTC.

A request holds its bound (its prompt + `max_tokens`, and their service) against every quota on its path while it
runs, and is let through only while `used + held < limit` on each: so the quota is overshot by at most the bound of
the one request that was let through last (its final cost is unknown when it starts), and a window's use ends at
most one bound above its limit. When it ends, the hold is replaced by what it really used. Out of quota: the
window's end says when to retry (`Exhausted.retry_after_s`).

`QuotaBook` keeps the use of one process; `store` (`quota_store.RedisQuotaStore`) shares it across replicas, with
the same check-and-hold done atomically in Redis.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal, Protocol

Period = Literal["hour", "day", "month"]
PERIODS: tuple[Period, ...] = ("hour", "day", "month")
MEASURES = ("tokens", "service")


@dataclass(frozen=True)
class Quota:
    per: Period
    tokens: int | None = None  # raw prompt + output tokens in a window
    service: float | None = None  # weighted service in a window

    def __post_init__(self) -> None:
        if self.per not in PERIODS:
            raise ValueError(f"a quota's `per` must be one of {', '.join(PERIODS)}, got {self.per!r}")
        if self.tokens is None and self.service is None:
            raise ValueError("a quota needs `tokens`, `service` or both")
        for name in MEASURES:
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not math.isfinite(v) or v <= 0):
                raise ValueError(f"a quota's `{name}` must be a number > 0, got {v!r}")

    def limit(self, measure: str) -> float | None:
        return self.tokens if measure == "tokens" else self.service


def window(per: Period, now: datetime) -> tuple[datetime, datetime]:
    """The window [start, end) holding `now`, in UTC."""
    now = now.astimezone(UTC)
    if per == "hour":
        start = now.replace(minute=0, second=0, microsecond=0)
        return start, start + timedelta(hours=1)
    start = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if per == "day":
        return start, start + timedelta(days=1)
    start = start.replace(day=1)
    end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    return start, end


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Use:
    """A node's use of one measure in one window: what finished requests used, and the bounds of running ones."""

    used: float = 0.0
    held: float = 0.0


@dataclass(frozen=True)
class Exhausted:
    path: str  # the tenant or group whose quota is used up
    measure: str  # "tokens" or "service"
    limit: float
    used: float
    window_end: datetime
    retry_after_s: int  # whole seconds to the window's end, at least 1

    def message(self) -> str:
        return (
            f"{self.path!r} has used its quota of {self.limit:g} {self.measure} (used {self.used:g}); it resets at "
            f"{self.window_end.isoformat()}"
        )


@dataclass(frozen=True)
class Hold:
    """The bound a request holds on each quota of its path, in the windows it started in."""

    keys: tuple[tuple[str, Period, datetime, str, float], ...]  # (path, per, window start, measure, amount)


@dataclass(frozen=True)
class Cost:
    tokens: float
    service: float

    def of(self, measure: str) -> float:
        return self.tokens if measure == "tokens" else self.service


Key = tuple[str, Period, datetime, str]  # (path, per, window start, measure)


class QuotaStore(Protocol):
    """Where use is kept: this process (`LocalStore`) or Redis, shared by replicas."""

    async def read(self, key: Key) -> Use: ...

    async def try_hold(self, wanted: Sequence[tuple[Key, float, float]], ends: Sequence[datetime]) -> int | None:
        """Atomically: if every key's used + held < its limit, add each amount to its held and return None; else
        change nothing and return the index of the first key out of quota. `wanted`: (key, limit, amount)."""
        ...

    async def settle(self, changes: Sequence[tuple[Key, float, float]], ends: Sequence[datetime]) -> None:
        """For each (key, held amount released, amount used): held -= released, used += used."""
        ...


@dataclass
class LocalStore:
    uses: dict[Key, Use] = field(default_factory=dict)

    async def read(self, key: Key) -> Use:
        return self._use(key)

    def _use(self, key: Key) -> Use:
        return self.uses.get(key) or Use()

    async def try_hold(self, wanted: Sequence[tuple[Key, float, float]], ends: Sequence[datetime]) -> int | None:
        for i, (key, limit, _) in enumerate(wanted):
            use = self._use(key)
            if use.used + use.held >= limit:
                return i
        self.add(wanted)
        return None

    def add(self, wanted: Sequence[tuple[Key, float, float]]) -> None:
        """Each amount added to its key's held, unchecked."""
        for key, _, amount in wanted:
            self.uses.setdefault(key, Use()).held += amount
        self._forget_ended()

    async def settle(self, changes: Sequence[tuple[Key, float, float]], ends: Sequence[datetime]) -> None:
        for key, released, used in changes:
            use = self.uses.setdefault(key, Use())
            use.held = max(0.0, use.held - released)
            use.used += used

    def _forget_ended(self) -> None:
        """Windows that ended with nothing held are dropped (a long-running gateway keeps the current ones)."""
        if len(self.uses) > 4 * len({k[:2] for k in self.uses}):
            latest = latest_windows(self.uses)
            self.uses = {k: u for k, u in self.uses.items() if k[2] == latest[k[:2]] or u.held > 0}


def latest_windows(keys: Iterable[Key]) -> dict[tuple[str, Period], datetime]:
    """The start of the latest window among `keys`, per node and period."""
    latest: dict[tuple[str, Period], datetime] = {}
    for path, per, start, _ in keys:
        latest[path, per] = max(start, latest.get((path, per), start))
    return latest


class QuotaBook:
    """The quotas of the tree's nodes (by path) and their use; `paths` of a request: its tenant and its groups."""

    def __init__(
        self,
        quotas: dict[str, Quota],
        store: QuotaStore | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.quotas, self.store, self.clock = dict(quotas), store or LocalStore(), clock

    def _wanted(self, paths: Sequence[str], now: datetime) -> list[tuple[Key, float, datetime]]:
        out = []
        for path in paths:
            q = self.quotas.get(path)
            if q is None:
                continue
            start, end = window(q.per, now)
            for measure in MEASURES:
                limit = q.limit(measure)
                if limit is not None:
                    out.append(((path, q.per, start, measure), float(limit), end))
        return out

    async def _exhausted(self, key: Key, limit: float, end: datetime, now: datetime) -> Exhausted:
        use = await self.store.read(key)
        retry = max(1, math.ceil((end - now).total_seconds()))
        return Exhausted(key[0], key[3], limit, use.used + use.held, end, retry)

    async def check(self, paths: Sequence[str]) -> Exhausted | None:
        """At arrival: the first quota on the path that is used up (held bounds count as used), else None."""
        now = self.clock()
        for key, limit, end in self._wanted(paths, now):
            use = await self.store.read(key)
            if use.used + use.held >= limit:
                return await self._exhausted(key, limit, end, now)
        return None

    async def hold(self, paths: Sequence[str], bound: Cost) -> Hold | Exhausted:
        """At dispatch: hold the request's bound on every quota of its path, or say which one is used up."""
        now = self.clock()
        wanted = self._wanted(paths, now)
        if not wanted:
            return Hold(())
        ends = [end for _, _, end in wanted]
        bad = await self.store.try_hold([(key, limit, bound.of(key[3])) for key, limit, _ in wanted], ends)
        if bad is not None:
            key, limit, end = wanted[bad]
            return await self._exhausted(key, limit, end, now)
        return Hold(tuple((*key, bound.of(key[3])) for key, _, _ in wanted))

    async def settle(self, hold: Hold, used: Cost) -> None:
        """The request ended: its hold is released and what it used is counted, in the windows it started in."""
        if hold.keys:
            changes = [((path, per, start, m), amount, used.of(m)) for path, per, start, m, amount in hold.keys]
            await self.store.settle(changes, [window(per, start)[1] for _, per, start, _, _ in hold.keys])

    async def status(self, path: str) -> dict[str, dict[str, float | str]]:
        """Used, held, limit and remaining of each measure of a node's quota in the current window (admin, metrics)."""
        q = self.quotas.get(path)
        if q is None:
            return {}
        now = self.clock()
        start, end = window(q.per, now)
        out: dict[str, dict[str, float | str]] = {}
        for measure in MEASURES:
            limit = q.limit(measure)
            if limit is not None:
                use = await self.store.read((path, q.per, start, measure))
                out[measure] = {
                    "limit": float(limit),
                    "used": use.used,
                    "held": use.held,
                    "remaining": max(0.0, limit - use.used - use.held),
                    "resets_at": end.isoformat(),
                }
        return out
