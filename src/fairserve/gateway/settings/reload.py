"""Live configuration: `SIGHUP` or `POST /admin/reload` re-read the config file (with the same flags on top) and apply
it without dropping a queued or in-flight request: the tenant tree (tenants, keys, weights, priorities and the
priorities a tenant may name, groups, model access, quotas, rate caps), the models' prices and `w_p`/`w_q` (a request
keeps the price of its arrival), the backends (gateway/dispatch/fleet.py: added ones serve at once, removed ones drain,
queued requests go to the new pools), the timeouts of the upstream hop and the queue (for requests and connections from
then on), and the limits read at each request, in two phases over every part (gateway/component.py): each checks the new
configuration, then each configures itself from it. What only a restart can change (each such key says so and why where
it is declared, `key(restart=...)`: the listening socket, the policy and its ledgers, the shared state, the HTTP
server's own settings, ...) is refused, as is a file that cannot be read (read off the event loop, bounded in size and
time: api/config.py) or does not validate, with one line naming the keys or the file and why, and the running
configuration is kept.

Decisions (docs/gateway.md, Live configuration): a removed tenant's queued and running requests are served (they were
accepted with a valid key), its key is refused (401) from then on; a priority (or a permission to name one) changes
through the ledger (`Ledger.set_node`) for the requests from then on, while queued ones keep the level they were queued
at; a weight the file changed since the last load wins over one set through the admin API, an unchanged one leaves the
admin's in place; with `--state` a weight the reload changes is published to every replica (as an admin change is), the
rest is this replica's, and a backend change is refused (the replicas share each backend's leases: restart them one by
one)."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ...api.keys import reload_keys
from ..admission.ticket import Ending
from ..component import Component, ReloadError
from ..dispatch import fleet
from ..dispatch.pools import UnknownModel
from . import pauses, retree
from .config import GatewayConfig

if TYPE_CHECKING:
    from ..admission.scheduler import Scheduler
    from ..dispatch.health import HealthMonitor

__all__ = ["ReloadError", "apply", "check", "prepare", "reload"]

log = logging.getLogger("fairserve.gateway")


class Gateway(Protocol):
    """What a reload reads of the gateway (gateway/instance.py)."""

    cfg: GatewayConfig
    sched: Scheduler
    health: HealthMonitor
    reloading: asyncio.Lock
    frozen: bool

    def parts(self) -> list[Component]:
        """Every part, in the order they apply a new configuration."""


def check(gw: Gateway, new: GatewayConfig) -> None:
    """Phase one: ReloadError if `new` changes a key only a restart applies (declared with `key(restart=...)`), or
    a part refuses it."""
    old = gw.cfg
    _, restart = reload_keys(type(old))  # NOTE: from the fields' declarations, whatever keys the model has
    changed = [k for k in restart if getattr(old, k) != getattr(new, k)]
    if changed:
        reasons = [restart[k] for k in changed]
        why = "; ".join(f"{k}: {r}" for k, r in zip(changed, reasons, strict=True)) if len(changed) > 1 else reasons[0]
        raise ReloadError(f"{', '.join(changed)} changed: only a restart applies that ({why})")
    for part in gw.parts():
        part.check(old, new)


def apply(gw: Gateway, new: GatewayConfig, change: fleet.Change) -> str:
    """Phase two: put `new` in place (after `check`, with `change` to the backends prepared); returns the line to
    log."""
    sched = gw.sched
    line = retree.summary(gw.cfg, new)
    # NOTE: every part configures itself, nothing else sets their attributes; the scheduler first, so that the
    # pools the backends' change makes take the new tenant tree
    first, *rest = gw.parts()
    first.configure(new)
    unserved = fleet.apply(sched, change) if change else []
    for part in rest:  # NOTE: after the backends' change: capacity scrapes the adaptive ones it left
        part.configure(new)
    for t in unserved:  # NOTE: now that the pools are consistent; each answers 404 to its client
        err = UnknownModel(t.model or "", sched.pools.served())
        sched.close(t, Ending("model_not_found", refund=True))
        if not t.admitted.done():
            t.admitted.set_exception(err)
    sched.dispatch()  # NOTE: queued requests may go to an added backend now
    if change:
        line += ", " + change.summary()
        if unserved:
            line += f", {len(unserved)} queued requests for models no backend serves now answered 404"
    return "config reloaded: " + line


def prepare(gw: Gateway, load: Callable[[], GatewayConfig]) -> GatewayConfig:
    """The new configuration read and validated, and what the parts derive from its tenants (`index()`) and the
    tree's change from the running one (`retree.plan`) made with it: all O(tenants), on a thread (under the reload's
    lock: the running configuration stays), so that `apply` on the event loop is O(what changed)."""
    new = load()
    new.index()
    retree.plan(gw.cfg, new)  # NOTE: `gw`, not its config, is the argument: nothing outlives this call holding it
    return new


async def reload(gw: Gateway, load: Callable[[], GatewayConfig]) -> str:
    """Read, check, prepare (added backends checked) and apply; ReloadError (one line) when refused, the running
    configuration kept. One reload at a time; no full collection while it runs, and what is alive frozen once it is
    applied, where the gateway froze what it held at start (gateway/settings/pauses.py)."""
    async with gw.reloading:
        with pauses.building(gw.frozen):
            return await _reload(gw, load)


async def _reload(gw: Gateway, load: Callable[[], GatewayConfig]) -> str:
    try:
        # NOTE: off the event loop: reading (bounded: api/config.py) and validating a large file take seconds
        new = await asyncio.to_thread(prepare, gw, load)
    except (ValueError, OSError) as e:  # NOTE: OSError: a file a key names (ssl_certfile, ...) may be unreadable
        raise ReloadError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    check(gw, new)
    change = fleet.plan(gw.sched, new.backends)
    gw.health.configure(new)  # NOTE: the new path and timeout for the checks of added backends
    try:
        await gw.health.check_all(change.added)
    finally:
        gw.health.configure(gw.cfg)
    old = gw.cfg
    line = apply(gw, new, change)
    if sys.getrefcount(old) == 2:  # NOTE: this function holds it, and the call's argument: nothing else does
        await asyncio.to_thread(old.release)  # NOTE: freed a tenant at a time, off the event loop
    return line
