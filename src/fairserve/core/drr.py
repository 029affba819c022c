"""The paper's adapted Deficit Round Robin baseline (appendix C.2).

Backlogged clients sit in a round-robin ring in the order they became backlogged, each with a deficit of service it may still consume. The client under
the pointer is served while its deficit is positive: its head request is admitted and charged (prompt at admission,
output tokens as they are decoded, both taken from the deficit, which may go negative). Otherwise the pointer moves
on and the next client receives one quantum. A client whose queue empties leaves the ring; when it comes back, any
positive credit it left with is dropped (idle clients hoard nothing) but its debt is kept, as in the artifact's
`mdrr` queue, whose quantum is the KV pool / 20 = 500 tokens. As the quantum shrinks this approaches VTC.
"""

from __future__ import annotations

import heapq
from collections import deque

from .ledger import Account
from .policy import Policy
from .request import Request


class DRR(Policy):
    """O(log n) selection without walking the ring.

    Ring order is the order clients joined (`_ring_pos`); the pointer is at (round, position). A client's deficit is kept lazily
    as `base` plus one quantum per visit since `paid` (the last round whose visit is counted). The visit at which a
    client first has credit, (round, seq), does not change while the pointer passes it (each pass adds the quantum
    it was waiting for), only when it is charged: so a heap of those visits yields the next client to serve."""

    name = "drr"

    def __init__(self, quantum: float = 500.0, **kwargs) -> None:
        if not quantum > 0:
            raise ValueError(f"drr quantum must be > 0, got {quantum}")
        self.quantum = quantum
        self._queues: dict[str, deque[Request]] = {}
        self._base: dict[str, float] = {}
        self._paid: dict[str, int] = {}
        self._ring_pos: dict[str, int] = {}  # ring position of clients in the ring (absent: not backlogged)
        self._next_seq = 0
        self._round, self._at = 0, 0  # the pointer: (round, ring position)
        self._at_client: str | None = None  # the client the pointer stopped at
        self._heap: list[tuple[int, int, str, int]] = []  # (round, seq, client, version): first credit
        self._version: dict[str, int] = {}  # a client's one live heap entry
        super().__init__(**kwargs)  # NOTE: last: weights given here open accounts, which need the above
        self.name = f"drr{quantum:g}"

    # ---- lazy deficits ------------------------------------------------------------------------------------------
    def _visited(self, client: str) -> int:
        """Rounds whose visit of `client` the pointer has made (a client outside the ring is never visited)."""
        seq = self._ring_pos.get(client)
        if seq is None:
            return self._paid[client]
        return self._round if seq <= self._at else self._round - 1

    def _deficit(self, client: str) -> float:
        return self._base[client] + self.quantum * (self._visited(client) - self._paid[client])

    def _settle(self, client: str) -> float:
        d = self._base[client] = self._deficit(client)
        self._paid[client] = self._visited(client)
        return d

    def _push(self, client: str) -> None:
        """(Re)compute the visit at which `client` first has credit."""
        d, seq = self._settle(client), self._ring_pos[client]
        next_round = self._round if seq > self._at else self._round + 1
        visits = int(-d // self.quantum) + 1 if d <= 0 else 1
        version = self._version[client] = self._version.get(client, 0) + 1
        heapq.heappush(self._heap, (next_round + visits - 1, seq, client, version))

    def _credit_visit(self) -> tuple[int, int, str, int] | None:
        heap = self._heap
        while heap:
            _, seq, client, version = heap[0]
            if self._ring_pos.get(client) == seq and self._version[client] == version:
                return heap[0]
            heapq.heappop(heap)  # stale: the client left the ring or was charged since
        return None

    # ---- Policy hooks -------------------------------------------------------------------------------------------
    def _new_client(self, acct: Account) -> None:
        client = acct.tenant
        self._queues[client] = deque()
        self._base[client] = 0.0
        self._paid[client] = 0

    def _enqueue(self, req: Request, front: bool) -> None:
        client = req.client
        q = self._queues[client]
        if not q:  # joins the ring at the tail: visited later in this round
            d = min(self._settle(client), 0.0)
            self._next_seq += 1
            self._ring_pos[client] = self._next_seq
            self._base[client], self._paid[client] = d, self._visited(client)
            self._push(client)
        (q.appendleft if front else q.append)(req)

    def _stays(self) -> bool:
        """The client under the pointer is still backlogged and has credit: it is served again."""
        c = self._at_client
        return c is not None and self._ring_pos.get(c) == self._at and self._deficit(c) > 0

    def peek(self) -> Request | None:
        if self._stays():
            return self._queues[self._at_client][0]
        top = self._credit_visit()
        return self._queues[top[2]][0] if top is not None else None

    def _dequeue(self, req: Request) -> None:
        if not self._stays():
            self._round, self._at, self._at_client, _ = self._credit_visit()  # passed clients got quanta, lazily
        self._drop(req)

    def _remove(self, req: Request) -> None:
        self._drop(req)

    def _drop(self, req: Request) -> None:
        client = req.client
        q = self._queues[client]
        q.remove(req) if q[0] is not req else q.popleft()
        if not q:  # leaves the ring
            self._settle(client)
            del self._ring_pos[client]

    def _on_charge(self, acct: Account, amount: float) -> None:
        client = acct.tenant
        self._settle(client)
        self._base[client] -= amount / acct.weight
        if client in self._ring_pos:
            self._push(client)

    # ---- inspection ---------------------------------------------------------------------------------------------
    @property
    def deficit(self) -> dict[str, float]:
        return {c: self._deficit(c) for c in self._queues}

    def counter_of(self, client: str) -> float:
        """The deficit, negated: service consumed beyond the quanta received."""
        return -self._deficit(client) if client in self._queues else 0.0

    def reset_counters(self) -> None:
        """Every deficit back to 0: debts and credits are forgotten."""
        for client in self._queues:
            self._base[client] = 0.0
            self._paid[client] = self._visited(client)
            if client in self._ring_pos:
                self._push(client)
