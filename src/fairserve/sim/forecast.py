"""How the event engine (sim/engine.py) charges and when it tries an admission, as a mixin of `SimEngine`.

Charging: a decision reads the counters, so they must be up to date then, and only then. Where every charge is an
exact binary fraction (`exact_charges`), sums do not depend on how charges are grouped, so a tenant's running
requests are charged in one `Ledger.outputs` call, when a decision looks at that tenant (`Charging.LAZY`);
otherwise every request is charged before every decision, in the step-by-step loop's order, so that every float is
the same (`Charging.EVERY_STEP`); orders that ignore charges are charged at finish (`Charging.AT_END`).

When to try: after a try that admitted nothing, the first step at which one could admit something, while nothing
happens (every event resets it): the policy's next request fits at a step the reserve index computes; another
request can only go first once the next one's tenant is charged past it (seen by charging ahead and taking the
charges back), and only fit where the smallest queued sizes fit.
"""

from __future__ import annotations

import heapq
import math
from enum import Enum
from typing import TYPE_CHECKING

from ..core.cost import LinearCost
from ..core.ledger import Ledger
from ..core.request import Request, RequestState
from .budget import ReserveIndex

if TYPE_CHECKING:
    from .requests import EngineConfig, SimRequest

RUNNING, QUEUED = RequestState.RUNNING, RequestState.QUEUED
NEVER = 1 << 62  # a step that never comes


class Charging(Enum):
    """When the engine charges decoded tokens (the counters must be up to date whenever a decision reads them)."""

    AT_END = "at the end"  # the order ignores charges (FCFS, rate limits): at finish, cancel and preemption only
    LAZY = "lazily"  # charges are exact in floating point: a tenant's running requests at once, when read
    EVERY_STEP = "every step"  # not exact: every request before every decision, in the step-by-step order


def exact_charges(ledger: Ledger) -> bool:
    """Every charge and counter is then an exact binary fraction, so grouping charges cannot change a bit: the
    policy admits the smallest counter first (a counter is a sum of charges / weight), the cost is linear with
    integral prices and every weight is a power of two. The tenants must be flat, at one priority level: a group's
    counter sums its tenants' charges and a lift reads the counters of every level, so charging only the tenants the
    policy picks would not give its choice (`Forecast._head`)."""
    cost = ledger.cost
    accounts = ledger.accounts.values()
    return (
        ledger.policy.capabilities.shares_counters
        and type(cost) is LinearCost
        and all(float(w).is_integer() and 0 <= w < 2**20 for w in (cost.w_p, cost.w_q))
        and all(math.frexp(a.weight)[0] == 0.5 for a in accounts)
        and not ledger.groups
        and all(a.priority is None and a.allowed is None for a in accounts)
    )


