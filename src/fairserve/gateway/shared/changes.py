"""What changed on this replica since its last sync with the shared state (gateway/shared/state.py), so that a sync
costs what changed rather than what exists: the accounts charged, lifted or whose backlog changed (tenants, and the
groups of the tenant tree above them), the tokens of the requests queued, and the backlog as Redis last heard it.
Nothing here is O(tenants) but a batch of everything, sent only when Redis must be told everything again (it lost
its data), and the whole backlog, sent when Redis may not have it.

The ledger tells this module what changes (it is the ledger's listener, `Changes`): nothing here patches the policy
or writes the ledger's accounts, and the sync state of each account is kept in side tables here.

Groups are shared as tenants are: a group's counter and service live in Redis, each replica adds what it charged
below the group (the sum of its tenants' charges in the batch), Redis lifts a node that becomes backlogged anywhere
(`redis_backlog.py`), and the answer's values replace the local ones (`Ledger.apply_remote(..., groups=False)`:
a tenant's remote charges do not move the groups above it locally, since their own values come back too)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...core import Account, Ledger, Listener, Request
from .codec import CHANGES, WHOLE, Charge, SyncAnswer, Weight

log = logging.getLogger("fairserve.gateway.state")


@dataclass(frozen=True, slots=True)
class Backlog:
    """The backlog's part of a sync: its mode (`WHOLE`: `backlogged` is every node backlogged here; `CHANGES`: those
    newly backlogged) and the nodes backlogged and no longer backlogged here."""

    mode: str
    backlogged: list[str]
    unbacklogged: list[str]


@dataclass(frozen=True, slots=True)
class Unanswered:
    """A batch's additive part, sent but not answered: sent again, unchanged, until answered."""

    number: int
    charges: list[Charge]
    weights: list[Weight]
    snap: dict[Account, tuple[float, float]]  # the values of the nodes it charges, as it charges them
    reset: bool


