"""Baselines without counters: first-come-first-served, and FCFS behind a per-tenant requests-per-minute limit."""

from __future__ import annotations

from collections import deque

from .cost import CostFunction
from .policy import Capabilities, Policy
from .registry import number, register
from .request import Request, RequestState


class FCFS(Policy):
    """Admits in arrival order. Cancelled requests are dropped lazily, so a cancel is O(1)."""

    name = "fcfs"
    capabilities = Capabilities()

    def __init__(self, cost: CostFunction | None = None) -> None:
        super().__init__(cost)
        self._queue: deque[Request] = deque()

    def peek(self) -> Request | None:
        q = self._queue
        while q and q[0].state is not RequestState.QUEUED:
            q.popleft()
        return q[0] if q else None

    def enqueue(self, req: Request, front: bool) -> None:
        (self._queue.appendleft if front else self._queue.append)(req)

    def dequeue(self, req: Request) -> None:
        self._queue.popleft()

    def remove(self, req: Request) -> None:
        pass  # the entry itself is skipped by peek() once its state changes


class RPM(FCFS):
    """The paper's request-rate baseline: a request is rejected at arrival if its tenant already had `limit`
    accepted requests in the previous `window_s` seconds; accepted requests are served FCFS."""

    capabilities = Capabilities(rejects_at_arrival=True)

    def __init__(self, limit: int, window_s: float = 60.0, cost: CostFunction | None = None) -> None:
        super().__init__(cost)
        self.limit = _limit(limit)
        self.window_s = self.retry_after_s = window_s
        self.name = f"rpm{limit}"
        self._accepted: dict[str, deque[float]] = {}

    def accept(self, req: Request, now: float) -> bool:
        times = self._accepted.setdefault(req.tenant, deque())
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if len(times) >= self.limit:
            return False
        times.append(now)
        return True


def _limit(limit: int) -> int:
    if limit < 1:
        raise ValueError(f"rpm limit must be >= 1, got {limit}")
    return limit


register("fcfs", FCFS, "arrival order")
register(
    "rpm",
    RPM,
    "FCFS behind a limit of N accepted requests per tenant per 60 s; the rest are rejected at arrival",
    argument="N",
    default="20",
    parse=lambda text: _limit(number(int)(text)),
    build=lambda limit, cost, seed: RPM(limit, cost=cost),
)