class Forecast:
    """The charging and the admission forecast of `SimEngine`, which holds the state they read."""

    ledger: Ledger
    config: EngineConfig
    step: int
    kv_used: int
    running: dict[SimRequest, None]
    _tenants: dict[str, list[SimRequest]]
    _ends: list[tuple[int, int, SimRequest]]
    _index: ReserveIndex | None
    _charging: Charging
    _every_try: bool
    _charged: dict[str, int]
    _queued: QueuedSizes
    _refused: Request | None
    _extra: int
    _kv: int
    _paged: bool
    _prefill_max: int
    _running_max: int
    _per_client: int

    def _next_finish(self) -> int:
        ends = self._ends
        while ends and (ends[0][2].state is not RUNNING or ends[0][2].end_step != ends[0][0]):
            heapq.heappop(ends)  # a preempted run's or a cancelled request's
        return ends[0][0] if ends else NEVER

    # ---- charging ----------------------------------------------------------------------------------------------
    def _sync(self) -> None:
        """Charge every running request for the tokens decoded since its last charge."""
        if self._charging is Charging.LAZY:
            for tenant in self._tenants:
                self._charge(tenant)
            return
        step, output = self.step, self.ledger.output
        for r in self.running:
            n = r.generated + step - r.step_base - r.output_done
            if n:
                output(r, n)

    def _charge(self, tenant: str) -> None:
        """LAZY: charge `tenant`'s running requests up to this step, in one charge."""
        behind = self.step - self._charged.get(tenant, self.step)  # 0 for a tenant with nothing running
        if behind:
            self.ledger.outputs(self._tenants[tenant], behind)
            self._charged[tenant] = self.step

    def _first(self) -> Request | None:
        """The policy's next request (LAZY: with the counters it reads up to date)."""
        return self._head() if self._charging is Charging.LAZY else self.ledger.policy.peek()

    def _head(self) -> Request | None:
        """LAZY: the policy's next request, with up-to-date counters wherever it looks. A charge only moves a tenant
        back in the order (the smallest counter goes first), so charging just the tenants the policy picks, until
        it picks one that is up to date, gives its choice under every counter up to date."""
        peek, charged, step, tenants = self.ledger.policy.peek, self._charged, self.step, self._tenants
        while True:
            req = peek()
            if req is None or req.tenant not in tenants or charged[req.tenant] == step:
                return req
            self._charge(req.tenant)

    # ---- when an admission can succeed -------------------------------------------------------------------------
    def _when_admission_can_succeed(self, lo: int, first: int | None = None, hi: int | None = None) -> int:
        """After a try that stopped at a request that did not fit (`_refused`): the first step from `lo` on at which a
        try could admit something, while nothing happens (every event resets it). The policy's next request fits
        again at a step the reserve index computes (in paged mode, not before the pool grows); another request can
        only be first if the next one's tenant is charged past the others, and only fit where the smallest queued
        sizes fit (`first`: when the next request first fits, if known; `hi`: `_quiet_steps_cap()`, if known)."""
        if self._charging is Charging.EVERY_STEP or self._every_try:
            return lo  # NOTE: every step's charges count, as step by step; preemption and the cap are not forecast
        head = self._refused
        if head is None:
            return NEVER
        if hi is None:
            hi = self._quiet_steps_cap()
        smallest = None  # (first, last) step at which the smallest queued sizes fit, once looked up
        if first is None:
            if self._charging is Charging.LAZY:
                # NOTE: the smallest queued sizes fit no later than any queued request: where they never do (a full
                # pool), the next request's own search is not needed either
                smallest = self._first_fit_smallest(lo, hi)
                if smallest[0] == NEVER:
                    return NEVER
                first = self._first_fit(head, smallest[0], hi)
            else:
                first = self._first_fit(head, lo, hi)
        if self._charging is Charging.AT_END or head.tenant not in self._tenants:
            return first  # the order cannot change without an event
        some, last = smallest or self._first_fit_smallest(lo, min(first, hi))
        if some >= first:
            return first
        until = min(first, hi, last + 1) - 1  # someone else could fit at some step in [some, until]
        proven = self._first_through(head, until)
        return first if proven >= until else max(some, proven + 1)

    def _quiet_steps_cap(self) -> int:
        """The first step whose try follows an event: the next finish (a finish comes before the try at its step),
        or, paged, the step after the pool runs out (the try at that step comes before the preemption)."""
        cap = self._next_finish()
        if self._paged:
            n = len(self.running)
            cap = min(cap, self.step + (self._kv - self.kv_used - n) // n + 2)
        return cap

    def _first_fit(self, req: Request, lo: int, hi: int) -> int:
        """The first step in [lo, hi) at which `req` fits the batch as it is (NEVER if none)."""
        r: SimRequest = req  # type: ignore[assignment]  # NOTE: the engine's ledger holds only SimRequests (no cast call)
        need = r.prompt_tokens + self._extra + r.generated
        if need > self._prefill_max or len(self.running) >= self._running_max:
            return NEVER
        index = self._index
        if index is None:  # paged: it fits while the pool has room for it, which only shrinks
            free = self._kv - self.kv_used - len(self.running) * (lo - self.step)
            return lo if lo < hi and need + 1 <= free else NEVER
        tenants = self._tenants
        limit = self._kv - self._per_client * (len(tenants) + (r.tenant not in tenants))
        left = r.output_tokens - r.generated - 1
        if hi == lo + 1:  # one step: the plain check
            return lo if index.peak_with(need + 1, left, lo) < limit else NEVER
        g = index.first_fit(need + 1, left, limit, lo, hi)
        return NEVER if g is None else g

    def _first_fit_smallest(self, lo: int, hi: int) -> tuple[int, int]:
        """A request made of the smallest prefill and the fewest tokens to go among the queued ones fits no later
        than any queued request does: (the first step in [lo, hi) at which it fits, the last step it fits)."""
        sizes = self._queued.smallest()
        if sizes is None or sizes[0] > self._prefill_max or len(self.running) >= self._running_max:
            return NEVER, -1
        need, left = sizes
        if self._index is None:  # paged: it fits while the pool has room for it
            last = self.step + (self._kv - self.kv_used - need - 1) // len(self.running)
            return (lo if lo <= last and lo < hi else NEVER), last
        limit = self._kv - self._per_client * len(self._tenants)
        g = self._index.first_fit(need + 1, left, limit, lo, hi)
        return (NEVER if g is None else g), NEVER

    def _first_through(self, head: Request, until: int) -> int:
        """The last step up to `until` through which `head` provably stays the policy's next request."""
        if self.ledger.predictor is not None:  # bisection: the steps at which it does form an interval from now
            if self._first_at(head, until) is None:
                return until
            lo, hi = self.step, until
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if self._first_at(head, mid) is None:
                    lo = mid
                else:
                    hi = mid
            return lo
        while until > self.step:  # NOTE: linear counters: where the one picked instead overtook, then look again
            seen = self._first_at(head, until)
            if seen is None:
                return until
            until = self._overtaken(head, until, *seen) - 1
        return self.step

    def _first_at(self, head: Request, step: int) -> tuple[str, float, float, int] | None:
        """None if `head` is still the policy's next request at `step` (and so at every step from now to it), seen
        by charging ahead, then taking the charges back. Without a predictor every counter grows linearly, so two
        tenants in one order at both ends of the stretch are in it all along: the tenants the policy picks are
        charged up to `step` until it picks `head` or one charged already; for the one picked instead it returns
        (its tenant, its counter and head's at `step`, the step it was charged up to before). With a
        predictor only `head`'s tenant is charged ahead (the others only move back as they are charged, so that
        proves it too, less often)."""
        ahead: list[tuple[list[SimRequest], int]] = []
        accounts, charged = self.ledger.accounts, self._charged
        linear = self.ledger.predictor is None

        def forward(tenant: str) -> None:
            group, k = self._tenants[tenant], step - charged[tenant]
            self.ledger.outputs(group, k)
            ahead.append((group, k))

        try:
            forward(head.tenant)
            moved = {head.tenant}
            while True:
                req = self.ledger.peek()
                if req is head:
                    return None
                if req is None:
                    return ("", 0.0, 0.0, 0)
                t = req.tenant
                if linear and t in self._tenants and t not in moved:
                    forward(t)
                    moved.add(t)
                elif not linear and t in self._tenants and charged[t] != self.step:
                    self._charge(t)
                else:  # it goes first with its counter as it is
                    since = charged[t] if t in self._tenants else step
                    return (t, accounts[t].counter, accounts[head.tenant].counter, since)
        finally:
            for group, k in reversed(ahead):
                self.ledger.outputs(group, -k)

    def _overtaken(self, head: Request, at: int, tenant: str, counter: float, head_counter: float, since: int) -> int:
        """The first step after now at which `tenant` (its counter `counter` at step `at`, linear from the step
        `since` it is charged up to) may come before `head` (`head_counter` at `at`, linear from now): a tie
        counts, whatever the tie-break."""
        now = self.step
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


class QueuedSizes:
    """LAZY: the queued requests' prefill sizes and tokens to go, how many of each, and the smallest of each: O(1)
    but when the last of the smallest leaves. A request is counted as it is when it joins and when it leaves."""

    __slots__ = ("extra", "needs", "lefts", "need", "left")

    def __init__(self, extra: int) -> None:
        self.extra = extra  # the server's extra prompt tokens (EngineConfig.prompt_extra_tokens)
        self.needs: dict[int, int] = {}
        self.lefts: dict[int, int] = {}
        self.need = self.left = 0

    def add(self, r: SimRequest) -> None:
        g = r.generated
        need, left = r.prompt_tokens + self.extra + g, r.output_tokens - g - 1
        needs, lefts = self.needs, self.lefts
        if not needs:
            self.need, self.left = need, left
        else:
            if need < self.need:
                self.need = need
            if left < self.left:
                self.left = left
        needs[need] = needs.get(need, 0) + 1
        lefts[left] = lefts.get(left, 0) + 1

    def remove(self, r: SimRequest) -> None:
        g = r.generated
        need, left = r.prompt_tokens + self.extra + g, r.output_tokens - g - 1
        needs, lefts = self.needs, self.lefts
        k = needs[need] - 1
        if k:
            needs[need] = k
        else:
            del needs[need]
            if need == self.need and needs:
                self.need = min(needs)
        k = lefts[left] - 1
        if k:
            lefts[left] = k
        else:
            del lefts[left]
            if left == self.left and lefts:
                self.left = min(lefts)

    def smallest(self) -> tuple[int, int] | None:
        """(the smallest prefill, the fewest tokens to go) among the queued requests (None if none is queued)."""
        return (self.need, self.left) if self.needs else None
