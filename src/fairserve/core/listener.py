"""The ledger's one seam for observers: what changed, told by the life-cycle methods that change it.

An observer (the replicas' shared state, the gateway's per-level queue gauge, an audit log) subclasses `Listener`,
overrides the calls it needs and registers with `Ledger.listen`. The contract:

- `changing(acct)`: just before a charge (or a refund) or a counter lift changes `acct`'s service or counter, and
  with them the groups above it. The observer reads `acct` and its groups at their old values.
- `queued(req)`: just after `req` joined its tenant's queue (an arrival in `add`, a `requeue`, an `unpop`); its
  account's counts are already updated.
- `left(req)`: just after `req` left the queue (admitted by `pop`, or settled while queued); counts updated.
- `settled(req)`: just after `settle` ended `req`, exactly once per request: its final counts and `req.charged`.

An observer reads; it never writes the ledger, its accounts or its requests, and never calls back into the ledger from
a call (the ledger is mid-change). What it needs to remember it keeps in its own tables, keyed by account or request
id. Admin and remote changes (`set_node`, `set_weight`, `reset`, `apply_remote`) are not told: their caller knows.
"""

from __future__ import annotations

from .account import Account
from .request import Request


class Listener:
    """Base class of an observer: every call does nothing unless overridden."""

    def changing(self, acct: Account) -> None:
        """`acct`'s service or counter (and its groups') is about to change: a charge, a refund or a lift."""

    def queued(self, req: Request) -> None:
        """`req` joined its tenant's queue (arrived, requeued, unpopped)."""

    def left(self, req: Request) -> None:
        """`req` left the queue (admitted, or settled while queued)."""

    def settled(self, req: Request) -> None:
        """`req` ended (the ledger's `settle`, exactly once)."""


class Listeners(Listener):
    """Several observers of one ledger, told in the order they registered."""

    def __init__(self, *listeners: Listener) -> None:
        self.listeners = list(listeners)

    def changing(self, acct: Account) -> None:
        for x in self.listeners:
            x.changing(acct)

    def queued(self, req: Request) -> None:
        for x in self.listeners:
            x.queued(req)

    def left(self, req: Request) -> None:
        for x in self.listeners:
            x.left(req)

    def settled(self, req: Request) -> None:
        for x in self.listeners:
            x.settled(req)
