"""The ledger: per-tenant state, owned once, under every driver.

Two tables live here and nowhere else:
- `Account`s, one per tenant: weight, service received, the policy's virtual counter, queued and running requests.
  Only the policy's life-cycle methods write them (`Policy.add/pop/requeue/finish/abort` and the charges), so counts
  cannot drift from the queue they count.
- the requests not yet settled, by id, each carrying the driver's own object (`Request.item`): a gateway ticket, an
  engine's request state.

A driver goes through the `Ledger`: `arrive` → `admit`/`pop` → `output`/`prompt` (→ `requeue`) → `settle`, the one
way a request ends (exactly once; a refund is `settle(..., prompt=0, output=0, cancelled=True)`). Admin changes
(`set_weight`, `reset`, `apply_remote`) mean the same for every policy or raise `Unsupported`; `view()` is the read-only snapshot the
admin API, the Prometheus collectors and the tests read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .fairness import jain_index
from .request import Request, RequestState

if TYPE_CHECKING:
    from .policy import Policy

QUEUED, RUNNING = RequestState.QUEUED, RequestState.RUNNING
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


class Unsupported(Exception):
    """The policy has no such state (e.g. a counter reset under FCFS): the admin API answers 409."""


@dataclass(slots=True, eq=False)
class Account:
    """One tenant's state. `counter` is VTC's virtual counter (service / weight, lifted); policies without one
    derive theirs (`Policy.counter_of`)."""

    tenant: str
    rank: int  # first-seen order: the deterministic tie-break
    weight: float = 1.0
    service: float = 0.0  # cost charged, not divided by the weight
    counter: float = 0.0
    queued: int = 0  # requests waiting for admission: > 0 is the paper's "backlogged"
    running: int = 0  # admitted and not yet ended


@dataclass(frozen=True, slots=True)
class TenantView:
    tenant: str
    weight: float
    counter: float
    service: float
    queued: int
    running: int

    def row(self) -> dict[str, Any]:
        """The admin API's JSON row."""
        return {
            "name": self.tenant,
            "weight": self.weight,
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


class Ledger:
    """Requests by id and the accounts they are charged to, over one policy. Not thread-safe by itself: engines
    that call it from a scheduling thread wrap it in a lock (`engines.queue.EngineQueue`)."""

    def __init__(self, policy: Policy, tenants: Iterable[str] = ()) -> None:
        self.policy = policy
        self.accounts = policy.accounts
        for t in tenants:  # configured tenants show up from the start (admin API, /metrics)
            policy.account(t)
        self._requests: dict[object, Request] = {}

    # ---- the life cycle -----------------------------------------------------------------------------------------
    def arrive(
        self,
        request_id: object,
        client: str,
        prompt_tokens: int,
        max_tokens: int | None = None,
        now: float = 0.0,
        item: Any = None,
    ) -> Request | None:
        """A new request, queued; None if the policy rejected it (rate limits): it was never in the ledger."""
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already in the ledger")
        req = Request(
            id=request_id, client=client, prompt_tokens=prompt_tokens, max_tokens=max_tokens, arrival_s=now, item=item
        )
        if not self.policy.add(req, now):
            return None
        self._requests[request_id] = req
        return req

    def peek(self) -> Request | None:
        return self.policy.peek()

    def pop(self) -> Request:
        return self.policy.pop()

    def admit(self, fits: Callable[[Request], bool], limit: int | None = None) -> list[Request]:
        return self.policy.admit(fits, limit)

    def output(self, req: Request, tokens: int = 1) -> None:
        if req.state is RUNNING:
            self.policy.on_output(req, tokens)

    def prompt(self, req: Request, prompt_tokens: int) -> None:
        """The true prompt size is now known (or has grown): the difference is charged, or refunded."""
        if not req.done:
            self.policy.on_prompt(req, prompt_tokens)

    def requeue(self, req: Request, item: Any = None) -> bool:
        """A running request goes back to the front of its tenant's queue (preempted, or its backend failed before
        any output): no second prompt charge, no lift. False if it is not running."""
        return self._back(req, item, self.policy.requeue)

    def unpop(self, req: Request, item: Any = None) -> bool:
        """A request popped in this admission pass goes back unscheduled: as if never popped (see `Policy.unpop`).
        False if it is not running."""
        return self._back(req, item, self.policy.unpop)

    def _back(self, req: Request, item: Any, put_back: Callable[[Request], None]) -> bool:
        if req.state is not RUNNING:
            return False
        put_back(req)
        if item is not None:  # NOTE: engines may hand back a new object for the same request
            req.item = item
        return True

    def settle(
        self, req: Request, *, prompt: int | None = None, output: int | None = None, cancelled: bool = False
    ) -> bool:
        """End `req`, exactly once: False (and nothing done) if it was settled already.

        A running request that was not cancelled is reconciled to `prompt` / `output` when given (the backend's
        `usage`, the engine's exact counts). A cancelled one, or one still queued, is charged only what it got:
        `prompt` prompt tokens (e.g. what was prefilled) and `output` output tokens, or what was reported. A refund of
        everything is `prompt=0, output=0, cancelled=True`."""
        if self._requests.pop(req.id, None) is not req:
            return False
        if req.state is RUNNING and not cancelled:
            self.policy.finish(req, output_tokens=output, prompt_tokens=prompt)
        else:
            self.policy.abort(req, output_tokens=output, prompt_tokens=prompt)
        return True

    def settle_all(self) -> int:
        """The driver is gone: every request still here is cancelled, charged what was reported. Returns how many."""
        left = list(self._requests.values())
        for req in left:
            self.settle(req, cancelled=True)
        return len(left)

    # ---- lookups ------------------------------------------------------------------------------------------------
    def get(self, request_id: object) -> Request | None:
        return self._requests.get(request_id)

    def __len__(self) -> int:
        return len(self._requests)

    def queued(self) -> list[Request]:
        """The queued requests, in no particular order (O(requests in the ledger))."""
        return [r for r in self._requests.values() if r.state is QUEUED]

    # ---- admin --------------------------------------------------------------------------------------------------
    def set_weight(self, tenant: str, weight: float) -> None:
        """Future charges of `tenant` count `1/weight` on its counter. ValueError for a weight out of range,
        Unsupported for a policy that ignores weights."""
        weight = check_weight(tenant, weight)
        if not self.policy.uses_weights:
            raise Unsupported(f"policy {self.policy.name!r} ignores weights: a weight would change nothing")
        self.policy.set_weight(tenant, weight)

    def apply_remote(self, tenant: str, counter: float, service: float) -> None:
        """`tenant`'s counter and service as another process computed them (shared state across gateway replicas:
        gateway/shared_state.py): they replace the local values. Unsupported for a policy without counters."""
        self.policy.set_counter(tenant, counter)
        self.policy.account(tenant).service = service

    def reset(self) -> None:
        """Every tenant starts from equal footing: counters (VTC) or deficits (DRR) go to 0; service received stays.
        Unsupported for a policy without counters."""
        self.policy.reset_counters()

    def view(self) -> LedgerView:
        """Every tenant's numbers, read consistently (O(tenants))."""
        p = self.policy
        return LedgerView(
            p.name,
            {
                a.tenant: TenantView(a.tenant, a.weight, p.counter_of(a.tenant), a.service, a.queued, a.running)
                for a in self.accounts.values()
            },
        )
