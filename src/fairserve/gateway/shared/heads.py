"""Which replica admits first, per model pool: each replica's pool heads, and the waiting heads of the others
(gateway/shared/state.py's `SharedState` takes this part from `HeadOrder`; the rule is in its module docstring).

A pool is the backends that serve a model (gateway/dispatch/pools.py), named across replicas by their URLs (`pool_key`).
A replica admits a pool's head unless another replica waits for capacity for a different tenant with a smaller
counter in a pool that shares a backend with it; it syncs early when that can move capacity (`waiting`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ...core import Ledger, Request
from ...core.account import SEP

if TYPE_CHECKING:
    from .changes import Changes


class BackendSlot(Protocol):
    """What shared state reads and sets on a backend (gateway.scheduler.Backend)."""

    cfg: Any  # .url, .max_inflight_requests, .max_inflight_tokens
    requests: int
    tokens: int
    limit: int
    token_limit: int | None


def pool_key(urls: Iterable[str]) -> str:
    """A pool's name across replicas: its backends' URLs, sorted, space-separated (a URL has no space)."""
    return " ".join(sorted(urls))


@dataclass(frozen=True)
class Head:
    """A pool's first request still queued here, and the pool's requests queued."""

    key: str  # the pool (`pool_key`)
    req: Request
    queued: int


class Pools(Protocol):
    """The model pools (gateway.dispatch.Dispatch), which bind themselves (`SharedState.bind`)."""

    def key_of(self, req: Request) -> str: ...

    def heads(self) -> list[Head]: ...


class HeadOrder:
    """The head comparison of a replica's shared state (its attributes are set by `SharedState.__init__`)."""

    up: bool
    ledger: Ledger
    changes: Changes
    backends: Sequence[BackendSlot]
    pools: Pools | None
    _all: str
    _urls: dict[str, frozenset[str]]
    _starved: list[tuple[float, str, str]]
    _sent_starved: frozenset[str]
    _gained: bool
    _others_wait: dict[str, tuple[bool, bool]]
    _wake: asyncio.Event

    def bind(self, pools: Pools) -> None:
        """The model pools: heads are compared per pool (called by gateway.dispatch.Dispatch, before any request)."""
        self.pools = pools
        self.changes.pool_of = pools.key_of

    def heads(self) -> list[Head]:
        """Each pool's first request queued here."""
        if self.pools is not None:
            return self.pools.heads()
        head = self.ledger.peek()
        return [] if head is None else [Head(self._all, head, self.ledger.num_queued)]

    def _backends_of(self, key: str) -> frozenset[str]:
        urls = self._urls.get(key)
        if urls is None:
            urls = self._urls[key] = frozenset(key.split(" "))
        return urls

    def may_admit(self, req: Request) -> bool:
        """Whether this replica may admit `req`, its pool's head: unless another replica waits for capacity to
        admit a different tenant with a smaller counter in a pool that shares a backend with `req`'s (as of the last
        sync), this replica uses its leases. In a tenant tree the two are compared where their paths part: the two
        nodes below their deepest common group (a group's counter here counts every replica's charges,
        `Ledger.apply_remote`). Always True while degraded (no fresh view of the others)."""
        if not self.up or not self._starved:
            return True
        urls = self._backends_of(self.changes.pool_of(req))
        for counter, tenant, pool in self._starved:
            if tenant != req.tenant and not urls.isdisjoint(self._backends_of(pool)):
                mine, theirs = parting(req.tenant, tenant)
                if mine == req.tenant and theirs == tenant:  # NOTE: siblings: the shared counter Redis answered
                    return req.account.counter <= counter
                groups = self.ledger.groups
                a = groups.get(mine) or self.ledger.accounts.get(mine)
                b = groups.get(theirs) or self.ledger.accounts.get(theirs)
                return a is None or b is None or a.counter <= b.counter
        return True

    def waiting(self) -> None:
        """The scheduler dispatched: sync early when that can move capacity, that is when this replica has become
        starved (its head may be admitted, no lease has room, and the last sync did not say so or its answer grew
        a lease: never back to back for nothing), or when it holds lease room it cannot use while others wait."""
        if not self.up or self._wake.is_set():
            return
        eligible = {h.key for h in self.heads() if self.may_admit(h.req)}
        wanted: set[str] = set()  # the backends of the pools whose heads may be admitted
        for key in eligible:
            wanted |= self._backends_of(key)
        if (eligible - self._sent_starved or self._gained) and any(
            b.limit < b.cfg.max_inflight_requests or (b.token_limit or 0) < (b.cfg.max_inflight_tokens or 0)
            for b in self.backends
            if b.cfg.url in wanted
        ):
            self._wake.set()
        elif any(
            b.requests < b.limit and any(self._others_wait.get(b.cfg.url, ()))
            for b in self.backends
            if b.cfg.url not in wanted
        ):
            self._wake.set()


def parting(a: str, b: str) -> tuple[str, str]:
    """The nodes of tenant paths `a` and `b` just below their deepest common group: `x/y/z`, `x/w` -> `x/y`, `x/w`."""
    pa, pb = a.split(SEP), b.split(SEP)
    k = 0
    while k < min(len(pa), len(pb)) - 1 and pa[k] == pb[k]:
        k += 1
    return SEP.join(pa[: k + 1]), SEP.join(pb[: k + 1])
