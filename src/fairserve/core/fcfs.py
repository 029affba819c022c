"""Baselines without counters: first-come-first-served, and FCFS behind a per-client requests-per-minute limit."""

from __future__ import annotations

from collections import deque

from .policy import Policy
from .request import Request, RequestState


class FCFS(Policy):
    """Admits in arrival order. Aborted requests are dropped lazily, so abort is O(1)."""

    name = "fcfs"
    orders_by_counter = False
    uses_weights = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._queue: deque[Request] = deque()

    def peek(self) -> Request | None:
        q = self._queue
        while q and q[0].state is not RequestState.QUEUED:
            q.popleft()
        return q[0] if q else None

    def _enqueue(self, req: Request, front: bool) -> None:
        (self._queue.appendleft if front else self._queue.append)(req)

    def _dequeue(self, req: Request) -> None:
        self._queue.popleft()

    def _remove(self, req: Request) -> None:
        pass  # the entry itself is skipped by peek() once its state changes


class RPM(FCFS):
    """The paper's request-rate baseline: a request is rejected at arrival if its client already had `limit`
    accepted requests in the previous `window_s` seconds; accepted requests are served FCFS."""

    def __init__(self, limit: int, window_s: float = 60.0, **kwargs) -> None:
        if limit < 1:
            raise ValueError(f"rpm limit must be >= 1, got {limit}")
        super().__init__(**kwargs)
        self.limit = limit
        self.window_s = self.retry_after_s = window_s
        self.name = f"rpm{limit}"
        self._accepted: dict[str, deque[float]] = {}

    def _accept(self, req: Request, now: float) -> bool:
        times = self._accepted.setdefault(req.client, deque())
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if len(times) >= self.limit:
            return False
        times.append(now)
        return True
