"""A new configuration's tenant tree, put in place through each ledger's own API (a live reload): new tenants show
up at once, every node's priority and permitted levels follow the file (`Ledger.set_node`), and a weight the file
changed since the last load is set (one the file left alone keeps what the admin API set).

What changes is worked out from the two configurations alone (`plan`, made once per pair: a reload makes it off the
event loop), so that putting it in place on the loop is O(changed nodes), not O(tenants): a ledger's nodes are
configured only from the configuration (at its making and at each reload), so they hold the old one's levels."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

from ...core import Ledger, Unsupported
from .config import GatewayConfig


@dataclass(frozen=True)
class Retree:
    """The change from one configuration's tree to another's."""

    added: list[str]  # tenants the new one has and the old had not, in the new one's order
    levels: list[tuple[str, int | None, frozenset[int] | None]]  # nodes whose priority or permitted levels changed
    weights: list[tuple[str, float]]  # nodes whose weight the file changed (or added)
    line: str  # for the reload's log line
    kept: int  # how many of the old one's tenants, in order, the new one begins with (`Names.follow`)


class Names(list[str]):
    """A configuration's tenant names in order (the scheduler's, which the admin API reads), made the next one's in
    place (`follow`): only those after the names both begin with, where it holds the running one's (O(what changed)
    on the event loop: a tenant added at the end, one name set)."""

    def __init__(self, cfg: GatewayConfig) -> None:
        super().__init__(cfg.index().names)
        self.of = cfg.index().names  # the names it was last made from

    def follow(self, old: GatewayConfig, new: GatewayConfig) -> None:
        names = new.index().names
        kept = plan(old, new).kept if self.of is old.index().names else 0
        self[kept:] = names[kept:]
        self.of = names


def plan(old: GatewayConfig, new: GatewayConfig) -> Retree:
    """The change from `old`'s tree to `new`'s, made once and kept with `new` (`ServerConfig.derived`)."""
    made = new.derived("retree", lambda: (weakref.ref(old), _plan(old, new)))
    return made[1] if made[0]() is old else _plan(old, new)


def _plan(old: GatewayConfig, new: GatewayConfig) -> Retree:
    first, after = old.index(), new.index()
    before = first.name_set
    added = [n for n in after.names if n not in before]
    pairs = enumerate(zip(first.names, after.names, strict=False))  # NOTE: a loop: the event loop runs between
    kept = next((i for i, (a, b) in pairs if a != b), min(len(first.names), len(after.names)))
    w0 = old.weights()
    weights = [(path, w) for path, w in new.weights().items() if w0.get(path) != w]
    changed = sum(1 for path, _ in weights if path in w0)  # NOTE: a node added is not a weight changed
    p0, p1, a0, a1 = old.priorities(), new.priorities(), old.allowed(), new.allowed()
    levels = [
        (n, p1.get(n), frozenset(a1[n]) if n in a1 else None)
        for n in dict.fromkeys([*p0, *p1, *a0, *a1])
        if p0.get(n) != p1.get(n) or set(a0.get(n, ())) != set(a1.get(n, ()))
    ]
    removed = len(before) + len(added) - len(after.names)  # NOTE: no set difference: one long call holds the GIL
    line = f"{len(after.names)} tenants ({len(added)} added, {removed} removed), {changed} "
    line += "weights changed" + (f", {len(levels)} priorities changed" if levels else "")
    return Retree(added, levels, weights, line, kept)


def apply(
    ledgers: list[Ledger], old: GatewayConfig, new: GatewayConfig, set_weight: Callable[[str, float], None]
) -> None:
    change = plan(old, new)
    for ledger in ledgers:
        for name in change.added:
            ledger.account(name)  # NOTE: a new tenant shows up at once (admin API, /metrics), with its groups
        set_levels(ledger, change.levels)
    for path, w in change.weights:
        try:
            set_weight(path, w)
        except Unsupported:
            pass  # NOTE: fcfs, rpm: weights change nothing


def set_levels(ledger: Ledger, levels: list[tuple[str, int | None, frozenset[int] | None]]) -> None:
    """Each node's priority and, for a tenant, the priorities it may name, as the new configuration has them (a
    node it configures no longer falls back to its parent's level, and to naming only its own), through the ledger
    (`set_node`): the next request runs at the new level, a queued one keeps the level it was queued at."""
    for path, level, may in levels:
        if path in ledger.accounts:
            ledger.set_node(path, priority=level, allowed=may)
        elif path in ledger.groups:
            ledger.set_node(path, priority=level)


def summary(old: GatewayConfig, new: GatewayConfig) -> str:
    """What a reload from `old` to `new` changes in the tree, for its log line."""
    return plan(old, new).line
