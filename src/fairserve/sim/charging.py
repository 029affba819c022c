"""How the event engine (sim/engine.py) charges decoded tokens: one rule per way, chosen from the ledger.

A decision reads the counters, so they must be up to date then, and only then. Where every charge is an exact binary
fraction (`exact_charges`), sums do not depend on how charges are grouped, so a tenant's running requests are charged
in one `Ledger.outputs` call, when a decision looks at that tenant (`ChargeLazily`); otherwise every request is
charged before every decision, in the step-by-step loop's order, so that every float is the same
(`ChargeEveryStep`); orders that ignore charges are charged at finish (`ChargeAtEnd`). Each rule also names the
admission forecast that holds under it (sim/forecast.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING

from ..core.account import SEP, Account
from ..core.cost import LinearCost
from ..core.ledger import Ledger
from ..core.request import Request
from .forecast import EveryTry, FitForecast, OrderForecast

if TYPE_CHECKING:
    from .batch import Batch
    from .forecast import Forecast
    from .memory import Memory
    from .requests import SimRequest


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
    policy picks would not give its choice (`ChargeLazily.head`)."""
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


def charging_rule(ledger: Ledger, batch: Batch, extra: int) -> ChargeAtEnd:
    """The rule for this ledger's policy, cost and tenants."""
    if not ledger.policy.capabilities.orders_by_counter:
        return ChargeAtEnd(ledger, batch)
    return ChargeLazily(ledger, batch, extra) if exact_charges(ledger) else ChargeEveryStep(ledger, batch)


class ChargeAtEnd:
    """The order ignores charges: a request is charged at its finish, cancel or preemption (and by `sync`)."""

    mode = Charging.AT_END
    lazy = False  # a tenant's running requests are charged at once, when a decision reads them

    def __init__(self, ledger: Ledger, batch: Batch) -> None:
        self.ledger, self.batch = ledger, batch

    def forecast(self, memory: Memory, every_try: bool) -> Forecast:
        """The admission forecast that holds under this rule (`every_try`: preemption, the cap or the prefix cache
        decide each try)."""
        return EveryTry(self.first) if every_try else FitForecast(memory)

    def sync(self) -> None:
        """Charge every running request for the tokens decoded since its last charge, in admission order."""
        step, output = self.batch.step, self.ledger.output
        for r in self.batch.running:
            n = r.generated + step - r.step_base - r.output_done
            if n:
                output(r, n)

    def first(self) -> Request | None:
        """The policy's next request, with the counters it reads up to date."""
        return self.ledger.policy.peek()

    def round(self) -> tuple[Callable[[], Request | None], Callable[[Request], object]]:
        """An admission round starts: (the policy's next request, take it from the queue)."""
        return self.ledger.policy.peek, self.ledger.pop

    def arriving(self, req: SimRequest, acct: Account | None, was_backlogged: bool) -> ChargeAtEnd:
        """`req` is about to join the ledger (`acct`: its tenant's account, if any): the rule from now on."""
        return self

    def may_go_first(self, req: SimRequest, was_backlogged: bool) -> bool:
        """`req` just joined the queue: is it the policy's next request?"""
        return self.ledger.policy.peek() is req

    def queued(self, r: SimRequest) -> None:
        """`r` joined the queue (arrived, or preempted)."""

    def dequeued(self, r: SimRequest) -> None:
        """`r` left the queue without running (cancelled)."""

    def started(self, r: SimRequest, group: list[SimRequest] | None) -> None:
        """`r` starts running, after its prefill (`group`: its tenant's running requests, if any)."""

    def tenant_left(self, tenant: str) -> None:
        """`tenant`'s last running request stopped."""


