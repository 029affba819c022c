"""The one policy interface every driver (simulator, gateway, real engines) uses.

A driver tells the policy what happens to requests; the policy decides admission *order* and charges the tenants'
accounts (`core.ledger.Account`: the one place per-tenant state lives). Capacity is the driver's business:
`admit(fits)` asks the driver's callback. Drivers that track requests by id go through `core.ledger.Ledger`.

    arrive ──add()──> queued ──pop()/admit()──> running ──finish()/abort()──> done
                        ^                          │
                        └────────requeue()─────────┘   (preempted: keeps its charges, no lift)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from .cost import CostFunction, LinearCost
from .ledger import Account, Unsupported
from .predictor import Predictor
from .request import Request, RequestState

QUEUED, RUNNING = RequestState.QUEUED, RequestState.RUNNING


class PolicyError(RuntimeError):
    """The driver broke the protocol (e.g. finished a request that was never admitted)."""


class Policy(ABC):
    """Base class: request life cycle, per-tenant counts and charging. Subclasses implement the queue (`_enqueue`,
    `peek`, `_dequeue`, `_remove`) and may react to charges (`_on_charge`) to keep virtual counters."""

    name = "policy"
    orders_by_counter = True  # False: admission order ignores charges, so drivers need not report them eagerly
    uses_weights = True  # False: weights are shown but do not change the order (FCFS, RPM)
    retry_after_s = 1.0  # what a client refused by `add()` is told to wait (rate limits: their window)

    def __init__(
        self,
        cost: CostFunction | None = None,
        weights: dict[str, float] | None = None,
        predictor: Predictor | None = None,
    ) -> None:
        self.cost = cost if cost is not None else LinearCost()
        # NOTE: the linear cost's per-token price, so the hottest call skips a method call
        self._w_q = self.cost.w_q if type(self.cost) is LinearCost else None
        self.predictor = predictor
        self.accounts: dict[str, Account] = {}
        for client, w in (weights or {}).items():
            self.set_weight(client, w)
        self.num_queued = 0
        self._seq = 0

    def account(self, client: str) -> Account:
        """`client`'s account, opened on first sight."""
        acct = self.accounts.get(client)
        if acct is None:
            acct = self.accounts[client] = Account(client, rank=len(self.accounts))
            self._new_client(acct)
        return acct

    # ---- arrivals -----------------------------------------------------------------------------------------------
    def add(self, req: Request, now: float | None = None) -> bool:
        """A request arrives. Returns False if the policy rejects it (only rate-limiting policies do)."""
        acct = req.account = self.account(req.client)
        if not self._accept(req, req.arrival_s if now is None else now):
            req.state = RequestState.REJECTED
            return False
        self._seq += 1
        req.seq = self._seq
        self._enqueue(req, front=False)  # NOTE: before the count changes: the lift looks at who else is queued
        req.state = QUEUED
        acct.queued += 1
        self.num_queued += 1
        return True

    # ---- admission ----------------------------------------------------------------------------------------------
    @abstractmethod
    def peek(self) -> Request | None:
        """The request the policy would admit next, or None if nothing is queued."""

    def pop(self) -> Request:
        """Admit the request `peek()` returned: it starts running and is charged its admission cost."""
        req = self.peek()
        if req is None:
            raise PolicyError("pop() with nothing queued")
        self._dequeue(req)
        self.num_queued -= 1
        acct = req.account
        acct.queued -= 1
        acct.running += 1
        req.state = RUNNING
        req.admission = 0.0
        if not req.admitted:  # NOTE: a preempted request re-prefills, but it was charged already
            req.admitted = True
            amount = self.cost.prompt(req.prompt_tokens)
            if self.predictor is not None:
                req.predicted = self.predictor.predict(req)
                amount += self.cost.output(req.prompt_tokens, 0, req.predicted)
            req.admission = amount
            self._charge(req, amount)
        return req

    def unpop(self, req: Request) -> None:
        """Undo the `pop()` of `req`: the engine did not schedule it after all (vLLM skips a request it popped when
        its grammar is not ready or no LoRA slot is free). Back to the front of its queue as if never popped: the
        admission charge refunded, no lift; the next `pop()` charges it again. After a re-admission (a preempted
        request) this is `requeue()`."""
        if req.state is not RUNNING:
            raise PolicyError(f"unpop() of request {req.id!r} in state {req.state.value}")
        if req.admission:
            self._charge(req, -req.admission)
            req.admission, req.admitted, req.predicted = 0.0, False, 0
        self.requeue(req)

    def admit(self, fits: Callable[[Request], bool], limit: int | None = None) -> list[Request]:
        """Pop requests in policy order while the driver's `fits(req)` accepts them (it should account for each
        accepted request itself). Stops at the first that does not fit: the policy's order is strict."""
        out: list[Request] = []
        while limit is None or len(out) < limit:
            req = self.peek()
            if req is None or not fits(req):
                break
            out.append(self.pop())
        return out

    # ---- progress -----------------------------------------------------------------------------------------------
    def on_output(self, req: Request, tokens: int = 1) -> None:
        """`tokens` more output tokens were decoded for `req`. Only tokens beyond a prediction are charged."""
        y0 = req.output_done
        y1 = req.output_done = y0 + tokens
        p = req.predicted
        if y1 > p:  # NOTE: `_charge` inlined: this is the simulator's hottest call
            w_q = self._w_q
            amount = (
                w_q * (y1 - (y0 if y0 > p else p))
                if w_q is not None
                else self.cost.output(req.prompt_tokens, y0 if y0 > p else p, y1)
            )
            req.charged += amount
            acct = req.account
            acct.service += amount
            self._on_charge(acct, amount)

    def on_prompt(self, req: Request, prompt_tokens: int) -> None:
        """The driver learned the true prompt size (a backend's `usage`, a session's next turn): the difference is
        charged, or refunded."""
        if prompt_tokens != req.prompt_tokens:
            old = self._expected(req)
            req.prompt_tokens = prompt_tokens
            if req.admitted:
                self._charge(req, self._expected(req) - old)

    def _expected(self, req: Request) -> float:
        return self.cost.total(req.prompt_tokens, max(req.output_done, req.predicted)) if req.admitted else 0.0

    # ---- endings ------------------------------------------------------------------------------------------------
    def finish(self, req: Request, output_tokens: int | None = None, prompt_tokens: int | None = None) -> None:
        """`req` finished. With `output_tokens` / `prompt_tokens` (e.g. the final `usage`) the account is reconciled
        to them; any predicted output that was not produced is refunded."""
        if req.state is not RUNNING:
            raise PolicyError(f"finish() of request {req.id!r} in state {req.state.value}")
        self._close(req, output_tokens, prompt_tokens)
        req.account.running -= 1
        req.state = RequestState.FINISHED
        if self.predictor is not None:
            self.predictor.observe(req, req.output_done)

    def abort(self, req: Request, output_tokens: int | None = None, prompt_tokens: int | None = None) -> None:
        """Cancel `req`: dropped from the queue if queued; if it was ever admitted, charged only for what it got:
        `prompt_tokens` processed (default: its whole prompt) and `output_tokens` produced (default: what was
        reported). `abort(req, 0, 0)` refunds everything."""
        if req.state is QUEUED:
            self._remove(req)
            self.num_queued -= 1
            req.account.queued -= 1
        elif req.state is RUNNING:
            req.account.running -= 1
        else:
            return
        if req.admitted:
            self._close(req, output_tokens, prompt_tokens)
        req.state = RequestState.ABORTED

    def requeue(self, req: Request) -> None:
        """The engine preempted `req` (e.g. evict-and-recompute): back to the front of its queue. Its charges stand,
        it is not charged again when re-admitted, and it is not a new arrival (no counter lift)."""
        if req.state is not RUNNING:
            raise PolicyError(f"requeue() of request {req.id!r} in state {req.state.value}")
        self._enqueue(req, front=True)
        req.state = QUEUED
        acct = req.account
        acct.running -= 1
        acct.queued += 1
        self.num_queued += 1

    def _close(self, req: Request, output_tokens: int | None, prompt_tokens: int | None) -> None:
        if output_tokens is not None:
            req.output_done = output_tokens
        if prompt_tokens is not None:
            req.prompt_tokens = prompt_tokens
        delta = self.cost.total(req.prompt_tokens, req.output_done) - req.charged
        if delta:
            self._charge(req, delta)

    # ---- accounts -----------------------------------------------------------------------------------------------
    def _charge(self, req: Request, amount: float) -> None:
        req.charged += amount
        acct = req.account
        acct.service += amount
        self._on_charge(acct, amount)

    def set_weight(self, client: str, weight: float) -> None:
        if not weight > 0:
            raise ValueError(f"weight of {client!r} must be > 0, got {weight}")
        self.account(client).weight = float(weight)

    def weight(self, client: str) -> float:
        acct = self.accounts.get(client)
        return acct.weight if acct is not None else 1.0

    @property
    def weights(self) -> dict[str, float]:
        return {c: a.weight for c, a in self.accounts.items()}

    @property
    def service(self) -> dict[str, float]:
        """Cost charged per client (not divided by weight), read-only."""
        return {c: a.service for c, a in self.accounts.items()}

    def counter_of(self, client: str) -> float:
        """`client`'s virtual counter; for policies without counters, the service it received."""
        acct = self.accounts.get(client)
        return acct.service if acct is not None else 0.0

    @property
    def counters(self) -> dict[str, float]:
        return {c: self.counter_of(c) for c in self.accounts}

    def queued_clients(self) -> list[str]:
        """Clients with at least one queued request (the paper's 'backlogged' clients). O(clients)."""
        return [c for c, a in self.accounts.items() if a.queued]

    def set_counter(self, client: str, counter: float) -> None:
        """Set `client`'s virtual counter to a value computed elsewhere (another process sharing the counters:
        gateway/shared_state.py). Unsupported without counters."""
        raise Unsupported(f"policy {self.name!r} keeps no counters: there is nothing to set")

    def reset_counters(self) -> None:
        """Every client's counter back to 0 (service received stays). Unsupported without counters."""
        raise Unsupported(f"policy {self.name!r} keeps no counters: there is nothing to reset")

    # ---- hooks for subclasses -----------------------------------------------------------------------------------
    def _new_client(self, acct: Account) -> None:
        pass

    def _accept(self, req: Request, now: float) -> bool:
        return True

    def _on_charge(self, acct: Account, amount: float) -> None:
        pass

    @abstractmethod
    def _enqueue(self, req: Request, front: bool) -> None: ...

    @abstractmethod
    def _dequeue(self, req: Request) -> None:
        """Remove `req`, which `peek()` just returned."""

    @abstractmethod
    def _remove(self, req: Request) -> None:
        """Remove a queued request from anywhere in the queue."""
