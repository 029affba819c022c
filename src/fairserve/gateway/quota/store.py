"""Quota use shared by gateway replicas in Redis: one hash per node and window (`used` and `held` of each measure,
and each replica's own part of them), the check-and-hold one Lua script (atomic across replicas), kept a day past
its window's end.

Each replica also keeps its own part in the process (`OwnUse`), so that Redis losing its data loses no quota use:
the replica writes its part back (`RedisQuotaStore.restore`: its own fields set to what it counted, the totals moved
by the difference), which neither counts twice what another replica wrote back nor what Redis still holds. While
Redis is lost the same part gives the replica's estimate of each quota's use (`Estimate`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .book import Key, LocalStore, Use, latest_windows, window

KEEP = timedelta(days=1)  # a window's use stays readable (and a late settle lands) this long after it ends
RESTORE_CHUNK = 500  # quotas per restore script (Lua's unpack and one script's run time stay small)

# KEYS: the shared state's epoch (`P:e`), the quota's hash; ARGV: the epoch this replica last read, the measure.
# nil: the epoch differs (what Redis holds is not to be read until this replica wrote its use back)
READ_LUA = """
if (redis.call('GET', KEYS[1]) or '') ~= ARGV[1] then return false end
return redis.call('HMGET', KEYS[2], ARGV[2] .. ':used', ARGV[2] .. ':held')
"""

# KEYS: the shared state's epoch, then one hash per wanted quota; ARGV: the epoch this replica last read (a
# different one, or none: Redis lost its data since, and this replica has not written its use back yet), its id,
# then four per quota: measure, limit, amount, expire-at (unix seconds). -1: the epoch differs; i: quota i is used up
HOLD_LUA = """
if (redis.call('GET', KEYS[1]) or '') ~= ARGV[1] then return -1 end
for i = 2, #KEYS do
  local m = ARGV[4 * i - 5]
  local used = tonumber(redis.call('HGET', KEYS[i], m .. ':used') or '0')
  local held = tonumber(redis.call('HGET', KEYS[i], m .. ':held') or '0')
  if used + held >= tonumber(ARGV[4 * i - 4]) then return i - 1 end
end
for i = 2, #KEYS do
  local m, amount = ARGV[4 * i - 5], ARGV[4 * i - 3]
  redis.call('HINCRBYFLOAT', KEYS[i], m .. ':held', amount)
  redis.call('HINCRBYFLOAT', KEYS[i], m .. ':held:' .. ARGV[2], amount)
  redis.call('EXPIREAT', KEYS[i], ARGV[4 * i - 2])
end
return 0
"""

# ARGV: the replica's id, then four per key: measure, held amount released, amount used, expire-at. NOTE: a total
# moves by what its replica's own field moves (a hold is released only down to 0), so it stays their sum
SETTLE_LUA = """
for i = 1, #KEYS do
  local m = ARGV[4 * i - 2]
  local own = m .. ':held:' .. ARGV[1]
  local mine = tonumber(redis.call('HGET', KEYS[i], own) or '0')
  local freed = math.min(mine, tonumber(ARGV[4 * i - 1]))
  redis.call('HINCRBYFLOAT', KEYS[i], own, -freed)
  local held = tonumber(redis.call('HINCRBYFLOAT', KEYS[i], m .. ':held', -freed))
  if held < 0 then redis.call('HSET', KEYS[i], m .. ':held', 0) end
  redis.call('HINCRBYFLOAT', KEYS[i], m .. ':used', ARGV[4 * i])
  redis.call('HINCRBYFLOAT', KEYS[i], m .. ':used:' .. ARGV[1], ARGV[4 * i])
  redis.call('EXPIREAT', KEYS[i], ARGV[4 * i + 1])
end
return 0
"""

# ARGV: the replica's id, then four per key: measure, its used, its held, expire-at: its own fields become these,
# and each total moves by as much
RESTORE_LUA = """
for i = 1, #KEYS do
  local m = ARGV[4 * i - 2]
  for j, part in ipairs({':used', ':held'}) do
    local own = m .. part .. ':' .. ARGV[1]
    local want = ARGV[4 * i - 2 + j]
    local diff = tonumber(want) - tonumber(redis.call('HGET', KEYS[i], own) or '0')
    if diff ~= 0 then
      redis.call('HINCRBYFLOAT', KEYS[i], m .. part, diff)
      redis.call('HSET', KEYS[i], own, want)
    end
  end
  redis.call('EXPIREAT', KEYS[i], ARGV[4 * i + 1])
