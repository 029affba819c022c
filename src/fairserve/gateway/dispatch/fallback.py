"""A model's fallbacks (`fallbacks`, gateway/settings/config.py), both ways read from `up_fallbacks`. At arrival a
request whose pool is down is served as its first fallback up (`fallback`); once queued, it moves (`Fallbacks.move`)
to its first fallback that may serve it sooner:

- past a queue wait, `fallback_after_s` (0: never): a fallback with a backend up and fewer requests queued than the
  request's own pool;
- when its own pool goes down (its queued requests would fail after `fail_fast_s`): a fallback with a backend up.

A request moves once, to a model its tenant may use: its entry leaves its own pool's ledger uncharged and joins the
fallback's, with the same tenant, footprint and priority (so VTC orders it there by the tenant's counter in that
ledger), priced as that model; the proxy sends its body with that model (gateway/relay/proxy.py), and the usage log
names the model it was served as."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from ...core import CostFunction, RequestState
from ...tenancy.access import model_refused
from ..admission.ticket import entry
from .pools import UnknownModel

if TYPE_CHECKING:
    from ..admission.ticket import Ticket
    from ..settings.config import GatewayConfig
    from .pools import Dispatch, Pool

log = logging.getLogger("fairserve.gateway")


def up_fallbacks(pools: Dispatch, model: str, fallbacks: Mapping[str, Sequence[str]]) -> Iterator[tuple[str, Pool]]:
    """Each of `model`'s fallbacks whose pool has a backend up, with that pool, in order (a model no backend serves
    is passed over)."""
    for alternative in fallbacks.get(model, ()):
        try:
            pool = pools.route(alternative)
        except UnknownModel:
            continue
        if any(b.healthy for b in pool.backends):
            yield alternative, pool


def fallback(pools: Dispatch, model: str | None, fallbacks: Mapping[str, Sequence[str]]) -> str | None:
    """At arrival, the model to serve a request for `model` instead: while every backend of `model`'s pool is down,
    its first fallback up. None: serve `model` (its pool has a backend up, or no fallback is up either)."""
    if model is None or model not in fallbacks:
        return None
    try:
        if any(b.healthy for b in pools.route(model).backends):
            return None
    except UnknownModel:  # NOTE: a model no backend serves: its own 404, as without fallbacks
        return None
    return next((alternative for alternative, _ in up_fallbacks(pools, model, fallbacks)), None)


class Scheduler(Protocol):
    cfg: GatewayConfig
    pools: Dispatch
    prices: dict[str, CostFunction]
    price: CostFunction | None
    clock: Callable[[], float]

    def dispatch(self) -> None: ...


class Fallbacks:
    """The scheduler's moves of queued requests to their model's fallbacks."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched

    def after_s(self, t: Ticket) -> float | None:
        """How long `t` waits before it may move (None: it does not)."""
        cfg = self.sched.cfg
        if not cfg.fallback_after_s or t.fell_back_from is not None or not cfg.fallbacks.get(t.model or ""):
            return None
        return cfg.fallback_after_s

    def move(self, t: Ticket, down: bool = False) -> bool:
        """Move queued `t` to the first of its model's fallbacks with a backend up and (unless its own pool is
        `down`) fewer requests queued; whether it moved."""
        req, own, sched = t.req, t.pool, self.sched
        if req is None or req.state is not RequestState.QUEUED or t.fell_back_from is not None or t.model is None:
            return False
        allowed = sched.cfg.index().allowed_models
        for model, pool in up_fallbacks(sched.pools, t.model, sched.cfg.fallbacks):
            if pool is own or model_refused(allowed, t.tenant, model) is not None:
                continue
            if not down and pool.queued >= own.queued:
                continue
            cost = sched.prices.get(model, sched.price)
            moved = entry(t, f"{req.id}>{model}", req.priority, cost)
            if not pool.ledger.add(moved):  # NOTE: a policy that refuses it there (rpm): it stays where it is
                continue
            own.ledger.settle(req, prompt=0, output=0, cancelled=True)  # NOTE: its quota hold, if any, settled too
            t.holding = None  # NOTE: a request that failed once and was requeued holds anew at its next dispatch
            t.pool.queued -= 1  # NOTE: `own`: its pool until the line below
            pool.queued += 1
            t.req, t.pool, t.cost, t.fell_back_from, t.model = moved, pool, cost, t.model, model
            log.info("request %s: moved from %s to its fallback %s", t.request_id, t.fell_back_from, model)
            sched.dispatch()
            return True
        return False
