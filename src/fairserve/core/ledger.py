"""The ledger: per-tenant state, owned once, and the one way into the core for every driver.

Two tables live here and nowhere else:
- `Account`s, one per tenant and per group above it: weight, service received, the policy's virtual counter, queued
  and running requests. The ledger is a `TenantTree` (`core/tree.py`: the accounts, opened on first sight); only the
  ledger's life-cycle methods write the counts, so they cannot drift from the queues they count.
- the requests not yet settled, by id, each carrying the driver's own object (`Request.item`): a gateway ticket, an
  engine's request state, or the simulator's request itself.

A driver calls `arrive`/`add` → `admit`/`pop` → `output`/`prompt` (→ `requeue`/`unpop`) → `settle`, the one way a
request ends (exactly once; a refund is `settle(..., prompt=0, output=0, cancelled=True)`). The ledger charges
(prompt at admission, output as decoded, through the policy's cost function; every charge through `_charge`, which
walks the groups) and lifts counters (the paper's lift, with `Peers` for a floor from other processes); the policy
only orders. Observers hear of each change through the one seam, `listen` (core/listener.py). What concerns the
accounts alone it has from `TenantTree` (core/tree.py): configuration (`set_node`), admin changes (`set_weight`,
`reset`, `apply_remote`, the same for every policy or `Unsupported`), the reads by tenant and `view()`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from . import charges
from .account import Account
from .listener import Listener, Listeners
from .policy import Policy, PolicyError
from .request import Request, RequestState
from .tree import TenantTree

QUEUED, RUNNING = RequestState.QUEUED, RequestState.RUNNING


class Peers(Protocol):
    """Other processes sharing the counters (gateway/shared/state.py), plugged in by `Ledger(..., peers=)`."""

    def attach(self, ledger: Ledger) -> None:
        """The ledger whose counters are shared (ValueError if its policy cannot share them)."""
        ...

    def lift_floor(self, acct: Account, local_floor: float | None) -> float | None:
        """The floor `acct` (a tenant or a group) is lifted to, given the smallest counter among its siblings queued
        here: the smallest among its siblings queued anywhere, as far as this process knows it now."""
        ...


class Ledger(TenantTree):
    """Requests by id and the accounts they are charged to, over one policy. Not thread-safe by itself: engines
    that call it from a scheduling thread wrap it in a lock (`engines.queue.EngineQueue`)."""

    def __init__(
        self,
        policy: Policy,
        tenants: Iterable[str] = (),
        weights: Mapping[str, float] | None = None,
        peers: Peers | None = None,
        priorities: Mapping[str, int] | None = None,
        allowed: Mapping[str, Iterable[int]] | None = None,
    ) -> None:
        super().__init__(policy, tenants, weights, priorities, allowed)
        self.cost = policy.cost
        self.predictor = policy.predictor
        caps = policy.capabilities
        self.num_queued = 0  # requests waiting for admission, over all tenants
        self.peers = peers
        self._requests: dict[Any, Request] = {}
        self._seq = 0
        self._lifts = caps.lifts
        self._on_charge = policy.on_charge if caps.orders_by_counter else None
        self._listener: Listener | None = None  # the observers (`listen`); None: no call on the hot path
        # NOTE: the linear cost's per-token price, so the hottest call skips a method call
        self._w_q = charges.linear_w_q(self.cost)
        if peers is not None:
            peers.attach(self)

    def listen(self, listener: Listener) -> None:
        """`listener` is told of every change from now on (core/listener.py: what is called when, what it may
        read); several may listen, told in the order they registered."""
        if self._listener is None:
            self._listener = listener
        elif isinstance(self._listener, Listeners):
            self._listener.listeners.append(listener)
        else:
            self._listener = Listeners(self._listener, listener)

    # ---- arrivals -------------------------------------------------------------------------------------------------
    def arrive(
        self,
        request_id: Any,
        tenant: str,
        prompt_tokens: int,
        max_tokens: int | None = None,
        now: float = 0.0,
        item: Any = None,
    ) -> Request | None:
        """A new request, queued; None if the policy rejected it (rate limits): it was never in the ledger."""
        req = Request(
            id=request_id, tenant=tenant, prompt_tokens=prompt_tokens, max_tokens=max_tokens, arrival_s=now, item=item
        )
        return req if self.add(req) else None

    def add(self, req: Request, now: float | None = None) -> bool:
        """Queue a request the driver built (`arrival_s` is its arrival unless `now` is given). False if the policy
        rejected it (its state is then REJECTED, and it is not in the ledger)."""
        if req.id in self._requests:
            raise ValueError(f"request {req.id!r} is already in the ledger")
        acct = req.account = self.account(req.tenant)
        if not self.policy.accept(req, req.arrival_s if now is None else now):
            req.state = RequestState.REJECTED
            return False
        self._seq += 1
        req.seq = self._seq
        level = self._levels.get(acct.tenant)  # NOTE: priority_of(), its common case inline
        req.priority = level if level is not None and req.priority is None else self.priority_of(acct, req.priority)
        if self._lifts:
            node: Account | None = acct
            while node is not None and not node.queued:  # NOTE: each node whose subtree had nothing queued
                self._lift(node)
                node = node.parent
        self.policy.enqueue(req, front=False)
        req.state = QUEUED
        if acct.parent is None:  # NOTE: _count() inline for a tenant at the top (every request passes here)
            acct.queued += 1
        else:
            _count(acct, 1, 0)
        self.num_queued += 1
        self._requests[req.id] = req
        if self._listener is not None:
            self._listener.queued(req)
        return True

    def _lift(self, node: Account) -> None:
        """The counter lift: a node (a tenant, a group) whose subtree had nothing queued gets something queued, so its
        counter becomes at least the smallest counter among its siblings with something queued (no credit hoarded
        while idle). Shared state's `Peers` give the floor over every replica."""
        if self._listener is not None:
            self._listener.changing(node)
        floor = self.policy.min_counter(node.parent)
        if self.peers is not None:
            floor = self.peers.lift_floor(node, floor)
        if floor is not None and floor > node.counter:
            node.counter = floor

    # ---- admission ------------------------------------------------------------------------------------------------
    def peek(self) -> Request | None:
        return self.policy.peek()

    def pop(self, head: Request | None = None) -> Request:
        """Admit the request `peek()` returned: it starts running and is charged its admission cost (its prompt, plus
        the predicted output for a policy with a predictor); a re-admitted preempted request is not charged again.
        `head`: what `peek()` has just returned, if the caller holds it (nothing changed since), so that the policy is
        not asked again."""
        req = head if head is not None else self.policy.peek()
        if req is None:
            raise PolicyError("pop() with nothing queued")
        if req.state is not QUEUED:  # NOTE: a `head` the driver kept past its admission
            raise PolicyError(f"pop() of request {req.id!r}, which is not queued")
        self.policy.dequeue(req)
        self.num_queued -= 1
        acct = req.account
        if acct.parent is None:  # NOTE: _count() inline, as in add()
            acct.queued -= 1
            acct.running += 1
        else:
            _count(acct, -1, 1)
        req.state = RUNNING
        req.admission = 0.0
        if self._listener is not None:
            self._listener.left(req)
        if not req.admitted:  # NOTE: a preempted request re-prefills, but it was charged already
            req.admitted = True
            if self.predictor is not None:
                req.predicted = self.predictor.predict(req)
            amount = charges.admission(req.cost or self.cost, req, self.predictor is not None)
            req.admission = amount
            req.charged += amount
            self._charge(acct, amount)
        return req

    def admit(self, fits: Callable[[Request], bool], limit: int | None = None) -> list[Request]:
        """Pop requests in policy order while the driver's `fits(req)` accepts them (it should account for each
        accepted request itself). Stops at the first that does not fit: the policy's order is strict."""
        out: list[Request] = []
        peek = self.policy.peek
        while limit is None or len(out) < limit:
            req = peek()
            if req is None or not fits(req):
                break
            out.append(self.pop(req))
        return out

    # ---- charging -------------------------------------------------------------------------------------------------
    def output(self, req: Request, tokens: int = 1) -> None:
        """`tokens` more output tokens were decoded for a running `req`. Only tokens beyond a prediction are charged."""
        # NOTE: the simulator's hottest call: the common case (no prediction, linear cost) priced inline
        if req.state is not RUNNING:
            return
        y0 = req.output_done
        y1 = req.output_done = y0 + tokens
        w_q = self._w_q if req.cost is None else charges.linear_w_q(req.cost)
        if req.predicted == 0 and w_q is not None:
            amount = w_q * tokens
        elif y1 > req.predicted:
            amount = charges.beyond_prediction(req.cost or self.cost, w_q, req, y0, y1)
        else:
            return
        req.charged += amount
        self._charge(req.account, amount)

    def outputs(self, reqs: Iterable[Request], tokens: int) -> None:
        """`tokens` more output tokens for each of `reqs`, running requests of one tenant, charged to the tenant in
        one charge (a negative `tokens` takes them back). The same as `output(req, tokens)` for each, except that the
        tenant's service and counter (and its groups') take one sum instead of many: equal when every charge is exact
        in floating point (a linear cost with integral prices, weights that are powers of two), else possibly not in
        the last bit."""
        group: list[Request] = []
        acct: Account | None = None
        for req in reqs:
            if req.cost is not None:
                raise ValueError("Ledger.outputs charges requests at the policy's price: use output() for a priced one")
            if req.state is RUNNING:
                if acct is None:
                    acct = req.account
                elif req.account is not acct:
                    raise ValueError("Ledger.outputs charges the requests of one tenant")
                group.append(req)
        if acct is None:
            return
        w_q, total = self._w_q, 0.0
        each = w_q * tokens if w_q is not None else None  # NOTE: the charge of a request without a prediction
        for req in group:
            y0 = req.output_done
            req.output_done = y0 + tokens
            amount = each if req.predicted == 0 and each is not None else None
            if amount is None:
                amount = charges.beyond_prediction(self.cost, w_q, req, y0, y0 + tokens)
            req.charged += amount
            total += amount
        if total:
            self._charge(acct, total)

    def prompt(self, req: Request, prompt_tokens: int) -> None:
        """The true prompt size is now known (a backend's `usage`, a session's next turn): the difference is charged,
        or refunded."""
        if req.done or prompt_tokens == req.prompt_tokens:
            return
        if not req.admitted:  # NOTE: charged at admission, at the size it has then
            req.prompt_tokens = prompt_tokens
            return
        cost = req.cost or self.cost
        old = charges.expected(cost, req)
        req.prompt_tokens = prompt_tokens
        amount = charges.expected(cost, req) - old
        req.charged += amount
        self._charge(req.account, amount)

    def _charge(self, acct: Account, amount: float) -> None:
        """The one charge (every other method charges through it): `amount` of service (negative: a refund) to the
        tenant `acct` and every group above it (a group's service is its subtree's), then the policy's `on_charge`
        moves their counters. Observers hear of it first (`changing`), to read the values before it. The caller adds
        the amount to the request's own `charged`."""
        if self._listener is not None:
            self._listener.changing(acct)
        acct.service += amount
        group = acct.parent
        while group is not None:
            group.service += amount
            group = group.parent
        if self._on_charge is not None:
            self._on_charge(acct, amount)

    # ---- going back to the queue ----------------------------------------------------------------------------------
    def requeue(self, req: Request, item: Any = None) -> bool:
        """A running request goes back to the front of its tenant's queue (preempted, or its backend failed before
        any output): its charges stand, it is not charged again when re-admitted, and it is not a new arrival (no
        lift). False if it is not running."""
        if req.state is not RUNNING:
            return False
        self.policy.enqueue(req, front=True)
        req.state = QUEUED
        _count(req.account, 1, -1)
        self.num_queued += 1
        if item is not None:  # NOTE: engines may hand back a new object for the same request
            req.item = item
        if self._listener is not None:
            self._listener.queued(req)
        return True

    def unpop(self, req: Request, item: Any = None) -> bool:
        """A request popped in this admission pass goes back unscheduled (vLLM skips one whose grammar is not ready or
        that gets no LoRA slot): as if never popped, its admission charge refunded, no lift; the next `pop()` charges
        it again. After a re-admission (a preempted request) this is `requeue()`. False if it is not running."""
        if req.state is not RUNNING:
            return False
        if req.admission:
            req.charged -= req.admission
            self._charge(req.account, -req.admission)
            req.admission, req.admitted, req.predicted = 0.0, False, 0
        return self.requeue(req, item)

    # ---- the one ending -------------------------------------------------------------------------------------------
    def settle(
        self, req: Request, *, prompt: int | None = None, output: int | None = None, cancelled: bool = False
    ) -> bool:
        """End `req`, exactly once: False (and nothing done) if it was settled already.

        A running request that was not cancelled finishes, reconciled to `prompt` / `output` when given (the
        backend's `usage`, the engine's exact counts); a predicted output that was not produced is refunded. A
        cancelled one, or one still queued, is charged only what it got: `prompt` prompt tokens (e.g. what was
        prefilled; default its whole prompt if it was admitted) and `output` output tokens (default: what was
        reported). A refund of everything is `prompt=0, output=0, cancelled=True`."""
        if self._requests.pop(req.id, None) is not req:
            return False
        listener = self._listener
        if req.state is QUEUED:
            self.policy.remove(req)
            self.num_queued -= 1
            _count(req.account, -1, 0)
            if listener is not None:
                listener.left(req)
        elif req.account.parent is None:  # NOTE: _count() inline, as in add()
            req.account.running -= 1
        else:
            _count(req.account, 0, -1)
        if req.admitted:
            if output is not None:
                req.output_done = output
            if prompt is not None:
                req.prompt_tokens = prompt
            delta = charges.final(req.cost or self.cost, req) - req.charged
            if delta:
                req.charged += delta
                self._charge(req.account, delta)
        if req.state is RUNNING and not cancelled:
            req.state = RequestState.FINISHED
            if self.predictor is not None:
                self.predictor.observe(req, req.output_done)
        else:
            req.state = RequestState.ABORTED
        if listener is not None:
            listener.settled(req)
        return True

    def settle_all(self) -> int:
        """The driver is gone: every request still here is cancelled, charged what was reported. Returns how many."""
        left = list(self._requests.values())
        for req in left:
            self.settle(req, cancelled=True)
        return len(left)

    # ---- lookups --------------------------------------------------------------------------------------------------
    def get(self, request_id: Any) -> Request | None:
        return self._requests.get(request_id)

    def __len__(self) -> int:
        """Requests not yet settled."""
        return len(self._requests)

    def queued(self) -> list[Request]:
        """The queued requests, in no particular order (O(requests in the ledger))."""
        return [r for r in self._requests.values() if r.state is QUEUED]


def _count(acct: Account, queued: int, running: int) -> None:
    """Change a tenant's queued and running counts, and its groups' (each a sum over its subtree)."""
    acct.queued += queued
    acct.running += running
    node = acct.parent
    while node is not None:
        node.queued += queued
        node.running += running
        node = node.parent
