"""Live configuration: `SIGHUP` or `POST /admin/reload` re-read the config file (with the same flags on top) and apply
it without dropping a queued or in-flight request: the tenant tree (tenants, keys, weights, priorities and the
priorities a tenant may name, groups, model access, quotas), the models' prices and `w_p`/`w_q` (a request keeps the
price of its arrival), the backends (gateway/fleet.py: added ones serve at once, removed ones drain, queued requests go
to the new pools), the timeouts of the upstream hop and the queue (for requests and connections from then on), and the
limits read at each request. What only a restart can change (`RESTART`: the listening socket, the policy and its
ledgers, the shared state, the HTTP server's own settings, ...) is refused, as is a file that cannot be read (read off
the event loop, bounded in size and time: api/config.py) or does not validate, with one line naming the keys or the
file and why, and the running configuration is kept.

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
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..api.tokens import token_counter
from ..core import Ledger, LinearCost, Unsupported
from . import fleet
from .config import GatewayConfig
from .dispatch import UnknownModel
from .scheduler import price_table
from .ticket import Ending

if TYPE_CHECKING:
    from .instance import Gateway

log = logging.getLogger("fairserve.gateway")

# the keys a reload applies (docs/gateway.md, Live configuration)
LIVE = frozenset(
    {
        "tenants", "groups", "prices", "w_p", "w_q", "backends",
        "connect_timeout_s", "request_timeout_s", "chunk_timeout_s", "queue_ttl_s", "queue_limit", "max_body_bytes",
        "tokenize_concurrency", "default_max_tokens", "tokenizer", "trusted_proxy", "models", "metrics_key",
        "backend_cooldown_s", "retry_after_max_s", "health_path", "health_interval_s", "metrics_interval_s",
        "metrics_window_s", "client_write_timeout_s", "client_min_rate",
        "client_buffer_bytes", "client_buffer_total_bytes", "auth_failure_limit", "auth_failure_window_s",
    }
)  # fmt: skip
_SERVER = "the HTTP server's, set when it starts"
# the keys only a restart applies, and why (a key in neither set: a restart, too)
RESTART = {
    "listen": "the socket is bound at start",
    "policy": "the counters are the policy's",
    "scope": "it decides the ledgers that hold the counters",
    "state": "the replicas' shared state is joined at start",
    "state_interval_s": "the replicas' shared state is joined at start",
    "state_ttl_s": "every replica must use the same",
    "snapshot": "it is restored at start",
    "snapshot_interval_s": "the snapshots are scheduled at start",
    "usage_log": "it is opened at start",
    "admin_key": "the admin API takes it at start",
    "client_timeout_s": _SERVER,
    "drain_timeout_s": _SERVER,
    "access_log": _SERVER,
    "max_header_bytes": _SERVER,
    "max_headers": _SERVER,
    "ssl_certfile": _SERVER,
    "ssl_keyfile": _SERVER,
    "forwarded_allow_ips": _SERVER,
}


class ReloadError(ValueError):
    """The new configuration was refused (one line); the running one is kept."""


def check(gw: Gateway, new: GatewayConfig) -> None:
    """ReloadError if `new` changes what only a restart can change."""
    old = gw.cfg
    changed = [k for k in type(old).model_fields if k not in LIVE and getattr(old, k) != getattr(new, k)]
    if changed:
        reasons = [RESTART.get(k, "it is read at start") for k in changed]
        why = "; ".join(f"{k}: {r}" for k, r in zip(changed, reasons, strict=True)) if len(changed) > 1 else reasons[0]
        raise ReloadError(f"{', '.join(changed)} changed: only a restart applies that ({why})")
    if (old.health_interval_s > 0) != (new.health_interval_s > 0):
        raise ReloadError("health_interval_s changed: only a restart turns active health checks on or off")
    if old.state is not None and old.backends != new.backends:
        raise ReloadError(
            "backends changed: with state (replicas share each backend's leases in Redis), roll a backend change out "
            "by restarting the replicas one by one"
        )


def _tenants(gw: Gateway, new: GatewayConfig) -> str:
    """Put `new`'s tenant tree, prices and quotas in place; returns what changed, for the log line."""
    old, sched = gw.cfg, gw.sched
    before, after = {t.name for t in old.tenants}, [t.name for t in new.tenants]
    levels = 0
    for ledger in sched.pools.ledgers:
        for t in after:
            ledger.account(t)  # NOTE: a new tenant shows up at once (admin API, /metrics), with its groups
        levels = max(levels, set_levels(ledger, new))
    w0, changed = old.weights(), 0
    for path, w in new.weights().items():
        if w0.get(path) != w:
            try:
                sched.set_weight(path, w)
            except Unsupported:
                pass  # NOTE: fcfs, rpm: weights change nothing
            changed += 1
    # NOTE: prices for requests from now on; one queued or running keeps its own
    sched.prices = price_table(new)
    base = LinearCost(new.w_p, new.w_q)
    sched.price = None if sched.ledger.cost == base else base
    sched.tenants[:] = after  # NOTE: in place: the admin API reads this list
    gw.owners.replace(new.key_owners())
    gw.tenant_names = frozenset(after)
    models = new.allowed_models()
    gw.proxy.allowed_models = gw.tokenize.allowed_models = models
    sched.use_quotas(new.quotas())
    added, removed = len(set(after) - before), len(before - set(after))
    line = f"{len(after)} tenants ({added} added, {removed} removed), {changed} weights changed"
    return line + (f", {levels} priorities changed" if levels else "")


