"""The tenant tree: every tenant's `Account` and the groups above it, owned once (by the ledger, which is a
`TenantTree`).

A tenant's path names its groups (`pro/acme/search` is under `pro/acme`, under `pro`); each group's account holds the
sums over its subtree. Nodes open on first sight, in a first-seen order that breaks ties everywhere (`rank`). A
tenant that has had no request yet becomes a group when a tenant below it appears. Priorities are configured per
node and looked up once per tenant (`set_node`, the one way to change a node's configuration, forgets what it
looked up). The accounts' admin changes live here too (`set_weight`, `reset`, `apply_remote`: the same for every
policy, or `Unsupported`), and the reads by tenant; `view()` is the read-only snapshot of every node. The requests'
life cycle and the charges are the ledger's (core/ledger.py).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Mapping
from typing import Literal

from .account import SEP, Account, LedgerView, TenantView, Unsupported, check_weight
from .policy import Policy


class Keep(enum.Enum):
    """`set_node`'s default: leave this setting as it is (None means something: inherit, or only its own)."""

    KEEP = enum.auto()


KEEP = Keep.KEEP


class TenantTree:
    """The tenants (the leaves) and their groups, over one policy, which hears of each tenant opened or closed."""

    def __init__(
        self,
        policy: Policy,
        tenants: Iterable[str] = (),
        weights: Mapping[str, float] | None = None,
        priorities: Mapping[str, int] | None = None,
        allowed: Mapping[str, Iterable[int]] | None = None,
    ) -> None:
        self.policy = policy
        self.accounts: dict[str, Account] = {}  # the tenants: the leaves of the tree
        self.groups: dict[str, Account] = {}  # every prefix of a tenant's path
        self._ranks = itertools.count()  # first-seen (or configured) order: the deterministic tie-break
        self._levels: dict[str, int] = {}  # each tenant's inherited priority, once looked up (`set_node` forgets it)
        for t in tenants:  # configured tenants show up from the start (admin API, /metrics)
            self.account(t)
        for t, w in (weights or {}).items():  # NOTE: shown even by policies that ignore them
            self.set_node(t, weight=w)
        for t, level in (priorities or {}).items():
            self.set_node(t, priority=level)
        for t, levels in (allowed or {}).items():
            self.set_node(t, allowed=levels)

    def set_node(
        self,
        path: str,
        *,
        weight: float | Literal[Keep.KEEP] = KEEP,
        priority: int | None | Literal[Keep.KEEP] = KEEP,
        allowed: Iterable[int] | None | Literal[Keep.KEEP] = KEEP,
    ) -> Account:
        """The one way to configure a node (the group `path`, else the tenant `path`, opened on first sight): its
        `weight` (future charges count 1/weight on its counters), its `priority` (None: its parent's) and, for a
        tenant, the priorities its requests may name (`allowed`; None: only its own). What the tree looked up from
        the old values is forgotten, so the next request runs at the new level. Requests already queued keep the
        level they were queued at. ValueError (one line) for a value out of range, or `allowed` on a group; nothing
        is changed then."""
        node = self.node(path) if allowed is KEEP else self.account(path)
        w = check_weight(path, weight) if weight is not KEEP else node.weight
        level = _level(path, priority) if priority is not KEEP and priority is not None else priority
        levels = frozenset(_level(path, v) for v in allowed) if allowed is not KEEP and allowed is not None else allowed
        node.weight = w
        if level is not KEEP:
            node.priority = level
            self._levels.clear()  # NOTE: every tenant below `path` inherits it: looked up again on its next request
        if levels is not KEEP:
            node.allowed = levels
        return node

    def account(self, tenant: str) -> Account:
        """`tenant`'s account, opened on first sight with the groups above it (`pro/acme/search` is under `pro/acme`,
        under `pro`). ValueError for a path that names a group, or runs through a tenant."""
        acct = self.accounts.get(tenant)
        if acct is None:
            if tenant in self.groups:
                raise ValueError(f"{tenant!r} is a group of tenants, not a tenant")
            acct = self.accounts[tenant] = self._open(tenant)
            self.policy.open(acct)
        return acct

    def _group(self, path: str) -> Account:
        group = self.groups.get(path)
        if group is None:
            tenant = self.accounts.get(path)
            if tenant is None:
                group = self._open(path)
            elif tenant.service or tenant.queued or tenant.running:
                raise ValueError(f"{path!r} is a tenant, so it cannot be a group of tenants")
            else:  # NOTE: configured (a weight, say) before anything below it was seen: it was a group all along
                group = self.accounts.pop(path)
                self.policy.close(group)
            self.groups[path] = group
        return group

    def _open(self, path: str) -> Account:
        """A new node under its groups."""
        parent = self._group(path.rpartition(SEP)[0]) if SEP in path else None
        return Account(path, rank=next(self._ranks), parent=parent)

    def node(self, path: str) -> Account:
        """The group `path`, else the tenant `path` (opened on first sight: a tenant that has had no request yet
        becomes a group when a tenant below it appears)."""
        group = self.groups.get(path)
        return group if group is not None else self.account(path)

    def priority_of(self, acct: Account, named: int | None = None) -> int:
        """The priority a request of `acct` runs at: the one it names if the tenant allows it, else the nearest
        node's (the tenant's, then its groups'), else 0, as configured now."""
        level = self._levels.get(acct.tenant)
        if level is None:
            level = self._levels[acct.tenant] = _inherited(acct)
        if named is not None and named != level and acct.allowed is not None and named in acct.allowed:
            return named
        return level

    def allowed_priorities(self, tenant: str) -> frozenset[int]:
        """The priorities requests of `tenant` may name (its own, unless its configuration allows more)."""
        acct = self.account(tenant)
        return acct.allowed if acct.allowed is not None else frozenset({self.priority_of(acct)})

    # ---- reading, by tenant --------------------------------------------------------------------------------------
    def backlogged(self) -> list[str]:
        """Tenants with at least one queued request (the paper's 'backlogged' tenants). O(tenants)."""
        return [t for t, a in self.accounts.items() if a.queued]

    def counter_of(self, tenant: str) -> float:
        acct = self.accounts.get(tenant)
        return self.policy.counter_of(acct) if acct is not None else 0.0

    @property
    def counters(self) -> dict[str, float]:
        return {t: self.policy.counter_of(a) for t, a in self.accounts.items()}

    @property
    def service(self) -> dict[str, float]:
        """Cost charged per tenant (not divided by its weight)."""
        return {t: a.service for t, a in self.accounts.items()}

    @property
    def weights(self) -> dict[str, float]:
        return {t: a.weight for t, a in self.accounts.items()}

    # ---- admin: the same for every policy, or Unsupported ---------------------------------------------------------
    def set_weight(self, path: str, weight: float) -> None:
        """Future charges of the tenant or group `path` count `1/weight` on its counter. ValueError for a weight out
        of range, Unsupported for a policy that ignores weights."""
        weight = check_weight(path, weight)
        if not self.policy.capabilities.uses_weights:
            raise Unsupported(f"policy {self.policy.name!r} ignores weights: a weight would change nothing")
        self.set_node(path, weight=weight)

    def apply_remote(
        self, tenant: str, counter: float, service: float, weight: float | None = None, groups: bool = True
    ) -> None:
        """`tenant`'s counter, service (and weight) as another process computed them (shared state across
        gateway replicas: gateway/shared/state.py, a file snapshot: gateway/shared/snapshot.py): they replace
        the local values, and the difference in service moves the groups above as a charge here would. With
        `groups=False` the groups above are left alone (their own values come from elsewhere too), and `tenant`
        may name a group. Unsupported for a policy that cannot take counters from elsewhere; ValueError for a
        weight out of range."""
        if not self.policy.capabilities.shares_counters:
            raise Unsupported(f"policy {self.policy.name!r} cannot share its counters")
        if weight is not None:
            self.set_weight(tenant, weight)
        acct = self.groups.get(tenant) if not groups else None
        if acct is None:
            acct = self.account(tenant)
        self.policy.set_counter(acct, counter)
        delta, acct.service = service - acct.service, service
        group = acct.parent if groups else None
        while group is not None:  # NOTE: a group's service is its subtree's
            group.service += delta
            if delta:  # NOTE: and what was charged elsewhere moves the group's counter as a charge here would
                self.policy.set_counter(group, group.counter + delta / group.weight)
            group = group.parent

    def reset(self) -> None:
        """Every tenant starts from equal footing: counters (VTC) or deficits (DRR) go to 0; service received stays.
        Unsupported for a policy without counters."""
        if not self.policy.capabilities.keeps_counters:
            raise Unsupported(f"policy {self.policy.name!r} keeps no counters: there is nothing to reset")
        self.policy.reset_counters([*self.accounts.values(), *self.groups.values()])

    def view(self) -> LedgerView:
        """Every tenant's and group's numbers, read consistently (O(tenants + groups))."""
        counter_of = self.policy.counter_of

        def rows(accounts: Iterable[Account]) -> dict[str, TenantView]:
            return {
                a.tenant: TenantView(a.tenant, a.weight, counter_of(a), a.service, a.queued, a.running, _inherited(a))
                for a in accounts
            }

        return LedgerView(self.policy.name, rows(self.accounts.values()), rows(self.groups.values()))


def _inherited(node: Account) -> int:
    """The priority of the nearest node from `node` up that has one configured, else 0."""
    at: Account | None = node
    while at is not None and at.priority is None:
        at = at.parent
    return at.priority if at is not None and at.priority is not None else 0


def _level(path: str, level: object) -> int:
    if not isinstance(level, int) or isinstance(level, bool):
        raise ValueError(f"priority of {path!r} must be an integer (lower is served first), got {level!r}")
    return level
