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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, cast

from ..core.account import Account
from ..core.ledger import Ledger
from .budget import PagedBudget, ReserveBudget, ReserveIndex

if TYPE_CHECKING:
    from .requests import EngineConfig, SimRequest


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


def fair_victims(
    head: SimRequest,
    running: Iterable[SimRequest],
    accounts: Mapping[str, Account],
    delta: float,
    preempt_max: int,
    fits: Callable[[SimRequest, list[SimRequest]], bool],
) -> list[SimRequest]:
    """The running requests to preempt so that `head` (the policy's next request, which did not fit) is admitted:
    requests of tenants whose counter exceeds head's tenant's by more than `delta`, not yet preempted `preempt_max`
    times, the highest counter first and the newest first within one counter, as few as make `fits(head, victims)`
    true. Empty if even all of them would not make it fit (removing running requests never makes a fit fail)."""
    floor = accounts[head.tenant].counter + delta
    candidates = [
        r
        for r in reversed(list(running))  # admission order: the newest first
        if r.tenant != head.tenant and accounts[r.tenant].counter > floor and r.fair_preemptions < preempt_max
    ]
    if not candidates or not fits(head, candidates):
        return []
    candidates.sort(key=lambda r: -accounts[r.tenant].counter)  # NOTE: stable: the newest first within a counter
    for n in range(1, len(candidates)):
        if fits(head, candidates[:n]):
            return candidates[:n]
    return candidates


class Preemption:
    """Fairness-triggered preemption in `SimEngine` (a mixin: the engine holds the state it reads)."""

    ledger: Ledger
    config: EngineConfig
    step: int
    kv_used: int
    running: dict[SimRequest, None]
    fair_preemptions: int
    _tenants: dict[str, list[SimRequest]]
    _index: ReserveIndex | None
    _delta: float | None
    _cap: int | None
    _extra: int
    _per_client: int

    if TYPE_CHECKING:  # the engine's

        def _sync(self) -> None: ...

        def _preempt(self, r: SimRequest) -> None: ...

    def _fair_preempt(self) -> bool:
        """The policy's next request was refused: preempt the running requests `fair_victims` picks, if any."""
        self._sync()
        head = cast("SimRequest | None", self.ledger.peek())  # NOTE: the engine's ledger holds only SimRequests
        assert head is not None and self._delta is not None
        victims = fair_victims(
            head, self.running, self.ledger.accounts, self._delta, self.config.preempt_max, self._fits
        )
        for r in victims:
            r.fair_preemptions += 1
            self.fair_preemptions += 1
            self._preempt(r)
        return bool(victims)

    def _fits(self, req: SimRequest, without: list[SimRequest]) -> bool:
        """Would `req` be admitted into the batch as it is, less the requests `without`?"""
        cfg, gone = self.config, set(without)
        rest = [r for r in self.running if r not in gone]
        budget: ReserveBudget | PagedBudget
        if self._index is not None:
            index = ReserveIndex((r.end_step, r.prompt_tokens + self._extra + r.output_tokens) for r in rest)
            tenants = {r.tenant for r in rest}
            budget = ReserveBudget(
                index,
                self.step,
                cfg.kv_tokens,
                cfg.prefill_tokens,
                cfg.running_max,
                self._extra,
                self._per_client,
                tenants,
            )
        else:
            freed = sum(r.prompt_tokens + self._extra + r.generated_at(self.step) for r in without)
            budget = PagedBudget(
                self.kv_used - freed, len(rest), cfg.kv_tokens, cfg.prefill_tokens, cfg.running_max, self._extra
            )
        if self._cap is None:
            return budget.try_add(req)
        return Capped(budget.try_add, self._cap, self._tenants, self._extra)(req)
