"""The gateway's rate caps (gateway/rate/caps.py's `RateBook`, wired): a part of the gateway (gateway/component.py)
that counts each request at arrival, once it has a ticket and before it is queued, and answers 429 `rate_limited`
with `Retry-After` (the seconds to the minute's end) to one past a cap; kept in the process, or in Redis with
`--state` (gateway/rate/store.py), shown by `GET /admin/rates` and `/metrics`. A reload applies changed caps to the
next request; what was counted this minute is kept.

While Redis cannot be reached (the shared state degraded, or a call fails) caps are enforced from this replica's own
count (`Estimate`: fail open with a bound, as quotas do), one warning when it starts and one line when Redis decides
again. What is let through is ordered by the policy (VTC): caps say how much a tenant may send, not who goes first."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from starlette.responses import Response

from ...api.errors import error_response
from ...core.account import limited_path
from ..metrics.prometheus import GatewayMetrics
from ..metrics.usage import UsageLog
from .caps import MEASURES, Limited, RateBook, RateCap
from .store import Estimate, Mirrored, OwnCounts, RedisRates

if TYPE_CHECKING:
    from ..admission.ticket import Ticket
    from ..settings.config import GatewayConfig
    from ..shared.state import SharedState

log = logging.getLogger("fairserve.gateway")
P = "fairserve_gateway_"
OUTCOME = "rate_limited"  # NOTE: the code the gateway answers a rate limit with (the `rpm:N` policy's too)


class Scheduler(Protocol):
    """What the caps read of the scheduler (gateway/admission/scheduler.py)."""

    cfg: GatewayConfig
    shared: SharedState | None
    metrics: GatewayMetrics
    usage: UsageLog


def rate_limited(out: Limited, request_id: str) -> Response:
    """429 `rate_limited` (type `rate_limit_error`), Retry-After: the seconds to the minute's end."""
    headers = {"Retry-After": str(out.retry_after_s), "X-Request-Id": request_id}
    return error_response(429, out.message(), code=OUTCOME, headers=headers)


class RateGate:
    """The rate caps of one gateway (a component: `check`, `configure`, `start`, `stop`)."""

    def __init__(self, sched: Scheduler, clock: Callable[[], float] = time.time) -> None:
        self.sched = sched
        self.book = RateBook({}, clock=clock)
        self.estimate: RateBook | None = None  # with Redis: the same caps on this replica's own part
        self.local = False  # caps are enforced from this replica's own count: Redis cannot be reached
        self._lost_at = 0.0  # the shared state's last answered sync when a call to Redis last failed
        self._own = OwnCounts()
        self._paths: dict[str, list[str]] = {}  # tenant -> the nodes of its path that have a cap
        self.configure(sched.cfg)

    @property
    def on(self) -> bool:
        """Whether some cap is configured (else the request path asks nothing)."""
        return bool(self.book.caps)

    def check(self, old: GatewayConfig, new: GatewayConfig) -> None:
        """Any cap applies live."""

    def configure(self, cfg: GatewayConfig) -> None:
        """The caps from now on (a reload); this minute's counts are kept."""
        self.book.caps = {p: RateCap(r.requests, r.tokens) for p, r in cfg.index().rates.items()}
        if self.estimate is not None:
            self.estimate.caps = self.book.caps
        self._paths.clear()

    async def start(self) -> None:
        """With `--state`, the counts are kept in the shared state's Redis (joined by the scheduler, started first)."""
        shared = self.sched.shared
        if shared is not None:
            self.book.store = Mirrored(RedisRates(shared._client, shared.settings.prefix), self._own)
            self.estimate = RateBook(self.book.caps, Estimate(self._own, lambda: shared.replicas), self._now)

    async def stop(self) -> None:
        """Nothing to end: each count was written when it was made."""

    def _now(self) -> float:
        return self.book.clock()

    def paths(self, tenant: str) -> list[str]:
        out = self._paths.get(tenant)
        if out is None:
            out = self._paths[tenant] = limited_path(tenant, self.book.caps)
        return out

    def _book(self) -> RateBook:
        """Redis while the shared state is up (or the process's own counts without one), else the estimate."""
        shared = self.sched.shared
        if shared is None or self.estimate is None:
            return self.book
        if not shared.up:
            return self._lose("the shared state (Redis) is degraded")
        if self.local:
            if shared.last_sync == self._lost_at:  # NOTE: no sync has been answered since a call failed
                return self.estimate
            self.local = False
            log.warning("rate caps are enforced in Redis again")
        return self.book

    def _lose(self, why: str) -> RateBook:
        """Caps are enforced from this replica's own count until Redis answers a sync again."""
        assert self.estimate is not None and self.sched.shared is not None
        self._lost_at = self.sched.shared.last_sync
        if not self.local:
            log.warning("rate caps are enforced from this replica's own count while %s", why)
            self.local = True
        return self.estimate

    async def count(self, tenant: str, tokens: int) -> Limited | None:
        """At arrival: count a request of `tokens` on every cap of `tenant`'s path, or the cap it has reached."""
        paths = self.paths(tenant)
        if not paths:
            return None
        book = self._book()
        try:
            return await book.count(paths, tokens)
        except Exception as e:  # NOTE: Redis lost (ConnectionError, TimeoutError, ...): the estimate answers
            if book is not self.book or self.estimate is None:
                raise
            return await self._lose(f"Redis cannot be reached ({type(e).__name__})").count(paths, tokens)

    async def admit(self, t: Ticket) -> Response | None:
        """None: `t` is counted and goes on to the queue; else its 429, counted as refused (`rate_limited`)."""
        out = await self.count(t.tenant, t.footprint.tokens)
        if out is None:
            return None
        self.sched.metrics.refused(t.tenant, OUTCOME)
        self.sched.usage.refused(t.request_id, t.tenant, t.model, t.kind, OUTCOME)
        return rate_limited(out, t.request_id)

    async def status(self, path: str) -> dict[str, dict[str, int | str]]:
        book = self._book()
        try:
            return await book.status(path)
        except Exception as e:
            if book is not self.book or self.estimate is None:
                raise
            return await self._lose(f"Redis cannot be reached ({type(e).__name__})").status(path)

    async def all_status(self) -> dict[str, Any]:
        """`GET /admin/rates`: every node with a cap and its use this minute; `estimated`: this replica's estimate
        while Redis cannot be reached."""
        caps = {path: await self.status(path) for path in self.book.caps}
        return {"enforced": self.on, "estimated": self.local, "per": "minute", "rates": caps}

    async def dashboard(self) -> dict[str, Any] | None:
        """`all_status` for the dashboard, None while no cap is configured (its card then stays hidden)."""
        return await self.all_status() if self.on else None

    async def exposition(self, active: list[str]) -> str:
        """The cap series of the nodes with a cap on the paths of the active tenants."""
        nodes: dict[str, None] = {}
        for tenant in active:
            nodes.update(dict.fromkeys(self.paths(tenant)))
        rows = [(p, await self.status(p)) for p in nodes]
        out = []
        for name, text in (
            ("rate_limit", "The node's rate cap per minute (measure: requests or tokens)"),
            ("rate_used", "What the node was counted in the current minute"),
        ):
            field = "limit" if name == "rate_limit" else "used"
            out.append(f"# HELP {P}{name} {text}\n# TYPE {P}{name} gauge\n")
            for path, status in rows:
                for m in MEASURES:
                    if m in status:
                        out.append(f'{P}{name}{{measure="{m}",node="{path}"}} {status[m][field]}\n')
        return "".join(out)
