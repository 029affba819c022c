"""The backend set changed while serving (a live reload, gateway/settings/reload.py): added backends take requests at
once, removed ones drain, changed ones take their new settings, and queued requests go to the pools of the new set.

- **Added**: it joins `Scheduler.backends`, the list that health checks, adaptive capacity, `/v1/models`, `/healthz`
  and `/metrics` read (with active health checks it is checked, and its models read, before it joins).
- **Removed**: it leaves that list, so no new request goes to it; with requests in flight it is **draining**
  (`Scheduler.draining`, request limit 0: no pool admits to it) until the last one ends, then it is dropped. Added
  back while draining, it is the same backend again (its requests in flight still count).
- **Changed** (same URL): its settings (limits, models, key, adaptive, engine_tenant) are replaced in place; requests
  in flight keep their slots on it.
- **Queued requests** are routed again (`Dispatch.route`): one whose model no backend serves any more ends at once
  with the gateway's 404 `model_not_found`. Running requests stay on their backend; one that then fails before any
  output and goes back to the queue is routed again (`Scheduler.backend_failed`).

Counters, `per_model` scope (a ledger per pool). No request ever changes ledger, so no charge is lost or counted
twice. A pool made because the backends of some models changed takes the ledger of the pool that served those models
(the tenants' counters and service carry over; the parts of a pool that splits share its ledger). Where pools merge
(a backend removed), the merged pool keeps its own ledger, or the first one's; requests queued in another ledger are
admitted from that ledger to the merged pool's backends (a pool of their own here, under a key no route gives) until
it is empty, and that ledger orders nothing new: its service and counters stay in the totals (admin API, `/metrics`).
`global` scope has one ledger: only the pools change."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ...core import Ledger
from ..settings.backends import BackendConfig
from .pools import Backend, Dispatch, Pool, UnknownModel

if TYPE_CHECKING:
    from ..admission.ticket import Ticket


class Scheduler(Protocol):
    """What a backend change reads and sets of the scheduler (gateway/admission/scheduler.py)."""

    backends: list[Backend]  # NOTE: changed in place: Dispatch and the health checks hold this list
    draining: list[Backend]
    pools: Dispatch


log = logging.getLogger("fairserve.gateway")
_LEFTOVER = "~ledger:"  # NOTE: in a leftover pool's key: never a backend URL (those are http(s)://...)


@dataclass
class Change:
    """What a new backend list changes (`plan`), applied by `apply`."""

    backends: list[Backend]  # the new list, in the configuration's order
    added: list[Backend] = field(default_factory=list)  # made for it (not yet serving)
    changed: list[tuple[Backend, BackendConfig]] = field(default_factory=list)  # kept, with new settings
    removed: list[Backend] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed)

    def summary(self) -> str:
        """What the change did, for the log line (once applied)."""
        n, draining = len(self.backends), sum(b.requests for b in self.removed)
        line = f"{n} backend{'' if n == 1 else 's'} ({len(self.added)} added, {len(self.removed)} removed, "
        line += f"{len(self.changed)} changed"
        return line + (f"; draining {draining} requests in flight)" if draining else ")")


def plan(sched: Scheduler, configs: list[BackendConfig]) -> Change:
    """The change from the running backends to `configs` (nothing applied yet)."""
    running = {b.url: b for b in sched.backends}
    draining = {b.url: b for b in sched.draining}
    change = Change([])
    for cfg in configs:
        b = running.pop(cfg.url, None) or draining.get(cfg.url)
        if b is None:
            b = Backend(cfg)
            change.added.append(b)
        elif b.cfg != cfg or b in sched.draining:
            change.changed.append((b, cfg))
        change.backends.append(b)
    change.removed = list(running.values())
    return change


def _configure(b: Backend, cfg: BackendConfig) -> None:
    """`b` takes `cfg`'s settings; its requests in flight stay."""
    fresh = Backend(cfg)
    adaptive = b.cfg.adaptive and cfg.adaptive and b.limit > 0
    b.cfg, b.token_limit = cfg, fresh.token_limit
    b.limit = min(b.limit, cfg.max_inflight_requests) if adaptive else fresh.limit  # NOTE: adaptive: from where it is
    if cfg.models:
        b.models, b.listing = fresh.models, fresh.listing
    # NOTE: models no longer named in the config: the list it had stays until a health check reads its /v1/models


