"""Rate caps shared by gateway replicas in Redis: one hash per node and minute (`PREFIX:rate:START:PATH`, fields
`requests` and `tokens`), the check-and-count one Lua script (atomic across replicas), kept a minute past the
minute's end.

Each replica also counts its own part in the process (`OwnCounts`). While Redis cannot be reached, caps are enforced
from it (`Estimate`): a cap's count as last read in Redis this minute, plus N times what this replica let through
since (N: the replicas it last saw alive), so each replica lets a node have about its share of what was left. What
a replica counts meanwhile stays its own: a Redis restart, or an outage, forgets at most one minute's counts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .caps import Count, Key, LocalCounts, Wanted, first_over

KEEP_S = 60  # a minute's counts stay in Redis this long after it ends (replicas' clocks a little apart)

# KEYS: one hash per cap on the path; ARGV: the request's tokens, the expiry (unix seconds), then two per key: its
# limit of requests and of tokens ('' where it caps none). Answers {i, then each key's requests and tokens}: i = 0,
# counted (the counts after); i > 0: key i has reached its cap and nothing was counted (the counts read)
COUNT_LUA = """
local counts, over = {0}, 0
for i = 1, #KEYS do
  local got = redis.call('HMGET', KEYS[i], 'requests', 'tokens')
  local r, t = tonumber(got[1] or '0'), tonumber(got[2] or '0')
  counts[2 * i], counts[2 * i + 1] = r, t
  local rl, tl = ARGV[2 * i + 1], ARGV[2 * i + 2]
  if over == 0 and ((rl ~= '' and r >= tonumber(rl)) or (tl ~= '' and t >= tonumber(tl))) then over = i end
end
if over > 0 then
  counts[1] = over
  return counts
end
for i = 1, #KEYS do
  counts[2 * i] = redis.call('HINCRBY', KEYS[i], 'requests', 1)
  counts[2 * i + 1] = redis.call('HINCRBY', KEYS[i], 'tokens', ARGV[1])
  redis.call('EXPIREAT', KEYS[i], ARGV[2])
end
return counts
"""


class RedisRates:
    """The caps' counts in Redis (the shared state's client and key prefix)."""

    def __init__(self, client: Any, prefix: str = "fairserve") -> None:
        self.client, self.prefix = client, prefix
        self._count = client.register_script(COUNT_LUA)

    def name(self, key: Key) -> str:
        path, start = key
        return f"{self.prefix}:rate:{start}:{path}"

    async def read(self, key: Key) -> Count:
        requests, tokens = await self.client.hmget(self.name(key), ["requests", "tokens"])
        return Count(int(requests or 0), int(tokens or 0))

    async def try_count(self, wanted: Wanted, tokens: int, end: int) -> tuple[int | None, list[Count]]:
        args: list[Any] = [tokens, end + KEEP_S]
        for _, cap in wanted:
            args += ["" if cap.requests is None else cap.requests, "" if cap.tokens is None else cap.tokens]
        got = [int(v) for v in await self._count(keys=[self.name(k) for k, _ in wanted], args=args)]
        counts = [Count(got[i], got[i + 1]) for i in range(1, len(got), 2)]
        return (got[0] - 1 if got[0] else None), counts


@dataclass
class OwnCounts(LocalCounts):
    """This replica's own part of each cap's count, and what it last read in Redis of each total (`seen`)."""

    seen: dict[Key, tuple[Count, Count]] = field(default_factory=dict)  # the total read, and its own part then

    def saw(self, keys: Sequence[Key], totals: Sequence[Count]) -> None:
        for key, total in zip(keys, totals, strict=True):
            own = self.counts.get(key) or Count()
            self.seen[key] = (total, Count(own.requests, own.tokens))
        self.forget_before(keys[0][1])  # NOTE: reads alone (scrapes) move on to a new minute too

    def forget_before(self, start: int) -> None:
        if start > self.latest:
            self.seen = {k: v for k, v in self.seen.items() if k[1] >= start}
        super().forget_before(start)

    def estimate(self, key: Key, replicas: int) -> Count:
        """The count as last read this minute, plus `replicas` times what this replica let through since (as if
        every replica it last saw alive did as much); `replicas` times its own count where it read none."""
        total, then = self.seen.get(key, (Count(), Count()))
        own = self.counts.get(key) or Count()
        return Count(
            total.requests + replicas * (own.requests - then.requests),
            total.tokens + replicas * (own.tokens - then.tokens),
        )


class Mirrored:
    """Redis, with this replica's own part followed beside it (`OwnCounts`)."""

    def __init__(self, redis: RedisRates, own: OwnCounts) -> None:
        self.redis, self.own = redis, own

    async def read(self, key: Key) -> Count:
        count = await self.redis.read(key)
        self.own.saw([key], [count])
        return count

    async def try_count(self, wanted: Wanted, tokens: int, end: int) -> tuple[int | None, list[Count]]:
        bad, counts = await self.redis.try_count(wanted, tokens, end)
        keys = [key for key, _ in wanted]
        if bad is None:
            self.own.add(keys, tokens)
        self.own.saw(keys, counts)
        return bad, counts


class Estimate:
    """The caps while Redis cannot be reached, from this replica's own part (`OwnCounts.estimate`)."""

    def __init__(self, own: OwnCounts, replicas: Callable[[], int]) -> None:
        self.own, self.replicas = own, replicas

    async def read(self, key: Key) -> Count:
        return self.own.estimate(key, max(1, self.replicas()))

    async def try_count(self, wanted: Wanted, tokens: int, end: int) -> tuple[int | None, list[Count]]:
        counts = [await self.read(key) for key, _ in wanted]
        if (bad := first_over(wanted, counts)) is not None:
            return bad, counts
        self.own.add([key for key, _ in wanted], tokens)
        return None, [await self.read(key) for key, _ in wanted]
