"""The paper's two suggestions for a tighter bound (§C.3), as engine rules: fairness-triggered preemption and the
per-tenant running-memory cap. See docs/preemption.md.

- **Preemption** (`EngineConfig.preempt_delta`, the spec option `preempt=DELTA`): when an admission try admits nothing
  because the policy's next request does not fit, and some running tenant's counter exceeds that request's tenant's by
  more than DELTA, the engine preempts running requests of such tenants (the highest counter first, newest first
  within a counter), as few as make the waiting request fit, and only if it then fits; then it admits. Preemption is
  by recompute: a preempted request gives back its KV cache, goes back to the front of its tenant's queue
  (`Ledger.requeue`: the charges for its tokens stand, the recompute is not charged) and re-prefills its prompt and
  the tokens it had. A request is preempted for fairness at most `preempt_max` times (the anti-thrash rule).
- **The cap** (`EngineConfig.running_cap`, `running-cap=TOKENS`): a tenant's running requests may reserve at most
  TOKENS of the pool (prompt + max_tokens each); a tenant with nothing running may always start one. Admission
  follows the policy's order strictly, so a capped tenant's next request stops the round as a request that does not
  fit does.

The rule that picks the victims, `fair_victims`, is the core's (core/preemption.py): the vLLM plugin runs it too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from operator import attrgetter
from typing import TYPE_CHECKING, cast

from ..core.ledger import Ledger
from ..core.preemption import fair_victims, priority_victims

if TYPE_CHECKING:
    from .batch import Batch
    from .budget import Budget
    from .memory import PagedMemory, ReserveMemory
    from .requests import EngineConfig, SimRequest

Check = Callable[["Budget"], Callable[["SimRequest"], bool]]  # an admission round's check, from its budget

budget_check: Check = attrgetter("try_add")  # no cap: the budget's own


def preemption_rules(
    cfg: EngineConfig,
    ledger: Ledger,
    batch: Batch,
    memory: ReserveMemory | PagedMemory,
    sync: Callable[[], None],
    preempt: Callable[[SimRequest], None],
) -> tuple[Check, NoPreemption]:
    """The admission check of a round (under the cap, `running-cap=`, if any) and the preemption rule (`preempt=`)
    that `cfg` names; `sync` brings the counters up to date, `preempt` evicts a running request (the engine's)."""
    extra = cfg.prompt_extra_tokens
    check: Check = budget_check if cfg.running_cap is None else RunningCap(cfg.running_cap, batch.tenants, extra)
    rules: list[NoPreemption] = []
    if cfg.preempt_priority:
        rules.append(PriorityPreemption(ledger, batch, memory, cfg.preempt_max, check, sync, preempt))
    if cfg.preempt_delta is not None:
        if not ledger.policy.capabilities.shares_counters:
            raise ValueError(f"preemption compares tenants' counters: policy {ledger.policy.name!r} keeps none")
        rules.append(FairPreemption(ledger, batch, memory, cfg.preempt_max, check, sync, preempt, cfg.preempt_delta))
    return check, rules[0] if len(rules) == 1 else Preemptions(rules) if rules else NoPreemption()


class Capped:
    """An admission check (`fits(req)`) behind the per-tenant cap on reserved running memory, for one round."""

    __slots__ = ("fits", "cap", "extra", "held")

    def __init__(
        self, fits: Callable[[SimRequest], bool], cap: int, running: Mapping[str, Iterable[SimRequest]], extra: int
    ) -> None:
        self.fits, self.cap, self.extra = fits, cap, extra
        self.held = {t: sum(r.prompt_tokens + extra + r.output_tokens for r in rs) for t, rs in running.items()}

    def __call__(self, req: SimRequest) -> bool:
        held = self.held.get(req.tenant, 0)
        tokens = req.prompt_tokens + self.extra + req.output_tokens
        if held and held + tokens > self.cap:
            return False
        if not self.fits(req):
            return False
        self.held[req.tenant] = held + tokens
        return True


class RunningCap:
    """The admission check of a round under the cap (`running-cap=TOKENS`): `Capped` over the round's budget, with
    what each tenant's running requests reserve now."""

    __slots__ = ("cap", "tenants", "extra")

    def __init__(self, cap: int, tenants: Mapping[str, Iterable[SimRequest]], extra: int) -> None:
        self.cap, self.tenants, self.extra = cap, tenants, extra

    def __call__(self, budget: Budget) -> Callable[[SimRequest], bool]:
        return Capped(budget.try_add, self.cap, self.tenants, self.extra)


class NoPreemption:
    """No preemption for fairness: a refused request waits."""

    count = 0  # requests preempted for fairness

    def preempt(self) -> bool:
        """An admission round stopped at the policy's next request: preempt for it; True if any was."""
        return False


class Preempting(NoPreemption):
    """A rule that preempts the running requests `victims` picks for the policy's next request, as the batch
    `memory` has it less them, through the round's `check`. `sync` brings the counters up to date; `preempt` is the
    engine's evict-and-recompute; a request is preempted `preempt_max` times at most; `delta`: fairness's gap."""

    def __init__(
        self,
        ledger: Ledger,
        batch: Batch,
        memory: ReserveMemory | PagedMemory,
        preempt_max: int,
        check: Check,
        sync: Callable[[], None],
        preempt: Callable[[SimRequest], None],
        delta: float = 0.0,
    ) -> None:
        self.ledger, self.batch, self.memory, self.delta = ledger, batch, memory, delta
        self.preempt_max, self.check = preempt_max, check
        self.sync, self.evict = sync, preempt
        # NOTE: an order that ignores charges is charged at the end (sim/charging.py): a sync here would split them
        self.reads_counters = ledger.policy.capabilities.orders_by_counter
        self.count = 0

    def preempt(self) -> bool:
        if not self.batch.running:
            return False
        if self.reads_counters:
            self.sync()
        head = cast("SimRequest | None", self.ledger.peek())  # NOTE: the engine's ledger holds only SimRequests
        assert head is not None
        victims = self.victims(head)
        for r in victims:
            r.fair_preemptions += 1
            self.count += 1
            self.evict(r)
        return bool(victims)

    def victims(self, head: SimRequest) -> list[SimRequest]:
        raise NotImplementedError

    def _fits(self, req: SimRequest, without: list[SimRequest]) -> bool:
        """Would `req` be admitted into the batch as it is, less the requests `without`?"""
        return self.check(self.memory.budget_without(without))(req)


class FairPreemption(Preempting):
    """Fairness-triggered preemption (`preempt=DELTA`): the running requests `fair_victims` picks."""

    def victims(self, head: SimRequest) -> list[SimRequest]:
        return fair_victims(head, self.batch.running, self.ledger.accounts, self.delta, self.preempt_max, self._fits)


class PriorityPreemption(Preempting):
    """Priority that preempts (`preempt-priority=1`): the running requests of worse levels than the policy's next
    request that `priority_victims` picks (the worst level, the highest counter, the newest first; never an equal
    level)."""

    def victims(self, head: SimRequest) -> list[SimRequest]:
        return priority_victims(head, self.batch.running, self.ledger.accounts, self.preempt_max, self._fits)


class Preemptions(NoPreemption):
    """Several rules in turn (priority first, then fairness): the first that preempts wins the round."""

    def __init__(self, rules: list[NoPreemption]) -> None:
        self.rules = rules

    @property
    def count(self) -> int:  # type: ignore[override]
        return sum(r.count for r in self.rules)

    def preempt(self) -> bool:
        return any(r.preempt() for r in self.rules)