class ChargeEveryStep(ChargeAtEnd):
    """Charges are not exact in floating point: every running request is charged before every decision, in the
    step-by-step order, so that every float is the step-by-step loop's. No try is forecast."""

    mode = Charging.EVERY_STEP

    def forecast(self, memory: Memory, every_try: bool) -> Forecast:
        return EveryTry(None)  # NOTE: every step's charges count, as step by step

    def round(self) -> tuple[Callable[[], Request | None], Callable[[Request], object]]:
        self.sync()
        return self.ledger.policy.peek, self.ledger.pop

    def arriving(self, req: SimRequest, acct: Account | None, was_backlogged: bool) -> ChargeAtEnd:
        if self.batch.running:
            self.sync()
        return self


class ChargeLazily(ChargeAtEnd):
    """Charges are exact in floating point: a tenant's running requests are charged in one charge, up to the step,
    when a decision looks at that tenant (`charged`: the step up to which each running tenant is charged). The queued
    requests' sizes are kept (`QueuedSizes`) for the forecast."""

    mode = Charging.LAZY
    lazy = True

    def __init__(self, ledger: Ledger, batch: Batch, extra: int) -> None:
        super().__init__(ledger, batch)
        self.lifts = ledger.policy.capabilities.lifts
        self.charged: dict[str, int] = {}
        self.sizes = QueuedSizes(extra)

    def forecast(self, memory: Memory, every_try: bool) -> Forecast:
        return EveryTry(self.first) if every_try else OrderForecast(memory, self)

    def sync(self) -> None:
        for tenant in self.batch.tenants:
            self.charge(tenant)

    def charge(self, tenant: str) -> None:
        """Charge `tenant`'s running requests up to this step, in one charge."""
        step = self.batch.step
        behind = step - self.charged.get(tenant, step)  # 0 for a tenant with nothing running
        if behind:
            self.ledger.outputs(self.batch.tenants[tenant], behind)
            self.charged[tenant] = step

    def first(self) -> Request | None:
        return self.head()

    def head(self) -> Request | None:
        """The policy's next request, with up-to-date counters wherever it looks. A charge only moves a tenant back
        in the order (the smallest counter goes first), so charging just the tenants the policy picks, until it
        picks one that is up to date, gives its choice under every counter up to date."""
        peek, charged, step, tenants = self.ledger.policy.peek, self.charged, self.batch.step, self.batch.tenants
        while True:
            req = peek()
            if req is None or req.tenant not in tenants or charged[req.tenant] == step:
                return req
            self.charge(req.tenant)

    def round(self) -> tuple[Callable[[], Request | None], Callable[[Request], object]]:
        return self.head, self.pop

    def pop(self, req: Request) -> None:
        self.ledger.pop(req)
        self.sizes.remove(req)  # type: ignore[arg-type]  # NOTE: the engine's ledger holds only SimRequests

    def arriving(self, req: SimRequest, acct: Account | None, was_backlogged: bool) -> ChargeAtEnd:
        if acct is None and SEP in req.tenant:
            self.sync()  # NOTE: the first tenant in a group: lazy charges no longer give the policy's choice
            return ChargeEveryStep(self.ledger, self.batch).arriving(req, acct, was_backlogged)
        if self.lifts and not was_backlogged:
            self.head()  # the lift reads the smallest backlogged counter and this tenant's own
            self.charge(req.tenant)
        return self

    def may_go_first(self, req: SimRequest, was_backlogged: bool) -> bool:
        # NOTE: one level of flat tenants: a request behind its tenant's queued ones is not first
        return not was_backlogged

    def queued(self, r: SimRequest) -> None:
        self.sizes.add(r)

    def dequeued(self, r: SimRequest) -> None:
        self.sizes.remove(r)

    def started(self, r: SimRequest, group: list[SimRequest] | None) -> None:
        if group:
            self.charge(r.tenant)
        self.charged[r.tenant] = self.batch.step
        self.ledger.output(r, r.generated - r.output_done)  # its first token: now its tenant is up to date

    def tenant_left(self, tenant: str) -> None:
        self.charged.pop(tenant, None)


class QueuedSizes:
    """The queued requests' prefill sizes and tokens to go, how many of each, and the smallest of each: O(1) but when
    the last of the smallest leaves. A request is counted as it is when it joins and when it leaves."""

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
