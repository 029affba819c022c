"""The Virtual Token Counter (Sheng et al., 2024, Algorithm 1/2) and its variants.

Each client has a counter of the service it received, divided by its weight. The queued request of the client
with the smallest counter is admitted next. When a client goes from nothing queued to something queued, its counter
is lifted to the smallest counter among the other queued clients, so idle time earns no credit.

Variants by constructor argument: weights (weighted VTC), `lift=False` (LCF, the paper's baseline),
`predictor=` (VTC with output-length prediction), `cost=` (any monotone h(x, y)).
"""
from __future__ import annotations

import heapq
from collections import deque

from .policy import Policy
from .request import Request


class VTC(Policy):
    """Selection is O(log n) in the number of backlogged clients: a heap of (counter, client rank) with lazy
    invalidation. A client has at most one live heap entry; counters only grow between entries, except refunds and
    resets, which push a fresh entry."""

    name = "vtc"

    def __init__(self, lift: bool = True, **kwargs) -> None:
        self.counter: dict[str, float] = {}
        super().__init__(**kwargs)
        self.lift = lift
        if not lift:
            self.name = "lcf"
        elif self.predictor is not None:
            self.name = f"vtc-predict({self.predictor.name})"
        self._queues: dict[str, deque[Request]] = {}
        self._rank: dict[str, int] = {}           # first-seen order: the deterministic tie-break
        self._live: dict[str, int] = {}           # client -> version of its one live heap entry
        self._heap: list[tuple[float, int, int, str]] = []
        self._version = 0

    # ---- the heap -----------------------------------------------------------------------------------------------
    def _push(self, client: str) -> None:
        self._version += 1
        self._live[client] = self._version
        heapq.heappush(self._heap, (self.counter[client], self._rank[client], self._version, client))

    def _min_client(self) -> str | None:
        """The backlogged client with the smallest counter."""
        heap = self._heap
        while heap:
            key, rank, version, client = heap[0]
            if version != self._live[client] or not self._queues[client]:
                heapq.heappop(heap)
                continue
            actual = self.counter[client]
            if key != actual:   # its counter grew since the entry was pushed
                self._version += 1
                self._live[client] = self._version
                heapq.heapreplace(heap, (actual, rank, self._version, client))
                continue
            return client
        return None

    # ---- Policy hooks -------------------------------------------------------------------------------------------
    def _new_client(self, client: str) -> None:
        self.counter[client] = 0.0
        self._queues[client] = deque()
        self._rank[client] = len(self._rank)
        self._live[client] = 0

    def _enqueue(self, req: Request, front: bool) -> None:
        client = req.client
        q = self._queues[client]
        if not q:
            if self.lift and not front:     # NOTE: a preempted request coming back is not a new arrival
                other = self._min_client()
                if other is not None and self.counter[other] > self.counter[client]:
                    self.counter[client] = self.counter[other]
            self._push(client)
        (q.appendleft if front else q.append)(req)

    def peek(self) -> Request | None:
        client = self._min_client()
        return self._queues[client][0] if client is not None else None

    def _dequeue(self, req: Request) -> None:
        self._queues[req.client].popleft()

    def _remove(self, req: Request) -> None:
        self._queues[req.client].remove(req)   # O(length of that client's queue); emptied queues drop lazily

    def _on_charge(self, client: str, amount: float) -> None:
        w = self.weights.get(client)
        self.counter[client] += amount / w if w is not None else amount
        if amount < 0 and self._queues[client]:
            self._push(client)   # the live entry's key is now above the counter: replace it

    # ---- inspection / admin -------------------------------------------------------------------------------------
    @property
    def counters(self) -> dict[str, float]:
        return dict(self.counter)

    def queued_clients(self) -> list[str]:
        return [c for c, q in self._queues.items() if q]

    def queue_length(self, client: str) -> int:
        q = self._queues.get(client)
        return len(q) if q else 0

    def reset_counters(self) -> None:
        for client in self.counter:
            self.counter[client] = 0.0
            if self._queues[client]:
                self._push(client)
