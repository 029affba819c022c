"""The Virtual Token Counter (Sheng et al., 2024, Algorithm 1/2) and its variants.

Each tenant has a counter of the service it received, divided by its weight (`Account.counter`). The queued request
of the tenant with the smallest counter is admitted next. When a tenant goes from nothing queued to something queued,
the ledger lifts its counter to the smallest counter among the queued tenants (`min_counter`), so idle time earns
no credit. Tenants may be the leaves of a tree of groups (`pro/acme/search`): every group has a counter of its own,
the same rules apply among the children of every node, and requests may run at priority levels (served strictly in
order; the tree decides within a level).

Variants: weights (weighted VTC: the ledger's accounts), `LCF` (no lift, the paper's baseline), `predictor=` (VTC
with output-length prediction), `cost=` (any monotone h(x, y)).
"""

from __future__ import annotations

import bisect
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


class _Order:
    """The children of one node (a group, or the top of the tree) with something queued at one priority level,
    smallest counter first: a heap of (counter, rank, version, child, what is queued below the child at this level:
    its queue, or its own order) with lazy invalidation. A child has at most one live entry; counters only grow
    between entries, except refunds, resets and counters set from elsewhere, which push a fresh one."""

    __slots__ = ("heap", "live", "queued")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int, Account, deque[Request] | _Order]] = []
        self.live: dict[str, int] = {}  # child -> the version of its live entry
        self.queued = 0  # requests queued at this level in the node's subtree

    def __bool__(self) -> bool:
        return self.queued > 0


