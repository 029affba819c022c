"""The paper's adapted Deficit Round Robin baseline (appendix C.2).

Backlogged clients sit in a round-robin ring, each with a deficit of service it may still consume. The client at the
ring's head is served while its deficit is positive: its head request is admitted and charged (prompt at admission,
output tokens as they are decoded, both taken from the deficit). When its deficit is not positive it receives one
quantum and moves to the back, and the next client receives its quantum. A client whose queue empties leaves the ring
and drops any positive credit (idle clients hoard nothing) but keeps its debt, as in the artifact's `mdrr` queue,
whose default quantum is the KV pool / 20 = 500 tokens. As the quantum shrinks this approaches VTC.
"""
from __future__ import annotations

from collections import deque

from .policy import Policy
from .request import Request


class DRR(Policy):
    """`peek()` is pure: it works out where the round-robin pointer would stop (the first client, in ring order,
    whose deficit turns positive after the quanta it would receive on the way) and `pop()` applies that walk.
    That is O(backlogged clients) when the head client has no credit left, unlike VTC's heap: DRR is a baseline."""

    name = "drr"

    def __init__(self, quantum: float = 500.0, **kwargs) -> None:
        if not quantum > 0:
            raise ValueError(f"drr quantum must be > 0, got {quantum}")
        super().__init__(**kwargs)
        self.quantum = quantum
        self.name = f"drr{quantum:g}"
        self.deficit: dict[str, float] = {}
        self._queues: dict[str, deque[Request]] = {}
        self._ring: deque[str] = deque()    # backlogged clients; the pointer is at the head

    def _new_client(self, client: str) -> None:
        self.deficit[client] = 0.0
        self._queues[client] = deque()

    def _enqueue(self, req: Request, front: bool) -> None:
        q = self._queues[req.client]
        if not q:
            self._ring.append(req.client)
            if len(self._ring) == 1:
                self.deficit[req.client] += self.quantum   # the pointer arrives at it
        (q.appendleft if front else q.append)(req)

    def _walk(self) -> int:
        """How many pointer moves until a client with credit is reached. Move t visits ring[t % n] and gives it
        a quantum; a client with deficit d <= 0 first has credit on its (floor(-d / quantum) + 1)-th visit."""
        ring, deficit, qnt = self._ring, self.deficit, self.quantum
        if deficit[ring[0]] > 0:
            return 0
        n, best = len(ring), None
        for j in range(1, n + 1):
            d = deficit[ring[j % n]]
            moves = j + (int(-d // qnt) if d <= 0 else 0) * n
            if best is None or moves < best:
                best = moves
        return best

    def peek(self) -> Request | None:
        if not self._ring:
            return None
        moves = self._walk()
        return self._queues[self._ring[moves % len(self._ring)]][0]

    def _dequeue(self, req: Request) -> None:
        moves, ring = self._walk(), self._ring
        if moves:
            n = len(ring)
            for j in range(1, n + 1):
                if moves >= j:
                    self.deficit[ring[j % n]] += ((moves - j) // n + 1) * self.quantum
            ring.rotate(-(moves % n))
        self._drop(req)

    def _remove(self, req: Request) -> None:
        self._drop(req)

    def _drop(self, req: Request) -> None:
        q = self._queues[req.client]
        q.remove(req) if q[0] is not req else q.popleft()
        if not q:
            was_head = self._ring[0] == req.client
            self._ring.remove(req.client)
            self.deficit[req.client] = min(self.deficit[req.client], 0.0)
            if was_head and self._ring:
                self.deficit[self._ring[0]] += self.quantum

    def _on_charge(self, client: str, amount: float) -> None:
        w = self.weights.get(client)
        self.deficit[client] -= amount * (1.0 / w if w is not None else 1.0)

    @property
    def counters(self) -> dict[str, float]:
        return {c: -d for c, d in self.deficit.items()}

    def queued_clients(self) -> list[str]:
        return list(self._ring)
