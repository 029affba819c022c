"""The gateway's quotas (gateway/quota/book.py's `QuotaBook`, wired): checked at arrival, held at dispatch (the
request's prompt + `max_tokens` and their service at its price), settled with what the ledger charged, shown in the
admin API and `/metrics`; kept in the process, or in Redis with `--state`.

With Redis the replica also counts its own part of each quota's use (quota_store.py's `OwnUse`). While Redis cannot
be reached (the shared state degraded, or a quota call fails) quotas are enforced from that part alone (`Estimate`:
fail open with a bound: each replica lets a node use about its share of what was left), one warning when it
starts; once Redis answers again (even empty: a restart), the replica writes its part back, waits `hold_s` in which
every other replica does the same, and only then reads Redis again (one line)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from starlette.responses import JSONResponse, Response

from ...core import Listener, Request
from ...core.account import limited_path
from ...tenancy import QuotaConfig
from ..metrics.prometheus import num
from .book import MEASURES, Cost, Exhausted, Hold, Quota, QuotaBook, utc_now
from .store import Estimate, MirroredStore, OwnUse, RedisQuotaStore

if TYPE_CHECKING:
    from ..admission.ticket import Ticket
    from ..shared.state import SharedState

log = logging.getLogger("fairserve.gateway")
P = "fairserve_gateway_"
NOTHING = Hold(())
T = TypeVar("T")


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
        self.estimate: QuotaBook | None = None  # with Redis: the same quotas on this replica's own part (`Estimate`)
        self._own = OwnUse()
        self._redis: RedisQuotaStore | None = None
        self.local = False  # quotas are enforced from the estimate: Redis was lost, or the write-back is under way
        self._local_until = 0.0  # shared.clock() until which the write-back waits for the other replicas' own
        self._writes = 0  # holds and settles sent to Redis and not answered yet
        self._quiet = asyncio.Event()  # set while there are none
        self._quiet.set()
        self._back: asyncio.Task[None] | None = None  # the write-back under way
        self._tasks: set[asyncio.Task[Any]] = set()
        self.configure(quotas)

    def configure(self, quotas: dict[str, QuotaConfig]) -> None:
        """New limits (a reload); use so far is kept."""
        self.book.quotas = {p: Quota(q.per, q.tokens, q.service) for p, q in quotas.items()}
        if self.estimate is not None:
            self.estimate.quotas = self.book.quotas
        self._paths.clear()

    def use_redis(self, shared: SharedState) -> None:
        """Keep use in the shared state's Redis (its client, its key prefix), this replica's own part beside it, and
        hear of each answered sync (`synced`)."""
        self.shared = shared
        self._redis = RedisQuotaStore(shared._client, shared.settings.prefix, shared.replica, lambda: shared.epoch)
        self.book.store = MirroredStore(self._redis, self._own)
        estimate = Estimate(self._own, lambda: shared.replicas)
        self.estimate = QuotaBook(self.book.quotas, estimate, lambda: self.book.clock())
        shared.on_sync = self.synced

    def paths(self, tenant: str) -> list[str]:
        out = self._paths.get(tenant)
        if out is None:
            out = self._paths[tenant] = limited_path(tenant, self.book.quotas)
        return out

    def _remote(self) -> bool:
        """Whether quota calls go to Redis now (else to this replica's estimate)."""
        if self.shared is None or self.local:
            return self.shared is None
        if not self.shared.up:
            self._lose("the shared state (Redis) is degraded")
            return False
        return True

    def _lose(self, why: str) -> None:
        """Quotas are enforced from this replica's own part until it has written that back to Redis."""
        if not self.local:
            log.warning("quotas are enforced from this replica's own count while %s", why)
            self.local = True
        assert self.shared is not None
        self._local_until = self.shared.clock() + self.shared.settings.hold_s

    def _failed(self, e: BaseException) -> QuotaBook:
        """A quota call to Redis failed: the estimate answers it (fail open with a bound)."""
        if self.estimate is None:  # NOTE: the in-process store does not fail
            raise e
        self._lose(f"Redis cannot be reached ({type(e).__name__})")
        return self.estimate

    def synced(self, lost: bool) -> None:
        """The shared state's hook, after each answered sync (`lost`: Redis had lost its data): while quotas are
        enforced locally, Redis answers again, so this replica's part is written back."""
        if lost:
            self._lose("Redis lost its data")
        if self.local and self._back is None:
            self._back = asyncio.get_running_loop().create_task(self._write_back())

    async def _write_back(self) -> None:
        """This replica's own part into Redis (`RedisQuotaStore.restore`), again until `hold_s` has passed (the other
        replicas write theirs back meanwhile) and no hold or settle came during the last one; then Redis decides."""
        assert self.shared is not None and self._redis is not None
        self._local_until = max(self._local_until, self.shared.clock() + self.shared.settings.hold_s)
        try:
            while True:
                await self._quiet.wait()  # NOTE: no write of this replica in flight: its part in Redis stays put
                version = self._own.version
                await self._redis.restore(self._own.parts())
                wait = self._local_until - self.shared.clock()
                if wait > 0:
                    await asyncio.sleep(wait)
                elif version == self._own.version:
                    break
        except Exception as e:  # NOTE: Redis lost again: the next answered sync starts over
            log.debug("quota use not written back yet: %s", type(e).__name__)
            return
        finally:
            self._back = None
        self.local = False
        log.warning("quotas are enforced in Redis again: this replica's use is written back")

    async def _write(self, call: Awaitable[T]) -> T:
        """A hold or settle in Redis, counted while it is in flight (the write-back waits for none)."""
        self._writes += 1
        self._quiet.clear()
        try:
            return await call
        finally:
            self._writes -= 1
            if not self._writes:
                self._quiet.set()

    async def check(self, tenant: str, budget: str | None = None) -> Exhausted | None:
        """At arrival: the first used-up quota on `tenant`'s path (and `budget`, its key's), else None."""
        paths = self.paths(tenant) if budget is None else [*self.paths(tenant), budget]
        if not paths:
            return None
        book = self.book if self._remote() else self.estimate
        assert book is not None
        try:
            return await book.check(paths)
        except Exception as e:  # NOTE: Redis lost (ConnectionError, TimeoutError, ...): the estimate answers
            return await self._failed(e).check(paths)

    async def hold(self, t: Ticket) -> Hold | Exhausted:
        """At dispatch: hold `t`'s bound on every quota of its path and its key's budget (NOTHING: no quota), in
        Redis or the estimate."""
        paths = self.paths(t.tenant) if t.budget is None else [*self.paths(t.tenant), t.budget]
        if not paths:
            return NOTHING
        fp = t.footprint
        bound = Cost(fp.tokens, (t.cost or t.pool.ledger.cost).total(fp.prompt_tokens, fp.max_output))
        if not self._remote():
            assert self.estimate is not None
            return await self.estimate.hold(paths, bound)
        try:
            return await self._write(self.book.hold(paths, bound))
        except Exception as e:  # NOTE: whether or not Redis ran it, the write-back sets this replica's part right
            return await self._failed(e).hold(paths, bound)

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
        if not self._remote():
            assert self.estimate is not None
            await self.estimate.settle(hold, used)
            return
        try:
            await self._write(self.book.settle(hold, used))
        except Exception as e:
            await self._failed(e).settle(hold, used)

    async def drain(self) -> None:
        """Wait for the settles under way (at shutdown); while quotas are enforced locally, this replica's part is
        written back once more if Redis answers (best effort: it is lost with this replica otherwise)."""
        if self._back is not None:
            self._back.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.local and self.shared is not None and self.shared.up and self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.restore(self._own.parts())

    async def status(self, path: str) -> dict[str, dict[str, float | str]]:
        """Limit, used, held, remaining and resets_at of each measure of `path`'s quota ({} if none), from Redis
        or, while quotas are enforced locally, from the estimate."""
        if path not in self.book.quotas:
            return {}
        book = self.book if self._remote() else self.estimate
        assert book is not None
        try:
            return await book.status(path)
        except Exception as e:
            return await self._failed(e).status(path)

    async def all_status(self) -> dict[str, Any]:
        """`GET /admin/quotas`: every node with a quota, its period and status; `estimated`: this replica's estimate
        while Redis is lost (or its use is being written back)."""
        out: dict[str, Any] = {}
        for path, q in self.book.quotas.items():
            out[path] = {"per": q.per, **await self.status(path)}
        return {"enforced": True, "estimated": self.local, "quotas": out}

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


class HasQuotas(Protocol):
    quotas: QuotaGate | None  # the scheduler's (gateway/admission/scheduler.py); None: no quota configured


class QuotaView:
    """What the admin API reads: the scheduler's quotas as they are now (a reload may add or remove them)."""

    def __init__(self, sched: HasQuotas) -> None:
        self.sched = sched

    async def status(self, path: str) -> dict[str, Any]:
        gate = self.sched.quotas
        return await gate.status(path) if gate is not None else {}

    async def all_status(self) -> dict[str, Any]:
        gate = self.sched.quotas
        return await gate.all_status() if gate is not None else {"enforced": False, "estimated": False, "quotas": {}}
