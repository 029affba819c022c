"""A new configuration's tenant tree, put in place through each ledger's own API (a live reload): new tenants show
up at once, every node's priority and permitted levels follow the file (`Ledger.set_node`), and a weight the file
changed since the last load is set (one the file left alone keeps what the admin API set)."""

from __future__ import annotations

from collections.abc import Callable

from ...core import Ledger, Unsupported
from .config import GatewayConfig


def apply(
    ledgers: list[Ledger], old: GatewayConfig, new: GatewayConfig, set_weight: Callable[[str, float], None]
) -> None:
    for ledger in ledgers:
        for t in new.tenants:
            ledger.account(t.name)  # NOTE: a new tenant shows up at once (admin API, /metrics), with its groups
        set_levels(ledger, new)
    before = old.weights()
    for path, w in new.weights().items():
        if before.get(path) != w:
            try:
                set_weight(path, w)
            except Unsupported:
                pass  # NOTE: fcfs, rpm: weights change nothing


def set_levels(ledger: Ledger, cfg: GatewayConfig) -> None:
    """Every node's priority and, for a tenant, the priorities it may name, as `cfg` configures them (a node it
    configures no longer falls back to its parent's level, and to naming only its own), through the ledger
    (`set_node`): the next request runs at the new level, a queued one keeps the level it was queued at."""
    priorities = cfg.priorities()
    allowed = {t: frozenset(levels) for t, levels in cfg.allowed().items()}
    for path, node in [*ledger.groups.items(), *ledger.accounts.items()]:
        level = priorities.get(path)
        if path in ledger.accounts:
            may = allowed.get(path)
            if node.priority != level or node.allowed != may:
                ledger.set_node(path, priority=level, allowed=may)
        elif node.priority != level:
            ledger.set_node(path, priority=level)


def summary(old: GatewayConfig, new: GatewayConfig) -> str:
    """What a reload from `old` to `new` changes in the tree, for its log line."""
    before, after = {t.name for t in old.tenants}, {t.name for t in new.tenants}
    w0 = old.weights()
    # NOTE: a node added or removed is not a weight changed
    weights = sum(1 for path, w in new.weights().items() if path in w0 and w0[path] != w)
    p0, p1, a0, a1 = old.priorities(), new.priorities(), old.allowed(), new.allowed()
    nodes = set(p0) | set(p1) | set(a0) | set(a1)
    levels = sum(1 for n in nodes if p0.get(n) != p1.get(n) or set(a0.get(n, ())) != set(a1.get(n, ())))
    line = (
        f"{len(after)} tenants ({len(after - before)} added, {len(before - after)} removed), {weights} weights changed"
    )
    return line + (f", {levels} priorities changed" if levels else "")
