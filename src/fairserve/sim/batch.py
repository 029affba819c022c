"""The running batch of the event engine (sim/engine.py): the requests running, by admission order and by tenant,
when each ends, the decode step and the KV tokens they hold.

The engine's parts read it (the memory model, the charging rule, the forecast, preemption); the engine alone changes
it, as requests start, decode, end or are preempted."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from ..core.request import RequestState

if TYPE_CHECKING:
    from .requests import SimRequest

RUNNING = RequestState.RUNNING
NEVER = 1 << 62  # a step that never comes


class Batch:
    """The running requests and the decode clock in steps: `step` (decode steps so far), `kv_used` (= the sum over
    running requests of server prompt + generated tokens), `running` (admission order: the paged pool evicts the
    newest), `tenants` (the running requests by tenant), `ends` (a heap of (step at which a request has all its
    tokens, seq, request); a preempted or cancelled request's entry stays until it reaches the top)."""

    __slots__ = ("step", "kv_used", "running", "tenants", "ends")

    def __init__(self) -> None:
        self.step = 0
        self.kv_used = 0
        self.running: dict[SimRequest, None] = {}
        self.tenants: dict[str, list[SimRequest]] = {}
        self.ends: list[tuple[int, int, SimRequest]] = []

    def next_finish(self) -> int:
        """The step at which the next running request has all its tokens (NEVER if none is running)."""
        ends = self.ends
        while ends and (ends[0][2].state is not RUNNING or ends[0][2].end_step != ends[0][0]):
            heapq.heappop(ends)  # a preempted run's or a cancelled request's
        return ends[0][0] if ends else NEVER

    def leave(self, r: SimRequest) -> bool:
        """Take `r` out of the running set; True if it was its tenant's last running request."""
        del self.running[r]
        group = self.tenants[r.tenant]
        group.remove(r)
        if group:
            return False
        del self.tenants[r.tenant]
        return True
