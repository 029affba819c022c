"""The core's ground data: a tenant's account, the read-only views of the accounts, weight bounds and the default
tenant. Every other module of `core/` builds on this one, and it imports none of them but `fairness`."""

from __future__ import annotations

import math
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import Any

from .fairness import jain_index

DEFAULT_TENANT = "anonymous"  # whose requests name no tenant (a server without keys, an engine request without one)

# NOTE: weights outside this range overflow the accounting (a counter is service / weight: 1e-300 makes it +inf)
MIN_WEIGHT, MAX_WEIGHT = 1e-6, 1e6


def check_weight(tenant: str, weight: Any) -> float:
    """The weight as a float, or ValueError with one line saying what is accepted."""
    try:
        ok = isinstance(weight, int | float) and not isinstance(weight, bool) and math.isfinite(weight)
    except OverflowError:  # an integer past any float
        ok = False
    if not ok or not MIN_WEIGHT <= weight <= MAX_WEIGHT:
        raise ValueError(f"weight of {tenant!r} must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}, got {weight!r}")
    return float(weight)


def parse_weights(text: str | None, source: str = "--weights") -> dict[str, float] | None:
    """`tenant=weight,...` (from a flag or an environment variable named by `source`); None for no text. Raises
    ValueError with one line for a malformed entry or a weight out of range."""
    if not text:
        return None
    out = {}
    for part in text.split(","):
        tenant, _, value = (x.strip() for x in part.partition("="))
        try:
            out[tenant] = check_weight(tenant, float(value))
        except ValueError:
            raise ValueError(
                f"bad {source} entry {part!r}: expected CLIENT=WEIGHT with WEIGHT from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}"
            ) from None
        if not tenant:
            raise ValueError(f"bad {source} entry {part!r}: expected CLIENT=WEIGHT")
    return out


SEP = "/"  # tenant paths: `tier/org/team/key`; every prefix is a group


def parents(path: str) -> list[str]:
    """The groups above `path`, nearest first: `a/b/c` -> [`a/b`, `a`]."""
    parts = path.split(SEP)
    return [SEP.join(parts[:k]) for k in range(len(parts) - 1, 0, -1)]


def limited_path(tenant: str, limited: Container[str]) -> list[str]:
    """`tenant` and the groups above it (nearest first) that are in `limited` (the nodes with a quota, a cap)."""
    return [p for p in (tenant, *parents(tenant)) if p in limited]


def parse_priorities(text: str | None, source: str = "--priorities") -> dict[str, int] | None:
    """`path=priority,...` (an integer; lower is served first); None for no text. ValueError with one line."""
    if not text:
        return None
    out = {}
    for part in text.split(","):
        path, _, value = (x.strip() for x in part.partition("="))
        try:
            out[path] = int(value)
        except ValueError:
            raise ValueError(f"bad {source} entry {part!r}: expected NODE=PRIORITY with an integer PRIORITY") from None
        if not path:
            raise ValueError(f"bad {source} entry {part!r}: expected NODE=PRIORITY")
    return out


def nodes_of(tenants: Iterable[str]) -> set[str]:
    """The tenants and every group above them."""
    out: set[str] = set()
    for t in tenants:
        out.add(t)
        out.update(parents(t))
    return out


def check_nodes(tenants: Iterable[str], names: Iterable[str], source: str) -> None:
    """ValueError naming the first of `names` that is neither one of `tenants` nor a group above them."""
    known = nodes_of(tenants)
    unknown = [n for n in names if n not in known]
    if unknown:
        some = ", ".join(sorted(known)[:8]) + (", ..." if len(known) > 8 else "")
        raise ValueError(f"{source}: {unknown[0]!r} names no tenant or group of the workload (it has: {some})")


class Unsupported(Exception):
    """The policy has no such state (e.g. a counter reset under FCFS): the admin API answers 409."""


@dataclass(slots=True, eq=False)
class Account:
    """One tenant's (or group's) state, the core's data only, written by the ledger only
    (`core.ledger.Ledger.accounts`; configuration through `Ledger.set_node`). `counter` is the policy's virtual
    counter where it keeps one (VTC: service / weight, lifted; DRR: its deficit, negated, as of the ring round it
    keeps privately); a policy without one derives what it shows (`Policy.counter_of`). What a driver or an observer
    keeps per account (the replicas' sync state, say) lives in its own table, keyed by the account."""

    tenant: str
    rank: int  # first-seen order: the deterministic tie-break
    weight: float = 1.0
    service: float = 0.0  # cost charged, not divided by the weight
    counter: float = 0.0
    queued: int = 0  # requests waiting for admission: > 0 is the paper's "backlogged"
    running: int = 0  # admitted and not yet ended
    # the tenant tree: a tenant `pro/acme/search` is a leaf under the groups `pro/acme` and `pro` (whose accounts sum
    # their subtree's service, queued and running); None for a tenant at the top
    parent: Account | None = None
    priority: int | None = None  # this node's priority (lower is served first); None: its parent's
    allowed: frozenset[int] | None = None  # a tenant's priorities its requests may name (None: only its own)


@dataclass(frozen=True, slots=True)
class TenantView:
    tenant: str
    weight: float
    counter: float
    service: float
    queued: int
    running: int
    priority: int = 0  # the level its requests run at when they name none (its own, else its nearest group's)

    def row(self) -> dict[str, Any]:
        """The admin API's JSON row."""
        return {
            "name": self.tenant,
            "weight": self.weight,
            "priority": self.priority,
            "counter": self.counter,
            "service": self.service,
            "queue_length": self.queued,
            "in_flight": self.running,
        }


@dataclass(frozen=True, slots=True)
class LedgerView:
    """A consistent snapshot of every tenant, for reading only."""

    policy: str
    tenants: dict[str, TenantView]
    groups: dict[str, TenantView] = field(default_factory=dict)  # by path; their numbers are their subtree's

    @property
    def backlogged(self) -> list[TenantView]:
        return [t for t in self.tenants.values() if t.queued]

    @property
    def counter_spread(self) -> float:
        """Max minus min counter among backlogged tenants (what VTC keeps bounded)."""
        counters = [t.counter for t in self.backlogged]
        return max(counters) - min(counters) if counters else 0.0

    @property
    def jain(self) -> float:
        """Jain's index of weighted service among backlogged tenants."""
        return jain_index([t.service / t.weight for t in self.backlogged])
