"""The gateway's quotas (gateway/quota.py's `QuotaBook`, wired): checked at arrival, held at dispatch (the request's
prompt + `max_tokens` and their service at its price), settled with what the ledger charged, shown in the admin API
and `/metrics`; kept in the process, or in Redis with `--state`.

While Redis cannot be reached (the shared state degraded, or a quota call fails) quotas are not enforced: requests
are let through (fail open, one warning when it starts, one line when it ends), and their use is not counted."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse, Response

from ..core import Listener, Request
from ..core.account import parents
from ..tenancy import QuotaConfig
from .prometheus import num
from .quota import MEASURES, Cost, Exhausted, Hold, Quota, QuotaBook, utc_now
from .quota_store import RedisQuotaStore

if TYPE_CHECKING:
    from .scheduler import Scheduler
    from .shared_state import SharedState
    from .ticket import Ticket

log = logging.getLogger("fairserve.gateway")
P = "fairserve_gateway_"
NOTHING = Hold(())


def insufficient_quota(out: Exhausted, request_id: str) -> Response:
    """OpenAI's answer to a used-up quota: 429, type and code `insufficient_quota`, Retry-After: the window's end."""
    code = "insufficient_quota"
    body = {"error": {"message": out.message(), "type": code, "param": None, "code": code}}
    return JSONResponse(
        body, status_code=429, headers={"Retry-After": str(out.retry_after_s), "X-Request-Id": request_id}
    )


class QuotaGate(Listener):
    """The quotas of one gateway, and a listener of its ledgers (core/listener.py): a request's hold is settled when
    its ledger settles it, with what the ledger charged."""

    def __init__(self, quotas: dict[str, QuotaConfig], clock: Callable[[], datetime] = utc_now) -> None:
        self.book = QuotaBook({}, clock=clock)
        self._paths: dict[str, list[str]] = {}  # tenant -> the nodes of its path that have a quota
        self.shared: SharedState | None = None
        self.failing = False  # the store could not be reached at the last call: quotas are not enforced
        self._tasks: set[asyncio.Task[Any]] = set()
        self.configure(quotas)

    def configure(self, quotas: dict[str, QuotaConfig]) -> None:
        """New limits (a reload); use so far is kept."""
        self.book.quotas = {p: Quota(q.per, q.tokens, q.service) for p, q in quotas.items()}
        self._paths.clear()

    def use_redis(self, shared: SharedState) -> None:
        """Keep use in the shared state's Redis (its client, its key prefix)."""
        self.shared = shared
        self.book.store = RedisQuotaStore(shared._client, shared.settings.prefix, shared.replica, lambda: shared.epoch)

    def paths(self, tenant: str) -> list[str]:
        out = self._paths.get(tenant)
        if out is None:
            out = self._paths[tenant] = [p for p in (tenant, *parents(tenant)) if p in self.book.quotas]
        return out

    def _reachable(self) -> bool:
        if self.shared is None or self.shared.up:
            return True
        if not self.failing:
            log.warning("quotas are not enforced while the shared state (Redis) is degraded")
            self.failing = True
        return False

    def _failed(self, e: BaseException) -> None:
        if not self.failing:
            log.warning("quotas are not enforced while their store cannot be reached: %s", type(e).__name__)
        self.failing = True

    def _ok(self) -> None:
        if self.failing:
            log.warning("quotas are enforced again: their store answers")
        self.failing = False

    async def check(self, tenant: str) -> Exhausted | None:
        """At arrival: the first used-up quota on `tenant`'s path, else None."""
        paths = self.paths(tenant)
        if not paths or not self._reachable():
            return None
        try:
            out = await self.book.check(paths)
        except Exception as e:  # NOTE: fail open: Redis lost (ConnectionError, TimeoutError, ...)
            self._failed(e)
            return None
        self._ok()
        return out

    async def hold(self, t: Ticket) -> Hold | Exhausted:
        """At dispatch: hold `t`'s bound on every quota of its path (NOTHING: no quota, or the store is lost)."""
        paths = self.paths(t.tenant)
        if not paths or not self._reachable():
            return NOTHING
        out = t.tokens - t.prompt_tokens  # max_tokens · n
        bound = Cost(t.prompt_tokens + out, (t.cost or t.pool.ledger.cost).total(t.prompt_tokens, out))
        try:
            got = await self.book.hold(paths, bound)
        except Exception as e:
            self._failed(e)
            return NOTHING
        self._ok()
        return got

    def settled(self, req: Request) -> None:
        """The ledger ended `req`: its ticket's hold (if it took one) is replaced by what the ledger charged, the raw
        tokens and their service at the request's price."""
        t: Ticket = req.item
        if t.holding is not None:
            self.settle(t.holding, Cost((req.prompt_tokens if req.admitted else 0) + req.output_done, req.charged))

    def settle(self, holding: asyncio.Task[Hold | Exhausted], used: Cost) -> None:
        """The request ended, having used `used`: its hold (when its task is done) is replaced by it."""

        def done(task: asyncio.Task[Hold | Exhausted]) -> None:
            if task.cancelled() or task.exception() is not None:
                return
            hold = task.result()
            if isinstance(hold, Hold) and hold.keys:
                settling = asyncio.get_running_loop().create_task(self._settle(hold, used))
                self._tasks.add(settling)
                settling.add_done_callback(self._tasks.discard)

        if holding.done():
            done(holding)
        else:
            holding.add_done_callback(done)

    async def _settle(self, hold: Hold, used: Cost) -> None:
        try:
            await self.book.settle(hold, used)
        except Exception as e:
            self._failed(e)

    async def drain(self) -> None:
        """Wait for the settles under way (at shutdown)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def status(self, path: str) -> dict[str, dict[str, float | str]]:
        """Limit, used, held, remaining and resets_at of each measure of `path`'s quota ({} if none or lost)."""
        if path not in self.book.quotas or not self._reachable():
            return {}
        try:
            return await self.book.status(path)
        except Exception as e:
            self._failed(e)
            return {}

    async def all_status(self) -> dict[str, Any]:
        """`GET /admin/quotas`: every node with a quota, its period and status."""
        out: dict[str, Any] = {}
        for path, q in self.book.quotas.items():
            out[path] = {"per": q.per, **await self.status(path)}
        return {"enforced": not self.failing and self._reachable(), "quotas": out}

    async def exposition(self, active: list[str]) -> str:
        """The quota series of the nodes with a quota on the paths of the active tenants."""
        nodes: dict[str, None] = {}
        for tenant in active:
            for p in self.paths(tenant):
                nodes.setdefault(p)
        rows = [(p, await self.status(p)) for p in nodes]
        out = []
        for name, text in (
            ("quota_limit", "The node's quota in its window (measure: tokens or service)"),
            ("quota_used", "What the node's finished requests used in the current quota window"),
            ("quota_held", "The bounds (prompt + max_tokens) its running requests hold on the quota"),
            ("quota_remaining", "What is left of the quota in the current window (limit - used - held, at least 0)"),
        ):
            field = name.removeprefix("quota_")
            out.append(f"# HELP {P}{name} {text}\n# TYPE {P}{name} gauge\n")
            for path, status in rows:
                for m in MEASURES:
                    if m in status:
                        out.append(f'{P}{name}{{measure="{m}",node="{path}"}} {num(float(status[m][field]))}\n')
        return "".join(out)


class QuotaView:
    """What the admin API reads: the scheduler's quotas as they are now (a reload may add or remove them)."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched

    async def status(self, path: str) -> dict[str, Any]:
        gate = self.sched.quotas
        return await gate.status(path) if gate is not None else {}

    async def all_status(self) -> dict[str, Any]:
        gate = self.sched.quotas
        return await gate.all_status() if gate is not None else {"enforced": False, "quotas": {}}
