"""An offline run (`SimEngine.run`): its loop over the engine (`run_offline`) and its arrivals (`Arrivals`): the
requests in arrival order, the tick at which each is due, how many are submitted, the run's horizon, and where a
decode run must stop for one (`cut`)."""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from .requests import SimResult, record_of
from .ticks import FOREVER, at_or_after

if TYPE_CHECKING:
    from ..core.account import Account
    from .engine import SimEngine
    from .requests import SimRequest

LOOKAHEAD = 16  # a decode run goes past at most this many arrivals that need no step of their own (`cut`)


def run_offline(engine: SimEngine, reqs: list[SimRequest], until_s: float | None) -> SimResult:
    """`engine` runs `reqs` (in arrival order) until every one is done, or until `until_s` (the rest is reported
    `unfinished`): the arrivals due are submitted, then the router loop runs up to the next one (or idles to it)."""
    # NOTE: the collector off for the run: its objects live to the end and make almost no cycles, and its passes
    # over them were a tenth of a million-request run
    collecting = gc.isenabled()
    gc.disable()
    try:
        engine.arrivals = pending = Arrivals(reqs, until_s)
        clock, horizon, advance, submit = engine.clock, pending.horizon, engine._advance, engine.submit
        while True:
            upcoming = pending.arrive(clock.t, submit)
            if clock.t >= horizon:
                break
            engine.just_finished.clear()
            if not advance(min(upcoming, horizon)):
                if upcoming == FOREVER:
                    break
                clock.t = min(max(clock.t, upcoming), horizon)  # idle until the next arrival
        engine.arrivals = Arrivals()
        engine._sync()
        step, now = engine.batch.step, engine.now
        records = [record_of(r, step, now) for r in reqs]
    finally:
        if collecting:
            if not gc.get_freeze_count():
                # NOTE: the run's objects straight to the oldest generation: the young collection that follows
                # would otherwise visit every one of them (a few % of a run); frozen objects of the caller's would
                # be unfrozen, so not then
                gc.freeze()
                gc.unfreeze()
            gc.enable()
    cached = [r.cached_tokens for r in reqs] if engine.cache is not None else None
    return SimResult(
        records,
        engine.ledger,
        now,
        step,
        engine.prefills,
        engine.preemptions,
        engine.busy_s,
        engine.config,
        engine.fair_preemptions,
        cached,
    )


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
