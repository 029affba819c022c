"""Live configuration: `SIGHUP` or `POST /admin/reload` re-read the config file (with the same flags on top) and apply
the tenant tree — tenants, keys, weights, groups, model access, quotas — and the models' prices without dropping a
queued or in-flight request (a request keeps the price of its arrival). Anything else changed needs a restart: such
a file is refused, as is one that does not validate, with one line, and the running configuration is kept.

Decisions (docs/gateway.md, Live configuration): a removed tenant's queued and running requests are served (they were
accepted with a valid key), its key is refused (401) from then on; a weight the file changed since the last load
wins over one set through the admin API, an unchanged one leaves the admin's in place; with `--state` a weight the
reload changes is published to every replica (as an admin change is), the rest is this replica's."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..core import Unsupported
from ..core.account import nodes_of
from .config import GatewayConfig
from .quota_gate import QuotaGate
from .scheduler import price_table

if TYPE_CHECKING:
    from .app import Gateway

log = logging.getLogger("fairserve.gateway")
LIVE = frozenset({"tenants", "groups", "prices"})  # the keys a reload applies


class ReloadError(ValueError):
    """The new configuration was refused (one line); the running one is kept."""


def _levels(cfg: GatewayConfig) -> tuple[dict[str, int], dict[str, list[int]]]:
    return cfg.priorities(), cfg.allowed()


def check(old: GatewayConfig, new: GatewayConfig) -> None:
    """ReloadError if `new` changes what only a restart can change."""
    changed = [k for k in type(old).model_fields if k not in LIVE and getattr(old, k) != getattr(new, k)]
    if changed:
        raise ReloadError(
            f"{', '.join(changed)} changed: only a restart applies that (tenants, groups and prices reload)"
        )
    (p0, a0), (p1, a1) = _levels(old), _levels(new)
    kept = nodes_of([t.name for t in old.tenants]) & nodes_of([t.name for t in new.tenants])
    moved = sorted(n for n in kept if p0.get(n) != p1.get(n) or a0.get(n) != a1.get(n))
    if moved:
        raise ReloadError(f"the priorities of {', '.join(moved)} changed: only a restart applies that")


def apply(gw: Gateway, new: GatewayConfig) -> str:
    """Put `new`'s tenant tree in place (after `check`); returns the line to log."""
    old, sched = gw.cfg, gw.sched
    before, after = {t.name for t in old.tenants}, [t.name for t in new.tenants]
    priorities, allowed = new.priorities(), new.allowed()
    known = nodes_of(list(before))
    for ledger in sched.pools.ledgers:
        for path in nodes_of(after) - known:  # NOTE: new nodes take their levels before their first request
            if path in priorities:
                ledger.node(path).priority = priorities[path]
        for t in after:
            if t not in before:
                ledger.account(t)
                if t in allowed:
                    ledger.account(t).allowed = frozenset(allowed[t])
    w0, changed = old.weights(), 0
    for path, w in new.weights().items():
        if w0.get(path) != w:
            try:
                sched.set_weight(path, w)
            except Unsupported:
                pass  # NOTE: fcfs, rpm: weights change nothing
            changed += 1
    sched.prices = price_table(new)  # NOTE: for requests from now on; one queued or running keeps its own
    sched.tenants[:] = after  # NOTE: in place: the admin API reads this list
    gw.owners.replace(new.key_owners())
    gw.tenant_names = frozenset(after)
    models = new.allowed_models()
    gw.proxy.allowed_models = gw.tokenize.allowed_models = models
    quotas = new.quotas()
    if quotas and sched.quota_gate is None:
        sched.quota_gate = QuotaGate(quotas)
        if sched.shared is not None:  # NOTE: a reload comes while serving: the shared state is connected
            sched.quota_gate.use_redis(sched.shared)
    elif sched.quota_gate is not None:
        sched.quota_gate.configure(quotas)
    sched.quotas = sched.quota_gate if quotas else None
    gw.cfg = sched.cfg = gw.proxy.cfg = new
    added, removed = len(set(after) - before), len(before - set(after))
    return f"config reloaded: {len(after)} tenants ({added} added, {removed} removed), {changed} weights changed"


def reload(gw: Gateway, load: Callable[[], GatewayConfig]) -> str:
    """Read and apply; ReloadError (one line) when refused, the running configuration kept."""
    try:
        new = load()
    except ValueError as e:
        raise ReloadError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    check(gw.cfg, new)
    return apply(gw, new)