def set_levels(ledger: Ledger, cfg: GatewayConfig) -> int:
    """Every node's priority and, for a tenant, the priorities it may name, as `cfg` configures them (a node it
    configures no longer falls back to its parent's level, and to naming only its own), through the ledger
    (`set_node`): the next request runs at the new level, a queued one keeps the level it was queued at. Returns how
    many nodes changed."""
    priorities = cfg.priorities()
    allowed = {t: frozenset(levels) for t, levels in cfg.allowed().items()}
    changed = 0
    for path, node in [*ledger.groups.items(), *ledger.accounts.items()]:
        level = priorities.get(path)
        if path in ledger.accounts:
            may = allowed.get(path)
            if node.priority != level or node.allowed != may:
                ledger.set_node(path, priority=level, allowed=may)
                changed += 1
        elif node.priority != level:
            ledger.set_node(path, priority=level)
            changed += 1
    return changed


def _settings(gw: Gateway, new: GatewayConfig) -> None:
    """The settings read by the gateway's parts from the next request, connection, check or scrape on."""
    sched = gw.sched
    if new.tokenizer != gw.cfg.tokenizer:
        sched.count_tokens = token_counter(new.tokenizer)
    gw.upstream.configure(
        new.connect_timeout_s,
        new.chunk_timeout_s,
        new.request_timeout_s,
        fleet.connections(new.backends, sched.draining),
    )
    gw.health.configure(new)
    gw.capacity.interval_s = new.metrics_interval_s
    gw.metrics.activity.window_s = new.metrics_window_s
    gw.stalls.timeout_s, gw.stalls.min_rate = new.client_write_timeout_s, new.client_min_rate
    gw.stalls.period_s = min(1.0, new.client_write_timeout_s / 4)
    gw.throttle.limit, gw.throttle.window_s = new.auth_failure_limit, new.auth_failure_window_s
    # NOTE: the rest (queue_limit, queue_ttl_s, max_body_bytes, timeouts of the queue, ...) is read from the config
    gw.cfg = sched.cfg = gw.proxy.cfg = gw.tokenize.cfg = new


def apply(gw: Gateway, new: GatewayConfig, change: fleet.Change) -> str:
    """Put `new` in place (after `check`, with `change` to the backends prepared); returns the line to log."""
    sched = gw.sched
    line = _tenants(gw, new)
    unserved = fleet.apply(sched, change) if change else []
    if change:
        gw.capacity.follow()
        gw.capacity.start()
    _settings(gw, new)
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


async def reload(gw: Gateway, load: Callable[[], GatewayConfig]) -> str:
    """Read, check, prepare (added backends checked) and apply; ReloadError (one line) when refused, the running
    configuration kept. One reload at a time."""
    async with gw.reloading:
        try:
            # NOTE: off the event loop: reading (bounded: api/config.py) and validating a large file take seconds
            new = await asyncio.to_thread(load)
        except (ValueError, OSError) as e:  # NOTE: OSError: a file a key names (ssl_certfile, ...) may be unreadable
            raise ReloadError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
        check(gw, new)
        change = fleet.plan(gw.sched, new.backends)
        gw.health.configure(new)  # NOTE: the new path and timeout for the checks of added backends
        try:
            await gw.health.check_all(change.added)
        finally:
            gw.health.configure(gw.cfg)
        return apply(gw, new, change)
