"""When the event engine (sim/engine.py) next tries an admission: one forecast per charging rule (sim/charging.py).

After a try that admitted nothing, the first step at which one could admit something, while nothing happens (every
event resets it): the policy's next request fits at a step the memory model computes (sim/memory.py); under lazy
charges another request can only go first once the next one's tenant is charged past it (seen by charging ahead and
taking the charges back), and only fit where the smallest queued sizes fit. Where every step's charges count, or
preemption, the cap or the prefix cache decide a try, there is no forecast (`EveryTry`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..core.request import Request
from .batch import NEVER

if TYPE_CHECKING:
    from .charging import ChargeLazily
    from .memory import Memory
    from .requests import SimRequest


class EveryTry:
    """No forecast: every try the router loop makes is made. `first` (None where every step's charges count) looks
    up the policy's next request after an admission, as the charges it brings up to date are part of the run."""

    skips = False  # a try that would admit nothing is not made
    looks_ahead = False  # after an admission, the next try is forecast (`first` looked up)

    def __init__(self, first: Callable[[], Request | None] | None) -> None:
        self.first = first
        self.looks_ahead = first is not None

    def when(self, lo: int, head: Request | None, first: int | None = None, hi: int | None = None) -> int:
        """The first step from `lo` on at which a try could admit something, the policy's next request `head` having
        been refused (`first`: when `head` first fits, if known; `hi`: `Memory.quiet_cap()`, if known)."""
        return lo


Forecast = EveryTry


class FitForecast(EveryTry):
    """The order cannot change without an event (charges at the end): a try succeeds first where the policy's next
    request fits, which the memory model computes."""

    skips = True
    looks_ahead = True

    def __init__(self, memory: Memory) -> None:
        self.memory = memory

    def when(self, lo: int, head: Request | None, first: int | None = None, hi: int | None = None) -> int:
        if head is None:
            return NEVER
        if first is None:
            first = self.memory.first_fit(head, lo, self.memory.quiet_cap() if hi is None else hi)
        return first


class OrderForecast(FitForecast):
    """Lazy charges (exact, every counter linear between events unless a predictor moves it): the policy's next
    request fits at a step the memory model computes; another request can only be first if the next one's tenant is
    charged past the others, and only fit where the smallest queued sizes fit."""

    def __init__(self, memory: Memory, charging: ChargeLazily) -> None:
        super().__init__(memory)
        self.charging = charging
        self.ledger, self.batch = charging.ledger, charging.batch

    def when(self, lo: int, head: Request | None, first: int | None = None, hi: int | None = None) -> int:
        if head is None:
            return NEVER
        memory, sizes = self.memory, self.charging.sizes.smallest()
        if hi is None:
            hi = memory.quiet_cap()
        smallest = None  # (first, last) step at which the smallest queued sizes fit, once looked up
        if first is None:
            # NOTE: the smallest queued sizes fit no later than any queued request: where they never do (a full
            # pool), the next request's own search is not needed either
            smallest = memory.first_fit_smallest(sizes, lo, hi)
            if smallest[0] == NEVER:
                return NEVER
            first = memory.first_fit(head, smallest[0], hi)
        if head.tenant not in self.batch.tenants:
            return first  # the order cannot change without an event
        some, last = smallest or memory.first_fit_smallest(sizes, lo, min(first, hi))
        if some >= first:
            return first
        until = min(first, hi, last + 1) - 1  # someone else could fit at some step in [some, until]
        proven = self._first_through(head, until)
        return first if proven >= until else max(some, proven + 1)

    def _first_through(self, head: Request, until: int) -> int:
        """The last step up to `until` through which `head` provably stays the policy's next request."""
        step = self.batch.step
        if self.ledger.predictor is not None:  # bisection: the steps at which it does form an interval from now
            if self._first_at(head, until) is None:
                return until
            lo, hi = step, until
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if self._first_at(head, mid) is None:
                    lo = mid
                else:
                    hi = mid
            return lo
        while until > step:  # NOTE: linear counters: where the one picked instead overtook, then look again
            seen = self._first_at(head, until)
            if seen is None:
                return until
            until = self._overtaken(head, until, *seen) - 1
        return step

    def _first_at(self, head: Request, step: int) -> tuple[str, float, float, int] | None:
        """None if `head` is still the policy's next request at `step` (and so at every step from now to it), seen
        by charging ahead, then taking the charges back. Without a predictor every counter grows linearly, so two
        tenants in one order at both ends of the stretch are in it all along: the tenants the policy picks are
        charged up to `step` until it picks `head` or one charged already; for the one picked instead it returns
        (its tenant, its counter and head's at `step`, the step it was charged up to before). With a
        predictor only `head`'s tenant is charged ahead (the others only move back as they are charged, so that
        proves it too, less often)."""
        ahead: list[tuple[list[SimRequest], int]] = []
        ledger, tenants, now = self.ledger, self.batch.tenants, self.batch.step
        accounts, charged = ledger.accounts, self.charging.charged
        linear = ledger.predictor is None

        def forward(tenant: str) -> None:
            group, k = tenants[tenant], step - charged[tenant]
            ledger.outputs(group, k)
            ahead.append((group, k))

        try:
            forward(head.tenant)
            moved = {head.tenant}
            while True:
                req = ledger.peek()
                if req is head:
                    return None
                if req is None:
                    return ("", 0.0, 0.0, 0)
                t = req.tenant
                if linear and t in tenants and t not in moved:
                    forward(t)
                    moved.add(t)
                elif not linear and t in tenants and charged[t] != now:
                    self.charging.charge(t)
                else:  # it goes first with its counter as it is
                    since = charged[t] if t in tenants else step
                    return (t, accounts[t].counter, accounts[head.tenant].counter, since)
        finally:
            for group, k in reversed(ahead):
                ledger.outputs(group, -k)

    def _overtaken(self, head: Request, at: int, tenant: str, counter: float, head_counter: float, since: int) -> int:
        """The first step after now at which `tenant` (its counter `counter` at step `at`, linear from the step
        `since` it is charged up to) may come before `head` (`head_counter` at `at`, linear from now): a tie
        counts, whatever the tie-break."""
        now = self.batch.step
        if not tenant:
            return now + 1
        # NOTE: exact, in integers: every counter is a binary fraction (exact_charges), so all share a denominator
        h0, o0 = self.ledger.accounts[head.tenant].counter, self.ledger.accounts[tenant].counter
        (h0n, h0d), (o0n, o0d) = h0.as_integer_ratio(), o0.as_integer_ratio()
        (hcn, hcd), (ocn, ocd) = head_counter.as_integer_ratio(), counter.as_integer_ratio()
        d = max(h0d, o0d, hcd, ocd)  # powers of two: the largest is a multiple of each
        h0i, o0i, hci, oci = h0n * (d // h0d), o0n * (d // o0d), hcn * (d // hcd), ocn * (d // ocd)
        a = at - now  # head's counter rises by hci - h0i over a steps
        b, rise = (at - since, oci - o0i) if at > since else (1, 0)  # tenant's, by rise over b steps
        closing = (hci - h0i) * b - rise * a  # (head's rate - tenant's) * d * a * b
        if closing <= 0:
            return at
        gap = (o0i - h0i) * b + rise * (now - since)  # how far `tenant` is behind at now, * d * b
        return max(now + 1, now - (-(gap * a) // closing))
