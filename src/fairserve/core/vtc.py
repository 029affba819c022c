"""The Virtual Token Counter (Sheng et al., 2024, Algorithm 1/2) and its variants.

Each tenant has a counter of the service it received, divided by its weight (`Account.counter`). The queued request
of the tenant with the smallest counter is admitted next. When a tenant goes from nothing queued to something queued,
the ledger lifts its counter to the smallest counter among the queued tenants (`min_counter`), so idle time earns
no credit.

Variants: weights (weighted VTC: the ledger's accounts), `LCF` (no lift, the paper's baseline), `predictor=` (VTC
with output-length prediction), `cost=` (any monotone h(x, y)).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable
from dataclasses import replace

from .account import Account
from .cost import CostFunction
from .policy import Capabilities, Policy
from .predictor import Predictor, make_predictor
from .registry import register
from .request import Request


class VTC(Policy):
    """Selection is O(log n) in the number of backlogged tenants: a heap of (counter, rank) with lazy invalidation.
    A tenant has at most one live heap entry; counters only grow between entries, except refunds, resets and
    counters set from elsewhere, which push a fresh entry."""

    name = "vtc"
    capabilities = Capabilities(
        orders_by_counter=True, uses_weights=True, keeps_counters=True, shares_counters=True, lifts=True
    )

    def __init__(self, cost: CostFunction | None = None, predictor: Predictor | None = None) -> None:
        super().__init__(cost, predictor)
        self._queues: dict[str, deque[Request]] = {}
        self._live: dict[str, int] = {}  # tenant -> version of its one live heap entry
        self._heap: list[tuple[float, int, int, Account]] = []
        self._version = 0
        if predictor is not None:
            self.name = f"vtc-predict({predictor.name})"

    # ---- the heap -------------------------------------------------------------------------------------------------
    def _push(self, acct: Account) -> None:
        self._version += 1
        self._live[acct.tenant] = self._version
        heapq.heappush(self._heap, (acct.counter, acct.rank, self._version, acct))

    def _min_account(self) -> Account | None:
        """The backlogged tenant with the smallest counter."""
        heap, live, queues = self._heap, self._live, self._queues
        while heap:
            key, rank, version, acct = heap[0]
            tenant = acct.tenant
            if version != live[tenant] or not queues[tenant]:
                heapq.heappop(heap)
                continue
            actual = acct.counter
            if key != actual:  # its counter grew since the entry was pushed
                self._version += 1
                live[tenant] = self._version
                heapq.heapreplace(heap, (actual, rank, self._version, acct))
                continue
            return acct
        return None

    # ---- queue hooks ----------------------------------------------------------------------------------------------
    def open(self, acct: Account) -> None:
        self._queues[acct.tenant] = deque()
        self._live[acct.tenant] = 0

    def enqueue(self, req: Request, front: bool) -> None:
        q = self._queues[req.tenant]
        if not q:
            self._push(req.account)
        (q.appendleft if front else q.append)(req)

    def peek(self) -> Request | None:
        acct = self._min_account()
        return self._queues[acct.tenant][0] if acct is not None else None

    def dequeue(self, req: Request) -> None:
        self._queues[req.tenant].popleft()

    def remove(self, req: Request) -> None:
        self._queues[req.tenant].remove(req)  # O(length of that tenant's queue); emptied queues drop lazily

    def on_charge(self, acct: Account, amount: float) -> None:
        acct.counter += amount / acct.weight
        if amount < 0 and self._queues[acct.tenant]:
            self._push(acct)  # the live entry's key is now above the counter: replace it

    # ---- counters -------------------------------------------------------------------------------------------------
    def counter_of(self, acct: Account) -> float:
        return acct.counter

    def min_counter(self) -> float | None:
        acct = self._min_account()
        return acct.counter if acct is not None else None

    def set_counter(self, acct: Account, counter: float) -> None:
        lower = counter < acct.counter
        acct.counter = counter
        if lower and self._queues[acct.tenant]:
            self._push(acct)  # the live entry's key is now above the counter: replace it

    def reset_counters(self, accounts: Iterable[Account]) -> None:
        for acct in accounts:
            acct.counter = 0.0
            if self._queues[acct.tenant]:
                self._push(acct)


class LCF(VTC):
    """Least counter first, without the lift: the paper's baseline that lets an idle tenant hoard credit."""

    name = "lcf"
    capabilities = replace(VTC.capabilities, lifts=False)


def _predictor_spec(text: str) -> str:
    make_predictor(text)  # ValueError naming the predictors
    return text


register("vtc", VTC, "the paper's Virtual Token Counter; tenant weights divide the charges")
register("weighted-vtc", VTC, "vtc, named for readability when weights are given")
register("lcf", LCF, "least counter first, without the lift (the paper's baseline that hoards credit)")
register(
    "vtc-predict",
    VTC,
    "vtc charging a predicted output length at admission, corrected at finish",
    argument="PREDICTOR",
    default="moving-average",
    parse=_predictor_spec,
    build=lambda arg, cost, seed: VTC(cost=cost, predictor=make_predictor(arg, seed)),
)
