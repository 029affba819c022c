"""Quota use shared by gateway replicas in Redis: one hash per node and window (`used` and `held` of each measure),
the check-and-hold one Lua script (atomic across replicas), kept a day past its window's end."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from .quota import Key, Use

KEEP = timedelta(days=1)  # a window's use stays readable (and a late settle lands) this long after it ends

# KEYS: one hash per wanted quota; ARGV, four per key: measure, limit, amount, expire-at (unix seconds)
HOLD_LUA = """
for i = 1, #KEYS do
  local m = ARGV[4 * i - 3]
  local used = tonumber(redis.call('HGET', KEYS[i], m .. ':used') or '0')
  local held = tonumber(redis.call('HGET', KEYS[i], m .. ':held') or '0')
  if used + held >= tonumber(ARGV[4 * i - 2]) then return i end
end
for i = 1, #KEYS do
  redis.call('HINCRBYFLOAT', KEYS[i], ARGV[4 * i - 3] .. ':held', ARGV[4 * i - 1])
  redis.call('EXPIREAT', KEYS[i], ARGV[4 * i])
end
return 0
"""

# ARGV, four per key: measure, held amount released, amount used, expire-at
SETTLE_LUA = """
for i = 1, #KEYS do
  local m = ARGV[4 * i - 3]
  local held = tonumber(redis.call('HINCRBYFLOAT', KEYS[i], m .. ':held', -tonumber(ARGV[4 * i - 2])))
  if held < 0 then redis.call('HSET', KEYS[i], m .. ':held', 0) end
  redis.call('HINCRBYFLOAT', KEYS[i], m .. ':used', ARGV[4 * i - 1])
  redis.call('EXPIREAT', KEYS[i], ARGV[4 * i])
end
return 0
"""


class RedisQuotaStore:
    def __init__(self, client: Any, prefix: str = "fairserve") -> None:
        self.client, self.prefix = client, prefix
        self._hold = client.register_script(HOLD_LUA)
        self._settle = client.register_script(SETTLE_LUA)

    def _name(self, key: Key) -> str:
        path, per, start, _ = key
        return f"{self.prefix}:quota:{per}:{int(start.timestamp())}:{path}"

    async def read(self, key: Key) -> Use:
        used, held = await self.client.hmget(self._name(key), f"{key[3]}:used", f"{key[3]}:held")
        return Use(float(used or 0), float(held or 0))

    async def try_hold(self, wanted: Sequence[tuple[Key, float, float]], ends: Sequence[datetime]) -> int | None:
        args: list[Any] = []
        for (key, limit, amount), end in zip(wanted, ends, strict=True):
            args += [key[3], repr(limit), repr(amount), int((end + KEEP).timestamp())]
        bad = int(await self._hold(keys=[self._name(k) for k, _, _ in wanted], args=args))
        return bad - 1 if bad else None

    async def settle(self, changes: Sequence[tuple[Key, float, float]], ends: Sequence[datetime]) -> None:
        args: list[Any] = []
        for (key, released, used), end in zip(changes, ends, strict=True):
            args += [key[3], repr(released), repr(used), int((end + KEEP).timestamp())]
        await self._settle(keys=[self._name(k) for k, _, _ in changes], args=args)