class Changes(Listener):
    """The ledger's observer (`Ledger.listen`, core/listener.py): every charge, lift and queue change marks its
    account. `take()` hands the accounts changed since the last `take()` to the sync being sent and starts afresh.
    The replicas' sync state of each account lives here, in side tables keyed by the account: the global service
    at its last sync (`synced`) and its highest lift not yet sent (`lifts`)."""

    def __init__(self, tokens_of: Callable[[Request], int]) -> None:
        self.tokens_of = tokens_of
        # changed since the last sync was sent: each account with its (counter, service) before its first change
        self.dirty: dict[Account, tuple[float, float]] = {}
        self.synced: dict[Account, float] = {}  # the global service at the last sync (absent: never synced)
        self.lifts: dict[Account, float] = {}  # the highest lift not yet sent (net of the charges since that sync)
        self.pool_of: Callable[[Request], str] = lambda req: ""  # a queued request's model pool (SharedState sets it)
        self.pool_tokens: dict[str, int] = {}  # per pool: capacity tokens of the requests queued
        self._tokens: dict[Any, tuple[str, int]] = {}  # by request id: what `pool_tokens` counted for it
        self.backlog: set[str] = set()  # the tenants Redis was last told are backlogged here
        self.full = True  # send the whole backlog next time (at start; after a failed sync; Redis forgot it)
        self.sent = Backlog(WHOLE, [], [])  # the backlog part of the sync being sent

    # ---- the ledger's listener ------------------------------------------------------------------------------------
    def changing(self, acct: Account) -> None:
        self.mark(acct)  # NOTE: before the charge or the lift: the values Redis knows, in local terms

    def queued(self, req: Request) -> None:
        self.mark(req.account)
        pool, tokens = self._tokens[req.id] = self.pool_of(req), self.tokens_of(req)
        self.pool_tokens[pool] = self.pool_tokens.get(pool, 0) + tokens

    def left(self, req: Request) -> None:
        self.mark(req.account)
        pool, tokens = self._tokens.pop(req.id, ("", 0))
        if tokens:
            self.pool_tokens[pool] -= tokens

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

    def batch(self, ledger: Ledger, everything: bool) -> tuple[list[Charge], dict[Account, tuple[float, float]]]:
        """A new batch: the charges and lifts of the accounts changed since the last one (of all accounts with
        `everything`: Redis lost its data), and the values of those it charges as it charges them (its
        snapshot); the backlog's changes are in `sent`."""
        changed = self.take()
        snap: dict[Account, tuple[float, float]] = {}
        charges: list[Charge] = []
        groups = ledger.groups
        below: dict[Account, float] = {}  # per group: what this batch charges its tenants
        nodes: list[Account] = []  # the groups changed, after the tenants (their charges are the tenants' sum)
        synced, lifts = self.synced, self.lifts
        for acct in ledger.accounts.values() if everything else changed:
            if not everything and groups.get(acct.tenant) is acct:
                nodes.append(acct)
                continue
            base = synced.get(acct)
            ds = acct.service - base if base is not None else acct.service
            lift = lifts.pop(acct, None)  # NOTE: sent with this batch, and with it again if its answer is lost
            if not ds and lift is None and base is not None and not everything:
                continue
            if ds:
                node = acct.parent
                while node is not None:
                    below[node] = below.get(node, 0.0) + ds
                    node = node.parent
            snap[acct] = (acct.counter, acct.service)
            charges.append(_charge(acct, ds, lift))
        for group in groups.values() if everything else nodes:
            ds, lift = below.get(group, 0.0), lifts.pop(group, None)
            if ds or lift is not None or group not in synced or everything:
                snap[group] = (group.counter, group.service)
                charges.append(_charge(group, ds, lift))
        self.backlog_changes(ledger, changed)
        return charges, snap

    def apply(
        self,
        ledger: Ledger,
        answer: SyncAnswer,
        snap: dict[Account, tuple[float, float]],
        pending: dict[str, float],
        restore: bool = False,
    ) -> None:
        """An answer into the ledger: the weights set since the last one, then the global counter and service of
        the nodes it carries, with what this replica changed and has not sent (or sent in the batch being answered,
        `snap`) on top; a weight `pending` (set here, not yet sent) stays."""
        accounts = ledger.accounts
        for w in answer.weights:
            acct = accounts.get(w.tenant) or ledger.groups.get(w.tenant)  # NOTE: a group of the tenant tree has one too
            weight = w.weight
            if acct is None or acct.tenant in pending or weight == acct.weight:
                continue
            try:
                ledger.set_weight(acct.tenant, weight)
            except ValueError as e:  # NOTE: only a hand-edited Redis holds such a weight: keep ours
                log.warning("shared state: ignored the weight of %r: %s", acct.tenant, e)
        groups = ledger.groups
        for n in answer.nodes:
            acct = accounts.get(n.node) or groups.get(n.node)
            counter, service = n.counter, n.service
            if acct is None or counter is None or service is None:
                continue
            c0, s0 = snap[acct] if acct in snap else self.base(acct)
            c1, s1 = counter + (acct.counter - c0), service + (acct.service - s0)
            if restore and acct.service > s1:  # NOTE: Redis lost its data, and another wrote back an older copy:
                c1, s1 = acct.counter, acct.service  # ours stands; the next batch sends the difference
            ledger.apply_remote(acct.tenant, c1, s1, groups=False)
            self.synced[acct] = service
            if acct in self.dirty:  # NOTE: what changed since counts from these values now
                self.dirty[acct] = (counter, service)

    def backlog_changes(self, ledger: Ledger, accounts: Any) -> None:
        """`sent` := (WHOLE, every node backlogged here, []) when the whole list is due, else (CHANGES, newly
        backlogged, no longer backlogged) among `accounts` (those changed); what Redis is told is remembered."""
        if self.full:  # NOTE: O(tenants + groups), as the whole backlog is
            self.full = False
            self.backlog = {t for t, a in ledger.accounts.items() if a.queued}
            self.backlog.update(g for g, a in ledger.groups.items() if a.queued)
            self.sent = Backlog(WHOLE, sorted(self.backlog), [])
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
        self.sent = Backlog(CHANGES, added, gone)


def _charge(acct: Account, ds: float, lift: float | None) -> Charge:
    """A charge: the node, what this batch charges it (service and counter), its lift, and its counter and service
    before the charge (what Redis starts from if it has none)."""
    dc = ds / acct.weight
    return Charge(
        node=acct.tenant,
        service=ds,
        counter=dc,
        lift=lift,
        base_counter=acct.counter - dc,
        base_service=acct.service - ds,
    )