def apply(sched: Scheduler, change: Change) -> list[Ticket]:
    """Put the new backend list in place and route the queued requests again; returns the tickets whose model no
    backend serves now (the caller ends them with 404 `model_not_found`, once the pools are consistent)."""
    d = sched.pools
    before = [(b.url, b.models) for b in sched.backends]
    old = dict(d.pools)
    for b, cfg in change.changed:
        _configure(b, cfg)
        if b in sched.draining:
            sched.draining.remove(b)
            log.info("backend %s added back: it takes requests again", b.name)
    for b in change.removed:
        b.limit = 0  # NOTE: no pool admits to it; requests in flight finish
        if b.requests:
            sched.draining.append(b)
            log.info("backend %s removed: draining %d requests in flight", b.name, b.requests)
        else:
            log.info("backend %s removed", b.name)
    sched.backends[:] = change.backends  # NOTE: in place: Dispatch and the health checks hold this list
    # a ledger's standing follows its models: each pool of the new set that serves them is made with it
    served = sorted({m for _, ms in before for m in (ms or ())})
    every = frozenset(u for u, _ in before)
    for key, pool in old.items():
        models: list[str | None] = [m for m in served if _eligible(before, m) == key]
        for m in models + ([None] if key == every else []):
            try:
                pool_for(d, m, pool.ledger, adopt_only=True)
            except UnknownModel:
                pass
    unserved: list[Ticket] = []
    for ledger in list(d.ledgers):
        for req in sorted(ledger.queued(), key=lambda r: r.seq):
            t: Ticket = req.item
            try:
                pool = pool_for(d, t.model, ledger)
            except UnknownModel:
                unserved.append(t)
                continue
            if pool is not t.pool:
                t.pool.queued -= 1
                pool.queued += 1
                t.pool = pool
    current = set(sched.backends)
    for key, pool in list(d.pools.items()):
        leftover = any(k.startswith(_LEFTOVER) for k in key)
        if any(b not in current for b in pool.backends) or (leftover and not pool.queued):
            del d.pools[key]  # NOTE: requests running from it still settle through it (`Ticket.pool`)
    return unserved


def _eligible(backends: list[tuple[str, frozenset[str] | None]], model: str) -> frozenset[str]:
    return frozenset(u for u, ms in backends if ms is None or model in ms)


def pool_for(d: Dispatch, model: str | None, ledger: Ledger, adopt_only: bool = False) -> Pool:
    """The pool `model` goes to now, for a request queued in `ledger` (UnknownModel if no backend serves it). A pool
    made by this call takes `ledger` (`per_model`); an existing pool with another ledger is served, for this ledger's
    requests, by a leftover pool over the same backends (`adopt_only`: not made, the existing pool returned)."""
    n = len(d.pools)
    pool = d.route(model)
    if len(d.pools) > n and pool.ledger is not ledger:
        made, pool.ledger = pool.ledger, ledger
        if made is not d.ledgers[0]:
            d.ledgers.remove(made)  # NOTE: made by this route: nothing in it
    if pool.ledger is ledger or adopt_only:
        return pool
    key = frozenset([*(b.url for b in pool.backends), f"{_LEFTOVER}{id(ledger)}"])
    leftover = d.pools.get(key)
    if leftover is None:
        leftover = d.pools[key] = Pool(pool.backends, ledger)
    return leftover


def connections(configs: list[BackendConfig], draining: list[Backend]) -> int:
    """The upstream connection pool's size: every backend's request limit, the draining ones' requests, and some."""
    return sum(b.max_inflight_requests for b in configs) + sum(b.requests for b in draining) + 16


def stale(d: Dispatch, pool: Pool) -> bool:
    """Whether `pool` is no longer one of the dispatcher's (a reload changed its backends)."""
    return not any(p is pool for p in d.pools.values())