end
return 0
"""


class DataLost(Exception):
    """Redis lost its data (its epoch changed) since this replica last synced: nothing is read or held there until
    this replica wrote its use back."""


class RedisQuotaStore:
    """The quotas in Redis, for one replica (`replica`: its own fields; `epoch`: the shared state's epoch it last
    read, "" without a shared state)."""

    def __init__(
        self, client: Any, prefix: str = "fairserve", replica: str = "", epoch: Callable[[], str] = lambda: ""
    ) -> None:
        self.client, self.prefix, self.replica, self.epoch = client, prefix, replica, epoch
        self._epoch_key = f"{prefix}:e"  # NOTE: the shared state's (redis_scripts.py), set again by its next sync
        self._read = client.register_script(READ_LUA)
        self._hold = client.register_script(HOLD_LUA)
        self._settle = client.register_script(SETTLE_LUA)
        self._restore = client.register_script(RESTORE_LUA)

    def _name(self, key: Key) -> str:
        path, per, start, _ = key
        return f"{self.prefix}:quota:{per}:{int(start.timestamp())}:{path}"

    async def read(self, key: Key) -> Use:
        got = await self._read(keys=[self._epoch_key, self._name(key)], args=[self.epoch(), key[3]])
        if got is None:
            raise DataLost("Redis lost its data")
        used, held = got
        return Use(float(used or 0), float(held or 0))

    async def try_hold(self, wanted: Sequence[tuple[Key, float, float]], ends: Sequence[datetime]) -> int | None:
        args: list[Any] = [self.epoch(), self.replica]
        for (key, limit, amount), end in zip(wanted, ends, strict=True):
            args += [key[3], repr(limit), repr(amount), _expiry(end)]
        bad = int(await self._hold(keys=[self._epoch_key, *(self._name(k) for k, _, _ in wanted)], args=args))
        if bad < 0:
            raise DataLost("Redis lost its data")
        return bad - 1 if bad else None

    async def settle(self, changes: Sequence[tuple[Key, float, float]], ends: Sequence[datetime]) -> None:
        args: list[Any] = [self.replica]
        for (key, released, used), end in zip(changes, ends, strict=True):
            args += [key[3], repr(released), repr(used), _expiry(end)]
        await self._settle(keys=[self._name(k) for k, _, _ in changes], args=args)

    async def restore(self, uses: Sequence[tuple[Key, Use]]) -> None:
        """This replica's own part of each quota set to `uses` (what it counted), each total moved by as much."""
        for a in range(0, len(uses), RESTORE_CHUNK):
            chunk = uses[a : a + RESTORE_CHUNK]
            args: list[Any] = [self.replica]
            for key, use in chunk:
                args += [key[3], repr(use.used), repr(use.held), _expiry(window(key[1], key[2])[1])]
            await self._restore(keys=[self._name(k) for k, _ in chunk], args=args)


def _expiry(end: datetime) -> int:
    return int((end + KEEP).timestamp())


@dataclass
class OwnUse(LocalStore):
    """This replica's own part of each quota's use in Redis (what it holds and used; `add` and `settle` follow every
    hold and settle it makes, in Redis or not), and what it last read there of each quota's total (`seen`)."""

    # per quota: the total last read, and this replica's own used + held at that moment
    seen: dict[Key, tuple[Use, float]] = field(default_factory=dict)
    version: int = 0  # counts the changes to `uses`: a write-back is complete when none came during it
    prune_at: int = 64  # entries at which ended windows are dropped next (twice what was kept: amortized O(1))

    def add(self, wanted: Sequence[tuple[Key, float, float]]) -> None:
        super().add(wanted)
        self.version += 1

    async def settle(self, changes: Sequence[tuple[Key, float, float]], ends: Sequence[datetime]) -> None:
        await super().settle(changes, ends)
        self.version += 1

    def saw(self, key: Key, total: Use) -> None:
        self.seen[key] = (total, self._mine(key))
        self._forget_ended()

    def _mine(self, key: Key) -> float:
        use = self._use(key)
        return use.used + use.held

    def estimate(self, key: Key, replicas: int) -> Use:
        """The quota's use as last read, plus `replicas` times what this replica added since (as if every replica
        it last saw alive used as much); only its own use when it has read none this window."""
        total, then = self.seen.get(key, (Use(), 0.0))
        return Use(total.used + replicas * max(0.0, self._mine(key) - then), total.held)

    def parts(self) -> list[tuple[Key, Use]]:
        """A copy of this replica's part of each quota, to write back."""
        return [(key, Use(u.used, u.held)) for key, u in self.uses.items()]

    def _forget_ended(self) -> None:
        """Windows that ended with nothing held are dropped (those of a node's latest window are kept)."""
        if len(self.uses) + len(self.seen) > self.prune_at:
            latest = latest_windows([*self.uses, *self.seen])
            self.uses = {k: u for k, u in self.uses.items() if k[2] == latest[k[:2]] or u.held > 0}
            self.seen = {k: v for k, v in self.seen.items() if k[2] == latest[k[:2]]}
            self.prune_at = 2 * (len(self.uses) + len(self.seen)) + 64


class MirroredStore:
    """Redis, with this replica's own part followed beside it (`OwnUse`): each write once it is done."""

    def __init__(self, redis: RedisQuotaStore, own: OwnUse) -> None:
        self.redis, self.own = redis, own

    async def read(self, key: Key) -> Use:
        use = await self.redis.read(key)
        self.own.saw(key, use)
        return use

    async def try_hold(self, wanted: Sequence[tuple[Key, float, float]], ends: Sequence[datetime]) -> int | None:
        bad = await self.redis.try_hold(wanted, ends)
        if bad is None:
            self.own.add(wanted)
        return bad

    async def settle(self, changes: Sequence[tuple[Key, float, float]], ends: Sequence[datetime]) -> None:
        await self.redis.settle(changes, ends)
        await self.own.settle(changes, ends)


class Estimate:
    """The quotas while Redis is lost, from this replica's own part alone (`OwnUse.estimate`): each replica then
    lets a node use about its share (1 / the replicas) of what was left at its last read."""

    def __init__(self, own: OwnUse, replicas: Callable[[], int]) -> None:
        self.own, self.replicas = own, replicas

    async def read(self, key: Key) -> Use:
        return self.own.estimate(key, max(1, self.replicas()))

    async def try_hold(self, wanted: Sequence[tuple[Key, float, float]], ends: Sequence[datetime]) -> int | None:
        for i, (key, limit, _) in enumerate(wanted):
            use = await self.read(key)
            if use.used + use.held >= limit:
                return i
        self.own.add(wanted)
        return None

    async def settle(self, changes: Sequence[tuple[Key, float, float]], ends: Sequence[datetime]) -> None:
        await self.own.settle(changes, ends)