class VTC(Policy):
    """VTC over the tenant tree and priority levels. The best priority level with anything queued is served first;
    within it, from the top of the tree down, the child with the smallest counter among those with something queued
    at that level, down to a tenant, whose oldest request at that level is admitted. Every node's counter is the
    service charged through it divided by its weight (lifted), the same at every level. A flat list of tenants at one
    level is the paper's VTC: one heap over the tenants. Selection is O(depth · log fan-out)."""

    name = "vtc"
    capabilities = Capabilities(
        orders_by_counter=True, uses_weights=True, keeps_counters=True, shares_counters=True, lifts=True, tree=True
    )

    def __init__(self, cost: CostFunction | None = None, predictor: Predictor | None = None) -> None:
        super().__init__(cost, predictor)
        self._top: dict[int, _Order] = {}  # level -> the order among the nodes at the top of the tree
        self._orders: dict[str, dict[int, _Order]] = {}  # group -> level -> the order among its children
        self._queues: dict[str, dict[int, deque[Request]]] = {}  # tenant -> level -> its queued requests
        self._levels: list[int] = []  # the priority levels seen, best (lowest) first
        self._version = 0
        if predictor is not None:
            self.name = f"vtc-predict({predictor.name})"

    # ---- the orders -----------------------------------------------------------------------------------------------
    def _orders_below(self, node: Account | None) -> dict[int, _Order]:
        if node is None:
            return self._top
        orders = self._orders.get(node.tenant)
        if orders is None:
            orders = self._orders[node.tenant] = {}
        return orders

    def _push(self, order: _Order, acct: Account, below: deque[Request] | _Order) -> None:
        self._version += 1
        order.live[acct.tenant] = self._version
        heapq.heappush(order.heap, (acct.counter, acct.rank, self._version, acct, below))

    def _min(self, order: _Order, level: int) -> Account | None:
        """The child with something queued at `level` with the smallest counter."""
        heap, live = order.heap, order.live
        while heap:
            key, rank, version, acct, below = heap[0]
            if version != live[acct.tenant] or not below:  # stale, or nothing queued below it any more
                heapq.heappop(heap)
                continue
            actual = acct.counter
            if key != actual:  # its counter grew since the entry was pushed: the live entry, moved down in place
                heapq.heapreplace(heap, (actual, rank, version, acct, below))
                continue
            return acct
        return None

    def _refresh(self, node: Account) -> None:
        """`node`'s counter went down: a fresh entry in its parent's order at every level it has something queued."""
        queues = self._queues.get(node.tenant)
        belows: dict[int, deque[Request]] | dict[int, _Order] = (
            queues if queues is not None else self._orders.get(node.tenant, {})
        )
        orders = self._orders_below(node.parent)
        for level, below in belows.items():
            if below:
                self._push(orders[level], node, below)

    # ---- queue hooks ----------------------------------------------------------------------------------------------
    def open(self, acct: Account) -> None:
        self._queues[acct.tenant] = {}

    def close(self, acct: Account) -> None:
        del self._queues[acct.tenant]

    def enqueue(self, req: Request, front: bool) -> None:
        acct, level = req.account, req.priority or 0
        queues = self._queues[acct.tenant]
        q = queues.get(level)
        if q is None:
            q = queues[level] = deque()
            if level not in self._levels:
                bisect.insort(self._levels, level)
        newly = not q
        (q.appendleft if front else q.append)(req)
        child, parent = acct, acct.parent
        below: deque[Request] | _Order = q
        while True:  # NOTE: up the tree, each node that now has something queued at `level` joins its parent's order
            orders = self._top if parent is None else self._orders_below(parent)
            order = orders.get(level)
            if order is None:
                order = orders[level] = _Order()
            if newly:
                self._push(order, child, below)
            order.queued += 1
            if parent is None:
                return
            newly = order.queued == 1
            child, parent, below = parent, parent.parent, order

    def peek(self) -> Request | None:
        levels = self._levels
        if len(levels) == 1 and not self._orders:  # NOTE: flat tenants at one level (the common case), `_min` inline
            flat = self._top[levels[0]]
            if not flat.queued:
                return None
            heap, live = flat.heap, flat.live
            while True:
                key, rank, version, child, below = heap[0]
                if version != live[child.tenant] or not below:
                    heapq.heappop(heap)
                elif key != child.counter:
                    heapq.heapreplace(heap, (child.counter, rank, version, child, below))
                else:
                    return below[0]  # type: ignore[index]  # NOTE: with no groups, what is below a child is its queue
        for level in levels:
            order = self._top.get(level)
            if order is not None and order.queued:
                break
        else:
            return None
        while True:
            acct = self._min(order, level)
            assert acct is not None  # NOTE: `order.queued` counts what is queued below it
            queues = self._queues.get(acct.tenant)
            if queues is not None:
                return queues[level][0]
            order = self._orders[acct.tenant][level]

    def dequeue(self, req: Request) -> None:
        self._queues[req.tenant][req.priority or 0].popleft()
        self._leave(req)

    def remove(self, req: Request) -> None:
        self._queues[req.tenant][req.priority or 0].remove(req)  # O(that queue's length); entries drop lazily
        self._leave(req)

    def _leave(self, req: Request) -> None:
        level, node, orders = req.priority or 0, req.account.parent, self._orders
        if node is None:
            self._top[level].queued -= 1
            return
        while node is not None:
            orders[node.tenant][level].queued -= 1
            node = node.parent
        self._top[level].queued -= 1

    def on_charge(self, acct: Account, amount: float) -> None:
        acct.counter += amount / acct.weight
        if acct.parent is not None:  # the charge reaches every group above
            node: Account | None = acct.parent
            while node is not None:
                node.counter += amount / node.weight
                node = node.parent
        if amount < 0:  # the live entries' keys are now above the counters: replace them
            node = acct
            while node is not None:
                self._refresh(node)
                node = node.parent

    # ---- counters -------------------------------------------------------------------------------------------------
    def counter_of(self, acct: Account) -> float:
        return acct.counter

    def min_counter(self, parent: Account | None = None) -> float | None:
        best = None
        for level, order in self._orders_below(parent).items():
            acct = self._min(order, level)
            if acct is not None and (best is None or acct.counter < best):
                best = acct.counter
        return best

    def set_counter(self, acct: Account, counter: float) -> None:
        lower = counter < acct.counter
        acct.counter = counter
        if lower:
            self._refresh(acct)

    def reset_counters(self, accounts: Iterable[Account]) -> None:
        nodes = list(accounts)
        for acct in nodes:
            acct.counter = 0.0
        for acct in nodes:
            self._refresh(acct)


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
