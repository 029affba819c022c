"""Fast failure. While every backend of a request's pool is down, the request does not wait out its `queue_ttl_s`:
once the pool has been down for `fail_fast_s`, its queued requests fail together with a 503 `backend_unavailable`
that names the backends and why they are down, with a `Retry-After` (the next health check), and a request that
arrives at such a pool fails at once. A backend that comes back in time serves them as usual. `fail_fast_s = 0`:
requests wait their whole `queue_ttl_s`. A model with `fallbacks` is served as its first fallback whose pool is up
while every backend of its own pool is down, and its queued requests move there when the last backend of their pool
goes down (gateway/dispatch/fallback.py)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ..admission.ticket import Ending
from .pools import Pool

if TYPE_CHECKING:
    from ..admission.ticket import Ticket
    from ..settings.config import GatewayConfig
    from .fallback import Fallbacks
    from .pools import Backend, Dispatch


class PoolDown(Exception):
    """No backend of the request's pool has been up for `fail_fast_s` (503 `backend_unavailable`)."""

    def __init__(self, pool: Pool, retry_after_s: int) -> None:
        why = "; ".join(f"{b.name}: {b.reason or 'down'}" for b in pool.backends)
        super().__init__(f"no backend that serves this model is up: {why}")
        self.retry_after_s = retry_after_s


def down_for(pool: Pool, now: float) -> float:
    """How long every backend of `pool` has been down (0: one of them is up)."""
    if any(b.healthy for b in pool.backends):
        return 0.0
    return now - max(b.down_since for b in pool.backends)


class Scheduler(Protocol):
    cfg: GatewayConfig
    clock: Callable[[], float]
    pools: Dispatch
    fallbacks: Fallbacks

    def close(self, t: Ticket, ending: Ending) -> bool: ...


class FailFast:
    """The scheduler's fast failure: told when a backend goes down, it fails the queued requests of the pools left
    with no backend up once they have been down `fail_fast_s`; `check` fails an arrival at such a pool."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self._timers: dict[str, asyncio.TimerHandle] = {}  # by pool key

    def retry_after(self) -> int:
        """Seconds until the next health check may find a backend up (at least 1)."""
        cfg = self.sched.cfg
        return max(1, math.ceil(cfg.health_interval_s or cfg.backend_cooldown_s))

    def check(self, t: Ticket) -> None:
        """PoolDown if `t`'s pool has had no backend up for `fail_fast_s`."""
        fail = self.sched.cfg.fail_fast_s
        if fail and down_for(t.pool, self.sched.clock()) >= fail:
            raise PoolDown(t.pool, self.retry_after())

    def went_down(self, b: Backend) -> None:
        """`b` is down: each pool of it with no backend up now moves its queued requests with a fallback up there, and
        fails the others `fail_fast_s` from now."""
        for pool in list(self.sched.pools.pools.values()):  # NOTE: a move may make its fallback's pool
            if b in pool.backends and not any(x.healthy for x in pool.backends):
                if self.sched.cfg.fallbacks:
                    for req in sorted(pool.ledger.queued(), key=lambda r: r.seq):
                        if req.item.pool is pool:
                            self.sched.fallbacks.move(req.item, down=True)
                if self.sched.cfg.fail_fast_s:
                    self._arm(pool, self.sched.cfg.fail_fast_s)

    def _arm(self, pool: Pool, delay_s: float) -> None:
        if pool.key not in self._timers:
            self._timers[pool.key] = asyncio.get_running_loop().call_later(delay_s, self._fire, pool)

    def _fire(self, pool: Pool) -> None:
        del self._timers[pool.key]
        fail, now = self.sched.cfg.fail_fast_s, self.sched.clock()
        down = down_for(pool, now)
        if not fail or not down:
            return  # NOTE: a backend came back (or fast failure was turned off by a reload)
        if down < fail:  # NOTE: it came back and went down again since: the rest of this spell
            return self._arm(pool, fail - down)
        err = PoolDown(pool, self.retry_after())
        for req in sorted(pool.ledger.queued(), key=lambda r: r.seq):
            t = req.item
            if (
                t.pool is pool
                and self.sched.close(t, Ending("backend_unavailable", refund=True))
                and not t.admitted.done()
            ):
                t.admitted.set_exception(err)
