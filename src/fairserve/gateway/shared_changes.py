"""What changed on this replica since its last sync with the shared state (gateway/shared_state.py), so that a sync
costs what changed rather than what exists: the accounts charged, lifted or whose backlog changed (tenants, and the
groups of the tenant tree above them), the tokens of the requests queued, and the backlog as Redis last heard it.
Nothing here is O(tenants) but a batch of everything, sent only when Redis must be told everything again (it lost
its data), and the whole backlog, sent when Redis may not have it.

Groups are shared as tenants are: a group's counter and service live in Redis, each replica adds what it charged
below the group (the sum of its tenants' charges in the batch), Redis lifts a node that becomes backlogged anywhere
(`redis_backlog.py`), and the answer's values replace the local ones (`Ledger.apply_remote(..., groups=False)`:
a tenant's remote charges do not move the groups above it locally, since their own values come back too)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..core import Account, Ledger, Policy, Request

log = logging.getLogger("fairserve.gateway.state")


class Changes:
    """Fed by the policy's queue and charge hooks (`track`, installed before the ledger is built) and by the lift.
    `take()` hands the accounts changed since the last `take()` to the sync being sent and starts afresh."""

    def __init__(self, tokens_of: Callable[[Request], int]) -> None:
        self.tokens_of = tokens_of
        # changed since the last sync was sent: each account with its (counter, service) before its first change
        self.dirty: dict[Account, tuple[float, float]] = {}
        self.pool_of: Callable[[Request], str] = lambda req: ""  # a queued request's model pool (SharedState sets it)
        self.pool_tokens: dict[str, int] = {}  # per pool: capacity tokens of the requests queued
        self._tokens: dict[Any, tuple[str, int]] = {}  # by request id: what `pool_tokens` counted for it
        self.backlog: set[str] = set()  # the tenants Redis was last told are backlogged here
        self.full = True  # send the whole backlog next time (at start; after a failed sync; Redis forgot it)
        self.sent: tuple[str, list[str], list[str]] = ("=", [], [])  # the backlog part of the sync being sent

    def track(self, policy: Policy) -> Policy:
        """`policy`, its hooks wrapped so that every charge and queue change marks its account (the ledger reads
        `on_charge` once, when it is built: so this comes first)."""
        on_charge, enqueue, dequeue, remove = policy.on_charge, policy.enqueue, policy.dequeue, policy.remove

        def charged(acct: Account, amount: float) -> None:
            dirty = self.dirty
            if acct not in dirty:  # NOTE: the ledger added the amount to the service; the counter is to come
                dirty[acct] = (acct.counter, acct.service - amount)
                node = acct.parent  # the groups above it, the same way
                while node is not None and node not in dirty:
                    dirty[node] = (node.counter, node.service - amount)
                    node = node.parent
            on_charge(acct, amount)

        def queued(req: Request, front: bool) -> None:
            self.mark(req.account)
            pool, tokens = self._tokens[req.id] = self.pool_of(req), self.tokens_of(req)
            self.pool_tokens[pool] = self.pool_tokens.get(pool, 0) + tokens
            enqueue(req, front)

        def left(req: Request, hook: Callable[[Request], None]) -> None:
            self.mark(req.account)
            pool, tokens = self._tokens.pop(req.id, ("", 0))
            if tokens:
                self.pool_tokens[pool] -= tokens
            hook(req)

        # NOTE: instance attributes shadow the methods; setattr, since mypy forbids assigning to a method
        setattr(policy, "on_charge", charged)  # noqa: B010
        setattr(policy, "enqueue", queued)  # noqa: B010
        setattr(policy, "dequeue", lambda req: left(req, dequeue))  # noqa: B010
        setattr(policy, "remove", lambda req: left(req, remove))  # noqa: B010
        setattr(policy, "_shared_changes", self)  # noqa: B010
        return policy

    @staticmethod
    def tracked(ledger: Ledger) -> bool:
        return getattr(ledger.policy, "_shared_changes", None) is not None

    def mark(self, acct: Account) -> None:
        """`acct` is about to change (a lift, a queue change), and with it the groups above it. NOTE: the changed
        accounts are closed upwards (a group above a changed account is changed), so the walk stops at the first
        group already marked."""
        dirty = self.dirty
        node: Account | None = acct
        while node is not None and node not in dirty:
            dirty[node] = (node.counter, node.service)
            node = node.parent

    def take(self) -> dict[Account, tuple[float, float]]:
        taken, self.dirty = self.dirty, {}
        return taken

    def base(self, acct: Account) -> tuple[float, float]:
        """`acct`'s (counter, service) as Redis knows them, in local terms: before the changes not yet sent."""
        return self.dirty.get(acct) or (acct.counter, acct.service)

    def counters_reset(self) -> None:
        """The ledger's counters were set to 0: the changes not yet sent count from there."""
        for acct, (_, service) in self.dirty.items():
            self.dirty[acct] = (acct.counter, service)

    def batch(self, ledger: Ledger, everything: bool) -> tuple[list[Any], dict[Account, tuple[float, float]]]:
        """A new batch: the charges and lifts of the accounts changed since the last one (of all accounts with
        `everything`: Redis lost its data) as flat rows, and the values of those it charges as it charges them (its
        snapshot); the backlog's changes are in `sent`."""
        changed = self.take()
        snap: dict[Account, tuple[float, float]] = {}
        charges: list[Any] = []
        groups = ledger.groups
        below: dict[Account, float] = {}  # per group: what this batch charges its tenants
        nodes: list[Account] = []  # the groups changed, after the tenants (their charges are the tenants' sum)
        for acct in ledger.accounts.values() if everything else changed:
            if not everything and groups.get(acct.tenant) is acct:
                nodes.append(acct)
                continue
            base = acct.synced
            ds = acct.service - base if base is not None else acct.service
            lift = acct.lift
            if not ds and lift is None and base is not None and not everything:
                continue
            if ds:
                node = acct.parent
                while node is not None:
                    below[node] = below.get(node, 0.0) + ds
                    node = node.parent
            snap[acct] = (acct.counter, acct.service)
            acct.lift = None  # NOTE: sent with this batch, and with it again if its answer is lost
            charges += _row(acct, ds, lift)
        for group in groups.values() if everything else nodes:
            ds, lift = below.get(group, 0.0), group.lift
            if ds or lift is not None or group.synced is None or everything:
                snap[group] = (group.counter, group.service)
                group.lift = None
                charges += _row(group, ds, lift)
        self.backlog_changes(ledger, changed)
        return charges, snap

    def apply(
        self,
        ledger: Ledger,
        rows: list[list[Any]],
        weights: list[list[Any]],
        snap: dict[Account, tuple[float, float]],
        pending: dict[str, float],
    ) -> None:
        """An answer into the ledger: the weights set since the last one (`weights`: tenants, weights), then the
        global counter and service of the tenants in `rows` (tenants, "COUNTER SERVICE" values), with what this replica
        changed and has not sent (or sent in the batch being answered, `snap`) on top; a weight `pending` (set here,
        not yet sent) stays."""
        accounts = ledger.accounts
        for tenant, w in zip(*weights, strict=True):
            name = _text(tenant)
            acct = accounts.get(name) or ledger.groups.get(name)  # NOTE: a group of the tenant tree has one too
            weight = _num(w)
            if acct is None or weight is None or acct.tenant in pending or weight == acct.weight:
                continue
            try:
                ledger.set_weight(acct.tenant, weight)
            except ValueError as e:  # NOTE: only a hand-edited Redis holds such a weight: keep ours
                log.warning("shared state: ignored the weight of %r: %s", acct.tenant, e)
        groups = ledger.groups
        for tenant, value in zip(*rows, strict=True):
            name = _text(tenant)
            acct = accounts.get(name) or groups.get(name)
            if acct is None or value is None:
                continue
            c, s = _text(value).split(" ")
            counter, service = float(c), float(s)
            c0, s0 = snap[acct] if acct in snap else self.base(acct)
            ledger.apply_remote(acct.tenant, counter + (acct.counter - c0), service + (acct.service - s0), groups=False)
            acct.synced = service
            if acct in self.dirty:  # NOTE: what changed since counts from these values now
                self.dirty[acct] = (counter, service)

    def backlog_changes(self, ledger: Ledger, accounts: Any) -> None:
        """`sent` := ("=", every tenant backlogged here, []) when the whole list is due, else ("+", newly
        backlogged, no longer backlogged) among `accounts` (those changed); what Redis is told is remembered."""
        if self.full:  # NOTE: O(tenants + groups), as the whole backlog is
            self.full = False
            self.backlog = {t for t, a in ledger.accounts.items() if a.queued}
            self.backlog.update(g for g, a in ledger.groups.items() if a.queued)
            self.sent = ("=", sorted(self.backlog), [])
            return
        added, gone = [], []
        for acct in accounts:
            t = acct.tenant
            if acct.queued and t not in self.backlog:
                added.append(t)
                self.backlog.add(t)
            elif not acct.queued and t in self.backlog:
                gone.append(t)
                self.backlog.discard(t)
        self.sent = ("+", added, gone)


def _row(acct: Account, ds: float, lift: float | None) -> list[Any]:
    """A charge row: the node, what this batch charges it (service and counter), its lift or "", and its counter and
    service before the charge (what Redis starts from if it has none)."""
    dc = ds / acct.weight
    return [
        acct.tenant,
        repr(ds),
        repr(dc),
        "" if lift is None else repr(lift),
        repr(acct.counter - dc),
        repr(acct.service - ds),
    ]


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _num(v: Any) -> float | None:
    """A number from the script's answer; None where it answered nil (not set)."""
    return float(v) if v is not None else None
