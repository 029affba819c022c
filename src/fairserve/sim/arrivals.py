"""An offline run's arrivals (`SimEngine.run`): the requests in arrival order, the tick at which each is due, how
many are submitted, the run's horizon, and where a decode run must stop for one (`cut`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from .ticks import FOREVER, at_or_after

if TYPE_CHECKING:
    from ..core.account import Account
    from .requests import SimRequest

LOOKAHEAD = 16  # a decode run goes past at most this many arrivals that need no step of their own (`cut`)


class Arrivals:
    """The pending arrivals of `run()` (none online), of which `arrived` are submitted, and the tick it stops at."""

    __slots__ = ("pending", "due", "arrived", "horizon", "looked")

    def __init__(self, reqs: list[SimRequest] | None = None, until_s: float | None = None) -> None:
        self.pending: list[SimRequest] = reqs or []
        self.due = [at_or_after(r.arrival_s) for r in self.pending]  # the tick at which each is due
        self.arrived = 0
        self.horizon = FOREVER if until_s is None else at_or_after(until_s)
        self.looked = (-1, 0, False)  # `cut`'s last look: (prefills by then, the arrival it got to, it needs a stop)

    def arrive(self, t: int, submit: Callable[[SimRequest], None]) -> int:
        """Submit the arrivals due by tick `t`; returns the tick at which the next one is due."""
        pending, due, i = self.pending, self.due, self.arrived
        while i < len(pending) and due[i] <= t:
            submit(pending[i])
            i += 1
        self.arrived = i
        return due[i] if i < len(pending) else FOREVER

    def due_by(self, t: int) -> bool:
        """Is an arrival due by tick `t`?"""
        i = self.arrived
        return i < len(self.pending) and self.due[i] <= t

    def cut(self, until: int, prefills: int, accounts: Mapping[str, Account]) -> int:
        """Charging lazily: when the decode run must stop for an arrival (`until`: the next arrival's tick). An
        arrival of a tenant with requests queued gets no lift, does not reorder the queue ahead of it and moves no
        forecast (`SimEngine.submit`), and nothing before the next decision reads it: the run goes past it (up to
        `LOOKAHEAD` of them), and it is submitted at the run's end, in arrival order, with the same effect
        (`prefills`: the engine's, which only an admission moves)."""
        pending, i = self.pending, self.arrived
        if i >= len(pending):
            return until  # NOTE: online (advance_to's target), or no arrival left
        # NOTE: what the last look found stands until a request is admitted (only that empties a tenant's queue)
        admitted, j, stop = self.looked
        if admitted != prefills or j < i:
            j, stop = i, False
        elif stop:
            return min(self.due[j], self.horizon)
        end = min(i + LOOKAHEAD, len(pending))
        while j < end:
            acct = accounts.get(pending[j].tenant)
            if acct is None or not acct.queued:
                self.looked = (prefills, j, True)
                return min(self.due[j], self.horizon)
            j += 1
        self.looked = (prefills, j, False)
        return min(self.due[j] if j < len(pending) else FOREVER, self.horizon)
