"""Deficit longest prefix match (DLPM, Cao et al. 2025, arXiv 2501.14312): locality within a fairness budget.

Every backlogged tenant has a deficit, the service it may still consume. Among the waiting requests whose tenant's
deficit is positive, the one with the most prompt tokens in the prefix cache is admitted (ties: arrival order); its
service is taken from its tenant's deficit (the prompt at admission, output tokens as they are decoded; a deficit
may go negative). When no waiting request's tenant has a positive deficit, every backlogged tenant's deficit grows by
the quantum, as many times as it takes for one to be positive. A tenant that becomes backlogged again keeps its debt
but no more than one quantum of credit (idle tenants hoard nothing); a new tenant starts with one quantum.

The bound (docs/architecture.md, "DLPM's bound"): two tenants continuously backlogged over an interval get the same
quanta in it, and a backlogged tenant's deficit stays within [-(w_p·L_in + w_q·M), Q], so their service differs by at
most 2·(Q + w_p·L_in + w_q·M) (divided by the smaller weight, with weights). As Q shrinks, DLPM approaches VTC; as
it grows, LPM.

The quantum, when the spec gives none (`dlpm` as typed), is derived: QUANTUM_REQUESTS times the largest request cost
seen so far (w_p·prompt + w_q·max_tokens with the linear cost), growing as larger requests arrive. A quantum below one
request's cost makes DLPM round-robin, a new tenant's prefix evicted before its second request, and the locality gain
is gone; a few requests' worth lets a tenant run several while its prefix is cached, whatever the prompt size, and the
bound (with Q the largest quantum used) stays a few requests' service.

The deficits live here, by tenant (as DRR's ring position does): O(tenants) per refill, and a `peek` reads the cached
prefix of every waiting request of the tenants in credit (`lpm.longest_cached`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

from .account import Account
from .cost import CostFunction
from .lpm import cached_of, longest_cached
from .policy import Capabilities, Policy
from .registry import number, register
from .request import Request

QUANTUM_REQUESTS = 6  # the derived quantum: this many of the largest requests' service (docs/architecture.md)


class DLPM(Policy):
    name = "dlpm"
    capabilities = Capabilities(orders_by_counter=True, uses_weights=True, keeps_counters=True, uses_prefix_cache=True)

    def __init__(self, quantum: float | None = None, cost: CostFunction | None = None) -> None:
        super().__init__(cost)
        self.derived = quantum is None  # the quantum follows the largest request seen
        self.quantum = 0.0 if quantum is None else _quantum(quantum)
        self.name = "dlpm" if quantum is None else f"dlpm{quantum:g}"
        self._queues: dict[str, deque[Request]] = {}  # the backlogged tenants' queues, in the order they joined
        self._deficit: dict[str, float] = {}
        self.refills = 0  # rounds of quanta given (for tests and reports)

    def deficit(self, acct: Account) -> float:
        return self._deficit.get(acct.tenant, self.quantum)

    def counter_of(self, acct: Account) -> float:
        """The deficit, negated: service consumed beyond the quanta received."""
        return -self.deficit(acct)

    def enqueue(self, req: Request, front: bool) -> None:
        if self.derived:  # NOTE: before the tenant's first quantum is given
            size = self.cost.total(req.prompt_tokens, req.max_tokens if req.max_tokens is not None else 1)
            self.quantum = max(self.quantum, QUANTUM_REQUESTS * size, 1.0)
        tenant = req.account.tenant
        q = self._queues.get(tenant)
        if q is None:  # becomes backlogged: no hoarded credit
            q = self._queues[tenant] = deque()
            self._deficit[tenant] = min(self._deficit.get(tenant, self.quantum), self.quantum)
        q.append(req)  # NOTE: put back or not, a tenant's requests are told apart by cache, then arrival (`seq`)

    def _in_credit(self) -> Iterator[Request]:
        deficit = self._deficit
        for tenant, q in self._queues.items():
            if deficit[tenant] > 0:
                yield from q

    def _refill(self) -> None:
        """No backlogged tenant has credit: every one gets quanta, the fewest rounds that give one of them credit."""
        q, deficit = self.quantum, self._deficit
        rounds = min(int(-deficit[t] // q) + 1 for t in self._queues)
        for t in self._queues:
            deficit[t] += rounds * q
        self.refills += rounds

    def peek(self) -> Request | None:
        if not self._queues:
            return None
        cached = cached_of(self)
        best = longest_cached(self._in_credit(), cached)
        if best is None:
            self._refill()
            best = longest_cached(self._in_credit(), cached)
        return best

    def dequeue(self, req: Request) -> None:
        self.remove(req)

    def remove(self, req: Request) -> None:
        tenant = req.account.tenant
        q = self._queues[tenant]
        q.remove(req)
        if not q:
            del self._queues[tenant]

    def on_charge(self, acct: Account, amount: float) -> None:
        self._deficit[acct.tenant] = self.deficit(acct) - amount / acct.weight

    def reset_counters(self, accounts: Iterable[Account]) -> None:
        """Every deficit back to 0: debts and credits are forgotten."""
        for acct in accounts:
            self._deficit[acct.tenant] = 0.0


def _quantum(quantum: float) -> float:
    if not quantum > 0:
        raise ValueError(f"dlpm quantum must be > 0, got {quantum}")
    return quantum


register(
    "dlpm",
    DLPM,
    "deficit longest prefix match (Cao et al. 2025): longest cached prefix among tenants in credit, quantum Q "
    f"(default: {QUANTUM_REQUESTS} times the largest request's service; prefix cache only)",
    argument="QUANTUM",
    parse=lambda text: _quantum(number(float)(text)),
    build=lambda quantum, cost, seed: DLPM(quantum, cost=cost),
    optional=True,  # NOTE: left out, the quantum is derived from the requests (QUANTUM_REQUESTS)
)
