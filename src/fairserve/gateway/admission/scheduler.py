"""The gateway's driver of the scheduling core: tickets, backend capacity, and the dispatcher.

The policy decides the order (VTC, FCFS, ...); gateway/dispatch/pools.py decides where a request may go (its model's
pool) and capacity: the least-loaded backend of its pool with room for one more request and its tokens (prompt +
max_tokens). A backend's request limit is its `max_inflight_requests`, or with `adaptive` what
gateway/dispatch/capacity.py sets from the backend's /metrics. Dispatch runs on every arrival and whenever capacity
frees. Everything here is synchronous, so it runs atomically on the event loop.

Health (gateway/dispatch/health.py): a request whose backend was down or lost its connection before any output goes
back to the queue without counting that backend as tried; while no backend of its pool is up it waits up to
`fail_fast_s` (dispatch/unavailable.py)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Callable

from ...api.tokens import token_counter
from ...core import Account, CostFunction, LedgerView, LinearCost, RequestState, make_policy
from ...core.ledger import Ledger
from ...tenancy import QuotaConfig, refused_priority
from ..component import ReloadError
from ..dispatch import fleet
from ..dispatch.fallback import Fallbacks
from ..dispatch.pools import Backend, Dispatch, UnknownModel
from ..dispatch.unavailable import FailFast
from ..metrics.prometheus import GatewayMetrics
from ..metrics.usage import UsageLog
from ..quota.gate import QuotaGate
from ..settings import retree
from ..settings.config import GatewayConfig
from ..shared.state import SharedState, StateSettings
from . import totals
from .footprint import Footprint
from .ticket import Ending, Ticket, admitted_within, entry

log = logging.getLogger("fairserve.gateway")
MAX_LOST = 3  # connections lost before any output, per request, before it fails with 502


class Scheduler:
    """`clock`: the seconds the scheduler and its dispatch read (arrivals, waits, cooldowns, deadlines); a test owns
    it by passing its own (the event loop's timers are asked for delays, never for times of this clock)."""

    shared_state: Callable[..., SharedState] = SharedState  # NOTE: a test's subclass makes it on its own clock

    def __init__(
        self, cfg: GatewayConfig, metrics: GatewayMetrics, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.cfg, self.metrics, self.clock = cfg, metrics, clock
        self.count_tokens, self.tenants = token_counter(cfg.tokenizer), retree.Names(cfg)
        self.backends = [Backend(b) for b in cfg.backends]
        self.draining: list[Backend] = []  # removed by a reload, requests still in flight (dispatch/fleet.py)
        self.prices = cfg.price_table()
        self.price: CostFunction | None = None  # other models' price, where a reload changed w_p, w_q (else theirs)
        self.usage = UsageLog(cfg.usage_log, clock)  # UsageLogError (one line) if it cannot be opened
        self._ids = itertools.count(1)
        self._wakeup: asyncio.TimerHandle | None = None
        self.probe: Callable[[Backend], None] | None = None  # ask for a health check now (gateway/dispatch/health.py)
        # shared with other replicas through Redis (gateway/shared/state.py), joined by `start`
        settings = StateSettings(cfg.state, cfg.state_interval_s, cfg.state_ttl_s) if cfg.state is not None else None
        self.shared = (
            self.shared_state(settings, self.backends, tokens_of=lambda r: r.item.tokens, on_change=self.dispatch)
            if settings is not None
            else None
        )

        def make_ledger() -> Ledger:
            policy = make_policy(cfg.policy, w_p=cfg.w_p, w_q=cfg.w_q)  # NOTE: the start's w_p, w_q (`self.price`)
            now = self.cfg  # NOTE: a pool made after a reload takes the tenant tree reloaded
            ledger = Ledger(
                policy,
                self.tenants,
                now.weights(),
                peers=self.shared,
                priorities=now.priorities(),
                allowed=now.allowed(),
            )
            ledger.listen(metrics.queues)  # the queue per priority level (/metrics)
            if self.quota_gate is not None:
                ledger.listen(self.quota_gate)  # settles each request's quota hold
            return ledger

        quotas = cfg.quotas()
        self.budgets: dict[str, QuotaConfig] = {}  # the keys' budgets (`use_budgets`)
        self.quota_gate = QuotaGate(quotas) if quotas else None  # kept once made: holds are settled through it
        self.quotas = self.quota_gate  # NOTE: None while no quota is configured: the hot path asks nothing

        self.pools = Dispatch(self.backends, make_ledger, cfg.counter_scope == "per_model", clock, cfg.placement())
        self.ledger = self.pools.ledgers[0]  # the fleet's (global), or the first pool's (per_model: the one, mostly)
        self.fail_fast = FailFast(self)  # pools with no backend up fail their requests (dispatch/unavailable.py)
        self.fallbacks = Fallbacks(self)  # queued requests move to their model's fallbacks (dispatch/fallback.py)

    # ---- arrivals -----------------------------------------------------------------------------------------------
    def new_ticket(
        self, tenant: str, footprint: Footprint, request_id: str = "", model: str | None = None, kind: str = ""
    ) -> Ticket:
        """A ticket for a request of `model` (UnknownModel if no backend serves it)."""
        now = self.clock()
        return Ticket(
            tenant,
            footprint,
            now,
            asyncio.get_running_loop().create_future(),
            pool=self.pools.route(model),
            model=model,
            cost=self.prices.get(model, self.price) if model is not None else self.price,
            arrived_at=now,
            deadline=now + self.cfg.queue_ttl_s,
            request_id=request_id,
            kind=kind,
        )

    def queued_of(self, tenant: str) -> int:
        """`tenant`'s requests queued now, over every pool."""
        return sum(a.queued for x in self.pools.ledgers if (a := x.accounts.get(tenant)) is not None)

    def refused_priority(self, tenant: str, named: int | None) -> list[int] | None:
        """None if a request of `tenant` may name priority `named` (or names none); else the values it may name."""
        return refused_priority(self.ledger, tenant, named)

    def submit(self, t: Ticket, priority: int | None = None) -> str | None:
        """Queue a ticket (`priority`: the one its request names, checked by `refused_priority`); returns the outcome
        if it is refused ("queue_full" or "rejected"): it never entered the ledger, and nothing is left to settle."""
        self.metrics.arrived(t.tenant)
        if self.queued_of(t.tenant) >= self.cfg.queue_limit:
            outcome = "queue_full"
        else:
            if self.shared is not None:
                self.shared.note_tokens(t.tokens)
            req = entry(t, f"gw-{next(self._ids)}", priority, t.cost)
            if t.pool.ledger.add(req):
                t.req = req
                t.pool.queued += 1
                self.dispatch()
                return None
            outcome = "rejected"
        t.outcome = outcome
        self.metrics.refused(t.tenant, outcome)
        self.usage.ticket(t)
        return outcome

    # ---- admission ----------------------------------------------------------------------------------------------
    def dispatch(self) -> None:
        now = self.clock()
        for req in self.pools.admit(self.shared):
            t: Ticket = req.item
            if t.dispatched_at is None:
                t.dispatched_at = now
            assert t.backend is not None  # the pass took it
            t.backend_name = t.backend.name
            self.metrics.waited(t.tenant, now - t.queued_at, req.priority or 0)
            if not t.admitted.done():
                t.admitted.set_result(t.backend)
        if self.shared is not None:  # NOTE: also with nothing queued: lease room this replica cannot use may move
            self.shared.waiting()
        self._wake_after_cooldown(now)

    def _wake_after_cooldown(self, now: float) -> None:
        """While a backend cools down, dispatch again when it is back, so queued requests are not stranded."""
        later = [x for b in self.backends for x in (b.down_until, b.busy_until) if now < x < math.inf]
        if not later or not self.pools.num_queued:
            return
        loop = asyncio.get_running_loop()
        at = loop.time() + min(later) - now + 0.01  # NOTE: the loop's own time: `now` is this scheduler's clock
        if self._wakeup is not None:
            if self._wakeup.when() <= at:
                return
            self._wakeup.cancel()

        def wake() -> None:
            self._wakeup = None
            self.dispatch()

        self._wakeup = loop.call_at(at, wake)

    @property
    def healthy(self) -> list[Backend]:
        """The backends that can take requests now (up, or without active checks past their cooldown)."""
        now = self.clock()
        return [b for b in self.backends if b.down_until <= now]

    async def wait(self, t: Ticket, timeout_s: float | None = None) -> Backend | None:
        """The backend the ticket was admitted to, or None when it waited `timeout_s` (default: until its deadline,
        `queue_ttl_s` after its arrival) in vain."""
        if t.admitted.done():  # admitted at once: no timer
            return t.admitted.result()
        self.fail_fast.check(t)  # PoolDown: its pool has had no backend up for fail_fast_s
        if timeout_s is None:
            timeout_s = max(0.0, t.deadline - self.clock())
        after = self.fallbacks.after_s(t)
        if after is not None and after < timeout_s:  # NOTE: past `fallback_after_s` it may move to a fallback
            if (b := await admitted_within(t, after)) is not None:
                return b
            self.fallbacks.move(t)
            timeout_s -= after
        return await admitted_within(t, timeout_s)

    # ---- progress and failures ----------------------------------------------------------------------------------
    def output(self, t: Ticket, tokens: int) -> None:
        """`tokens` output tokens reached the client: charged now (VTC orders by them)."""
        assert t.req is not None
        if t.first_token_at is None:
            t.first_token_at = self.clock()
        t.pool.ledger.output(t.req, tokens)

    def backend_failed(self, t: Ticket, unreachable: bool = False, lost: bool = False, why: str = "") -> bool:
        """`t` failed on its backend before any output reached the client. Requeue it (its charges stand) if
        some backend may still serve it; returns False when none is left.

        `unreachable` (no connection): the backend is down, and the request waits for any backend to be up.
        `lost` (the connection broke before an answer): a health check is asked for, and the request is tried again
        (at most MAX_LOST times). Otherwise (an error status, a timeout) the backend is not tried again for it."""
        b = t.backend
        assert b is not None and t.req is not None
        if unreachable:
            self.backend_down(b, why or "unreachable")
        elif lost:
            t.lost += 1
        if (unreachable or lost) and self.probe is not None:
            self.probe(b)
        if not unreachable and (not lost or t.lost > MAX_LOST):
            t.tried.add(b.url)
        self._release(t)
        pool = t.pool
        if fleet.stale(self.pools, pool):  # NOTE: a reload changed its backends: where its model goes now
            try:
                pool = fleet.pool_for(self.pools, t.model, pool.ledger)
            except UnknownModel:
                return False
        left = [x for x in pool.backends if x.url not in t.tried]
        up = [x for x in self.healthy if x in pool.backends]
        # NOTE: it waits for a down backend only while none of its pool is up; those up all failed it otherwise
        if not left or (up and not set(left) & set(up)):
            return False
        t.queued_at = self.clock()
        t.admitted = asyncio.get_running_loop().create_future()
        t.pool = pool
        pool.ledger.requeue(t.req)
        pool.queued += 1
        if not up:  # NOTE: its pool is down (its own failure may have taken it down): a fallback may take it
            self.fallbacks.move(t, down=True)
        self.dispatch()
        return True

    def backend_busy(self, b: Backend, retry_after_s: float) -> float:
        """`b` answered 429/503 with `Retry-After`: no request is sent to it for that long (at most
        `retry_after_max_s`). Returns the seconds it is skipped."""
        wait = min(max(retry_after_s, 0.0), self.cfg.retry_after_max_s)
        if wait > 0:
            b.busy_until = max(b.busy_until, self.clock() + wait)
            log.info("backend %s is busy: skipped for %g s (Retry-After)", b.name, wait)
        return wait

    def backend_ok(self, b: Backend) -> None:
        """`b` answered: it is up."""
        if not b.healthy:
            log.info("backend %s is up", b.name)
        b.healthy, b.down_until, b.reason = True, 0.0, ""

    def backend_up(self, b: Backend) -> None:
        """A health check passed: `b` takes requests again (queued ones are dispatched now)."""
        down = b.down_until > 0.0
        self.backend_ok(b)
        if down:
            self.dispatch()

    def backend_down(self, b: Backend, reason: str) -> None:
        """`b` is down: until a health check passes, or for `backend_cooldown_s` without active checks."""
        if b.healthy:
            log.warning("backend %s is down: %s", b.name, reason)
            b.down_since = self.clock()
        b.healthy, b.reason = False, reason
        b.down_until = math.inf if self.cfg.health_interval_s > 0 else self.clock() + self.cfg.backend_cooldown_s
        self.fail_fast.went_down(b)

    def _release(self, t: Ticket) -> None:
        b, t.backend = t.backend, None
        if b is not None:
            b.requests -= 1
            b.tokens -= t.tokens
            if not b.requests and self.draining and b in self.draining:
                self.draining.remove(b)
                log.info("backend %s removed: drained", b.name)

    def generated(self, t: Ticket) -> None:
        """The backend has sent all of `t` (its client may still be reading it from the gateway's buffer,
        gateway/relay/pipe.py): its slot goes to the next request."""
        if t.backend is not None:
            self._release(t)
            self.dispatch()

    # ---- the one ending of every accepted request -----------------------------------------------------------------
    def close(self, t: Ticket, ending: Ending) -> bool:
        """Book how `t` ended: its ledger entry is settled (ok: reconciled to the usage given; otherwise charged what
        it produced, or nothing with `refund`), its backend slot freed, its outcome counted. Exactly once: False if
        it was settled already."""
        req = t.req
        queued = req is not None and req.state is RequestState.QUEUED
        if req is None or not t.pool.ledger.settle(
            req,
            prompt=0 if ending.refund else ending.prompt,
            output=0 if ending.refund else ending.output,
            cancelled=ending.outcome != "ok" or ending.refund,
        ):
            return False
        t.outcome = ending.outcome
        if queued:
            t.pool.queued -= 1
        self.metrics.ended(t.tenant, ending.outcome, req.prompt_tokens if req.admitted else 0, req.output_done)
        self._release(t)
        self.usage.ticket(t)
        self.dispatch()
        return True

    # ---- admin --------------------------------------------------------------------------------------------------
    def view(self) -> LedgerView:
        """Every tenant's numbers, summed over the pools' ledgers (gateway/admission/totals.py)."""
        return totals.view(self.pools.ledgers)

    def accounts(self) -> tuple[dict[str, Account], dict[str, Account], Callable[[Account], float]]:
        """(tenants, groups, counter_of) to read, summed over the pools' ledgers (/metrics;
        gateway/admission/totals.py)."""
        return totals.accounts(self.pools.ledgers)

    def use_budgets(self, budgets: dict[str, QuotaConfig]) -> None:
        """The budgets of the keys made through the API from now on (gateway/keys/), quotas beside the config's."""
        self.budgets = budgets
        self.use_quotas(self.cfg.index().quotas)

    def use_quotas(self, quotas: dict[str, QuotaConfig]) -> None:
        """The quotas from now on (a reload), with the keys' budgets: their gate is made on first need and kept (it
        settles the holds of running requests), and listens to every ledger; no quota: nothing is checked or held."""
        quotas = {**quotas, **self.budgets} if self.budgets else quotas
        if quotas and self.quota_gate is None:
            self.quota_gate = QuotaGate(quotas)
            for ledger in self.pools.ledgers:
                ledger.listen(self.quota_gate)
            if self.shared is not None:  # NOTE: a reload comes while serving: the shared state is connected
                self.quota_gate.use_redis(self.shared)
        elif self.quota_gate is not None:
            self.quota_gate.configure(quotas)
        self.quotas = self.quota_gate if quotas else None

    # ---- configuration (gateway/component.py) --------------------------------------------------------------------
    @staticmethod
    def check(old: GatewayConfig, new: GatewayConfig) -> None:
        if old.state is not None and old.backends != new.backends:
            raise ReloadError(
                "backends changed: with state (replicas share each backend's leases in Redis), roll a backend change "
                "out by restarting the replicas one by one"
            )

    def configure(self, cfg: GatewayConfig) -> None:
        """The tenant tree, the prices, the quotas and the limits of the requests from now on; a queued or running
        request keeps its price and the level it was queued at."""
        retree.apply(self.pools.ledgers, self.cfg, cfg, self.set_weight)
        if cfg.tokenizer != self.cfg.tokenizer:
            self.count_tokens = token_counter(cfg.tokenizer)
        self.prices, self.pools.placement = cfg.price_table(), cfg.placement()
        base = LinearCost(cfg.w_p, cfg.w_q)
        self.price = None if self.ledger.cost == base else base
        self.tenants.follow(self.cfg, cfg)  # NOTE: in place: the admin API reads this list
        self.use_quotas(cfg.index().quotas)
        self.cfg = cfg

    async def start(self) -> None:
        """Join the shared state (it syncs in a task of its own), the quotas' use kept there."""
        if self.shared is not None:
            await self.shared.start()
            if self.quota_gate is not None:
                self.quota_gate.use_redis(self.shared)

    async def stop(self) -> None:
        """The quotas' last settles, then leave the shared state and close the usage log."""
        if self.quota_gate is not None:
            await self.quota_gate.drain()
        if self.shared is not None:
            await self.shared.stop()
        self.usage.close()

    def set_weight(self, tenant: str, weight: float) -> None:
        for ledger in self.pools.ledgers:
            ledger.set_weight(tenant, weight)
        if self.shared is not None:
            self.shared.set_weight(tenant, weight)
        self.dispatch()

    def reset(self) -> None:
        for ledger in self.pools.ledgers:
            ledger.reset()
        if self.shared is not None:
            self.shared.reset()
        self.dispatch()
