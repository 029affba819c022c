"""A real engine's waiting queue ordered by a fairserve policy: the glue every engine integration shares.

The engine keeps its own request objects (`item`s); the `Ledger` keeps, per engine request id, the core `Request`
(with the item attached) and the accounts it is charged to. `EngineQueue` turns engine events into ledger calls:

    engine event                              ledger call
    a request arrives                         arrive()     counter lift
    the engine's scheduler admits it          pop()        prompt charged (the paper: at admission)
    a step produces output tokens             output()
    preempted (evict / offload and resume)    requeue()    no new charge, no lift
    finished or failed                        settle()     reconciled to the tokens really produced
    cancelled                                 settle(cancelled=True)   charged only what was prefilled and produced

Engines call it from their scheduling thread while HTTP handlers read accounts (and reset counters, change weights)
from another: every method takes `lock`, a re-entrant lock, and a scheduler that must peek, try and then pop the
same request holds it across the three (uncontended: ~0.1 µs).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, TypeVar

from ..core import DEFAULT_TENANT, Ledger, LedgerView, Policy, Request, RequestState, TenantView

T = TypeVar("T")

CLIENT_ARG = "fairserve_client"  # the key of a vLLM request's extra args (`vllm_xargs`) naming its tenant
CLIENT_SEP = "::"  # request id = "<client>::<unique part>"


def request_id_for(client: str, unique: str) -> str:
    """The engine request id that carries `client` (engines have no field for it)."""
    if not client or CLIENT_SEP in client:
        raise ValueError(f"a client name must be non-empty and without {CLIENT_SEP!r}, got {client!r}")
    return f"{client}{CLIENT_SEP}{unique}"


def client_of(request_id: str) -> str:
    client, sep, _ = str(request_id).partition(CLIENT_SEP)
    return client if sep and client else DEFAULT_TENANT


class EngineQueue(Generic[T]):
    """Requests waiting in (and admitted by) one engine, in the order of `policy`."""

    def __init__(
        self,
        policy: Policy,
        tenants: tuple[str, ...] = (),
        weights: Mapping[str, float] | None = None,
        priorities: Mapping[str, int] | None = None,
        allowed: Mapping[str, Iterable[int]] | None = None,
    ) -> None:
        """Weights and priorities by node path (a tenant or a group); `allowed`: by tenant, the priorities its
        requests may name (`core.Ledger`)."""
        self.ledger = Ledger(policy, tenants, weights, priorities=priorities, allowed=allowed)
        self.lock = threading.RLock()
        # NOTE: the priority a request named, by engine request id, for engines whose requests carry none
        # (transformers): set before the engine sees the request, taken at its arrival
        self.named: dict[str, int] = {}

    @property
    def policy(self) -> Policy:
        return self.ledger.policy

    # ---- arrivals and admission ---------------------------------------------------------------------------------
    def arrive(
        self,
        request_id: str,
        item: T,
        prompt_tokens: int,
        client: str | None = None,
        max_tokens: int | None = None,
        now: float = 0.0,
        priority: int | None = None,
    ) -> bool:
        """A new request; `priority` is the one it names (the ledger decides the one it runs at, readable as
        `request(request_id).priority`). False if the policy rejected it (rate limits): the engine should fail it.
        ValueError if `client` cannot be a tenant of this tree (it names a group, or runs through a tenant)."""
        with self.lock:
            named = self.named.pop(request_id, None)
            req = Request(
                id=request_id,
                tenant=client or client_of(request_id),
                prompt_tokens=prompt_tokens,
                max_tokens=max_tokens,
                arrival_s=now,
                priority=priority if priority is not None else named,
                item=item,
            )
            return self.ledger.add(req)

    def peek(self) -> T | None:
        """The engine object of the request the policy admits next."""
        with self.lock:
            req = self.ledger.peek()
            return None if req is None else req.item

    def pop(self, cached_tokens: int | None = None) -> T:
        """Admit the request `peek()` returned; its prompt is charged (unless it is a resumed one). `cached_tokens`:
        how many of its prompt tokens the engine's prefix cache serves at this admission, priced by the cost's
        `w_cached` (ignored for a resumed request, charged already)."""
        with self.lock:
            if cached_tokens is None:
                return self.ledger.pop().item
            head = self.ledger.peek()
            if head is not None and not head.admitted:
                head.cached_tokens = cached_tokens  # NOTE: the core's contract: set before the pop that prices it
            return self.ledger.pop(head).item

    # ---- progress -----------------------------------------------------------------------------------------------
    def output(self, request_id: str, tokens: int = 1) -> None:
        with self.lock:
            req = self.ledger.get(request_id)
            if req is not None:
                self.ledger.output(req, tokens)

    def prompt(self, request_id: str, prompt_tokens: int) -> None:
        """The request's prompt is now `prompt_tokens` long (e.g. the next turn of a streaming session): the
        difference is charged (or refunded) at once if it was admitted."""
        with self.lock:
            req = self.ledger.get(request_id)
            if req is not None:
                self.ledger.prompt(req, prompt_tokens)

    def preempted(self, request_id: str, item: T) -> bool:
        """The engine put a running request back in its waiting queue (possibly as a new object, `item`).
        False if the id is unknown or not running (the engine's own bookkeeping: nothing to do)."""
        with self.lock:
            req = self.ledger.get(request_id)
            return req is not None and self.ledger.requeue(req, item)

    def unpop(self, request_id: str, item: T) -> bool:
        """The engine popped a request in this scheduling pass and put it back without scheduling it: back to the
        front of its client's queue as if never popped (admission charge refunded, no lift; charged when popped
        again). A request re-admitted after a preemption keeps its charges. False if unknown or not running."""
        with self.lock:
            req = self.ledger.get(request_id)
            return req is not None and self.ledger.unpop(req, item)

    # ---- endings ------------------------------------------------------------------------------------------------
    def finished(self, request_id: str, output_tokens: int | None = None) -> None:
        """Done (finished or failed after admission): the account is reconciled to `output_tokens`."""
        with self.lock:
            req = self.ledger.get(request_id)
            if req is not None:
                self.ledger.settle(req, output=output_tokens)

    def cancelled(self, request_id: str, prefilled: int | None = None, output_tokens: int | None = None) -> None:
        """Cancelled by its client. A running request is charged `prefilled` prompt tokens (its prompt was charged
        in full at admission) and `output_tokens`, when the engine knows them."""
        with self.lock:
            req = self.ledger.get(request_id)
            if req is None:
                return
            # NOTE: a prompt only grows while prefilled: a larger count (a cached prefix) does not raise the charge
            prompt = prefilled if prefilled is not None and prefilled < req.prompt_tokens else None
            self.ledger.settle(req, prompt=prompt, output=output_tokens, cancelled=True)

    def abandon_all(self) -> int:
        """The engine is gone: cancel every request still here (charged what was reported). Returns how many."""
        with self.lock:
            return self.ledger.settle_all()

    # ---- inspection ---------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Requests waiting for admission."""
        return self.ledger.num_queued

    def __contains__(self, request_id: object) -> bool:
        """Whether `request_id` is waiting for admission."""
        req = self.ledger.get(request_id)
        return req is not None and req.state is RequestState.QUEUED

    def __iter__(self) -> Iterator[T]:
        """The queued engine objects, in no particular order."""
        with self.lock:
            return iter([r.item for r in self.ledger.queued()])

    def request(self, request_id: str) -> Request | None:
        return self.ledger.get(request_id)

    def view(self) -> LedgerView:
        with self.lock:
            return self.ledger.view()

    def accounts(self) -> dict[str, TenantView]:
        """Every client's counter, service, queued and running requests, read consistently (O(clients))."""
        return self.view().tenants

    def set_weight(self, client: str, weight: float) -> None:
        with self.lock:
            self.ledger.set_weight(client, weight)

    def reset(self) -> None:
        with self.lock:
            self.ledger.reset()
