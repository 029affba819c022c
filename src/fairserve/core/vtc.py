"""The Virtual Token Counter (Sheng et al., 2024, Algorithm 1/2) and its variants.

Each client has a counter of the service it received, divided by its weight. The queued request of the client
with the smallest counter is admitted next. When a client goes from nothing queued to something queued, its counter
is lifted to the smallest counter among the other queued clients, so idle time earns no credit.

Variants by constructor argument: weights (weighted VTC), `lift=False` (LCF, the paper's baseline),
`predictor=` (VTC with output-length prediction), `cost=` (any monotone h(x, y)).

Several processes can share the counters (gateway/shared_state.py): `lift_floor(client, local_floor)` then returns
the floor to lift to, given the smallest counter among the other locally queued clients (the global minimum over
clients backlogged in any process), and `set_counter` applies a counter computed elsewhere.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable

from .ledger import Account
from .policy import Policy
from .request import Request


class VTC(Policy):
    """Counters live in the tenants' accounts (`Account.counter`). Selection is O(log n) in the number of
    backlogged clients: a heap of (counter, client rank) with lazy invalidation. A client has at most one live heap
    entry; counters only grow between entries, except refunds and resets, which push a fresh entry."""

    name = "vtc"

    def __init__(self, lift: bool = True, **kwargs) -> None:
        self._queues: dict[str, deque[Request]] = {}
        self._live: dict[str, int] = {}  # client -> version of its one live heap entry
        self._heap: list[tuple[float, int, int, str]] = []
        self._version = 0
        super().__init__(**kwargs)
        self.lift = lift
        # NOTE: shared state across processes (gateway/shared_state.py) sets this; None keeps the paper's local lift
        self.lift_floor: Callable[[str, float | None], float | None] | None = None
        if not lift:
            self.name = "lcf"
        elif self.predictor is not None:
            self.name = f"vtc-predict({self.predictor.name})"

    # ---- the heap -----------------------------------------------------------------------------------------------
    def _push(self, acct: Account) -> None:
        self._version += 1
        self._live[acct.tenant] = self._version
        heapq.heappush(self._heap, (acct.counter, acct.rank, self._version, acct.tenant))

    def _min_client(self) -> str | None:
        """The backlogged client with the smallest counter."""
        heap, accounts = self._heap, self.accounts
        while heap:
            key, rank, version, client = heap[0]
            if version != self._live[client] or not self._queues[client]:
                heapq.heappop(heap)
                continue
            actual = accounts[client].counter
            if key != actual:  # its counter grew since the entry was pushed
                self._version += 1
                self._live[client] = self._version
                heapq.heapreplace(heap, (actual, rank, self._version, client))
                continue
            return client
        return None

    # ---- Policy hooks -------------------------------------------------------------------------------------------
    def _new_client(self, acct: Account) -> None:
        self._queues[acct.tenant] = deque()
        self._live[acct.tenant] = 0

    def _enqueue(self, req: Request, front: bool) -> None:
        acct = req.account
        q = self._queues[acct.tenant]
        if not q:
            if self.lift and not front:  # NOTE: a preempted request coming back is not a new arrival
                other = self._min_client()
                floor = self.accounts[other].counter if other is not None else None
                if self.lift_floor is not None:
                    floor = self.lift_floor(acct.tenant, floor)
                if floor is not None:
                    if floor > acct.counter:
                        acct.counter = floor
            self._push(acct)
        (q.appendleft if front else q.append)(req)

    def peek(self) -> Request | None:
        client = self._min_client()
        return self._queues[client][0] if client is not None else None

    def _dequeue(self, req: Request) -> None:
        self._queues[req.client].popleft()

    def _remove(self, req: Request) -> None:
        self._queues[req.client].remove(req)  # O(length of that client's queue); emptied queues drop lazily

    def _on_charge(self, acct: Account, amount: float) -> None:
        acct.counter += amount / acct.weight
        if amount < 0 and self._queues[acct.tenant]:
            self._push(acct)  # the live entry's key is now above the counter: replace it

    # ---- counters -----------------------------------------------------------------------------------------------
    def counter_of(self, client: str) -> float:
        acct = self.accounts.get(client)
        return acct.counter if acct is not None else 0.0

    @property
    def counters(self) -> dict[str, float]:
        return {c: a.counter for c, a in self.accounts.items()}

    def set_counter(self, client: str, counter: float) -> None:
        acct = self.account(client)
        lower = counter < acct.counter
        acct.counter = counter
        if lower and self._queues[client]:
            self._push(acct)  # the live entry's key is now above the counter: replace it

    def reset_counters(self) -> None:
        for acct in self.accounts.values():
            acct.counter = 0.0
            if self._queues[acct.tenant]:
                self._push(acct)
