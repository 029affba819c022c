"""The paper's adapted Deficit Round Robin baseline (appendix C.2).

Backlogged tenants sit in a round-robin ring in the order they became backlogged, each with a deficit of service it
may still consume. The tenant under the pointer is served while its deficit is positive: its head request is admitted
and charged (prompt at admission, output tokens as they are decoded, both taken from the deficit, which may go
negative). Otherwise the pointer moves on and the next tenant receives one quantum. A tenant whose queue empties
leaves the ring; when it comes back, any positive credit it left with is dropped (idle tenants hoard nothing) but its
debt is kept, as in the artifact's `mdrr` queue, whose quantum is the KV pool / 20 = 500 tokens. As the quantum
shrinks this approaches VTC.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable

from .account import Account
from .cost import CostFunction
from .policy import Capabilities, Policy
from .registry import number, register
from .request import Request


class DRR(Policy):
    """O(log n) selection without walking the ring.

    Ring order is the order tenants joined (`_ring_pos`); the pointer is at (round, position). A tenant's deficit
    lives in its account, lazily: `-counter` plus one quantum per visit since its round (`_rounds`, kept here: the
    last round whose visit `counter` counts). The visit at which a tenant first has credit, (round, position), does
    not change while the pointer passes it (each pass adds the quantum it was waiting for), only when it is charged:
    so a heap of those visits yields the next tenant to serve."""

    name = "drr"
    capabilities = Capabilities(orders_by_counter=True, uses_weights=True, keeps_counters=True)

    def __init__(self, quantum: float = 500.0, cost: CostFunction | None = None) -> None:
        super().__init__(cost)
        self.quantum = _quantum(quantum)
        self._queues: dict[str, deque[Request]] = {}
        self._ring_pos: dict[str, int] = {}  # ring position of tenants in the ring (absent: not backlogged)
        self._next_pos = 0
        self._round, self._at = 0, 0  # the pointer: (round, ring position)
        self._at_acct: Account | None = None  # the tenant the pointer stopped at
        self._heap: list[tuple[int, int, int, Account]] = []  # (round, position, version, account): first credit
        self._version: dict[str, int] = {}  # a tenant's one live heap entry
        self._rounds: dict[str, int] = {}  # by tenant: the last ring round whose quantum its `counter` counts (0)
        self.name = f"drr{quantum:g}"

    # ---- lazy deficits --------------------------------------------------------------------------------------------
    def _visited(self, acct: Account) -> int:
        """Rounds whose visit of the tenant the pointer has made (a tenant outside the ring is never visited)."""
        pos = self._ring_pos.get(acct.tenant)
        if pos is None:
            return self._rounds.get(acct.tenant, 0)
        return self._round if pos <= self._at else self._round - 1

    def _deficit(self, acct: Account) -> float:
        return -acct.counter + self.quantum * (self._visited(acct) - self._rounds.get(acct.tenant, 0))

    def _fold(self, acct: Account) -> float:
        """Count the quanta of the visits made into `counter`; returns the deficit."""
        d = self._deficit(acct)
        acct.counter, self._rounds[acct.tenant] = -d, self._visited(acct)
        return d

    def _push(self, acct: Account) -> None:
        """(Re)compute the visit at which the tenant first has credit."""
        d, pos = self._fold(acct), self._ring_pos[acct.tenant]
        next_round = self._round if pos > self._at else self._round + 1
        visits = int(-d // self.quantum) + 1 if d <= 0 else 1
        version = self._version[acct.tenant] = self._version.get(acct.tenant, 0) + 1
        heapq.heappush(self._heap, (next_round + visits - 1, pos, version, acct))

    def _credit_visit(self) -> tuple[int, int, int, Account] | None:
        heap = self._heap
        while heap:
            _, pos, version, acct = heap[0]
            if self._ring_pos.get(acct.tenant) == pos and self._version[acct.tenant] == version:
                return heap[0]
            heapq.heappop(heap)  # stale: the tenant left the ring or was charged since
        return None

    # ---- queue hooks ----------------------------------------------------------------------------------------------
    def open(self, acct: Account) -> None:
        self._queues[acct.tenant] = deque()

    def close(self, acct: Account) -> None:
        del self._queues[acct.tenant]

    def enqueue(self, req: Request, front: bool) -> None:
        acct = req.account
        q = self._queues[acct.tenant]
        if not q:  # joins the ring at the tail: visited later in this round
            d = min(self._fold(acct), 0.0)
            self._next_pos += 1
            self._ring_pos[acct.tenant] = self._next_pos
            acct.counter, self._rounds[acct.tenant] = -d, self._visited(acct)
            self._push(acct)
        (q.appendleft if front else q.append)(req)

    def _stays(self) -> bool:
        """The tenant under the pointer is still backlogged and has credit: it is served again."""
        a = self._at_acct
        return a is not None and self._ring_pos.get(a.tenant) == self._at and self._deficit(a) > 0

    def peek(self) -> Request | None:
        if self._stays():
            assert self._at_acct is not None
            return self._queues[self._at_acct.tenant][0]
        top = self._credit_visit()
        return self._queues[top[3].tenant][0] if top is not None else None

    def dequeue(self, req: Request) -> None:
        if not self._stays():
            top = self._credit_visit()
            assert top is not None  # peek() returned `req`
            self._round, self._at, _, self._at_acct = top  # passed tenants got quanta, lazily
        self._drop(req)

    def remove(self, req: Request) -> None:
        self._drop(req)

    def _drop(self, req: Request) -> None:
        acct = req.account
        q = self._queues[acct.tenant]
        if q[0] is req:
            q.popleft()
        else:
            q.remove(req)
        if not q:  # leaves the ring
            self._fold(acct)
            del self._ring_pos[acct.tenant]

    def on_charge(self, acct: Account, amount: float) -> None:
        self._fold(acct)
        acct.counter += amount / acct.weight
        if acct.tenant in self._ring_pos:
            self._push(acct)

    # ---- counters -------------------------------------------------------------------------------------------------
    def deficit(self, acct: Account) -> float:
        return self._deficit(acct)

    def counter_of(self, acct: Account) -> float:
        """The deficit, negated: service consumed beyond the quanta received."""
        return -self._deficit(acct)

    def reset_counters(self, accounts: Iterable[Account]) -> None:
        """Every deficit back to 0: debts and credits are forgotten."""
        for acct in accounts:
            acct.counter, self._rounds[acct.tenant] = 0.0, self._visited(acct)
            if acct.tenant in self._ring_pos:
                self._push(acct)


def _quantum(quantum: float) -> float:
    if not quantum > 0:
        raise ValueError(f"drr quantum must be > 0, got {quantum}")
    return quantum


register(
    "drr",
    DRR,
    "the paper's adapted deficit round robin with quantum Q (the artifact's KV pool / 20)",
    argument="QUANTUM",
    default="500",
    parse=lambda text: _quantum(number(float)(text)),
    build=lambda quantum, cost, seed: DRR(quantum, cost=cost),
)
