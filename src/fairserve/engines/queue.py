"""A real engine's waiting queue ordered by a fairserve policy: the glue every engine integration shares.

The engine keeps its own request objects (`item`s); `EngineQueue` keeps, per engine request id, the core `Request`
the policy accounts for, and turns engine events into policy calls:

    engine event                              policy call
    a request arrives                         add()        counter lift
    the engine's scheduler admits it          pop()        prompt charged (the paper: at admission)
    a step produces output tokens             on_output()
    preempted (evict / offload and resume)    requeue()    no new charge, no lift
    finished or failed                        finish()     reconciled to the tokens really produced
    cancelled                                 abort()      charged only for what was prefilled and produced

Engines call it from their scheduling thread while HTTP handlers read accounts (and reset counters, change weights)
from another: every method takes `lock`, a re-entrant lock, and a scheduler that must peek, try and then pop the
same request holds it across the three (uncontended: ~0.1 µs).
"""
from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..core import Policy, Request, RequestState

T = TypeVar("T")

CLIENT_SEP = "::"           # request id = "<client>::<unique part>"
DEFAULT_CLIENT = "default"  # requests whose id names no client


def request_id_for(client: str, unique: str) -> str:
    """The engine request id that carries `client` (engines have no field for it)."""
    if not client or CLIENT_SEP in client:
        raise ValueError(f"a client name must be non-empty and without {CLIENT_SEP!r}, got {client!r}")
    return f"{client}{CLIENT_SEP}{unique}"


def client_of(request_id: str) -> str:
    client, sep, _ = str(request_id).partition(CLIENT_SEP)
    return client if sep and client else DEFAULT_CLIENT


@dataclass(frozen=True)
class ClientAccount:
    counter: float      # the policy's virtual counter (service / weight for VTC)
    service: float      # weighted tokens charged
    queued: int         # requests waiting for admission
    running: int        # requests admitted and not yet done
    weight: float


class EngineQueue(Generic[T]):
    """Requests waiting in (and admitted by) one engine, in the order of `policy`."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.lock = threading.RLock()
        self._reqs: dict[str, Request] = {}     # every request not yet done, queued or running
        self._items: dict[str, T] = {}          # the engine's object for each queued request
        self._queued: Counter[str] = Counter()  # per client
        self._running: Counter[str] = Counter()

    # ---- arrivals and admission ---------------------------------------------------------------------------------
    def arrive(self, request_id: str, item: T, prompt_tokens: int, client: str | None = None,
               max_tokens: int | None = None, now: float = 0.0) -> bool:
        """A new request. False if the policy rejected it (rate limits): the engine should fail it."""
        with self.lock:
            if request_id in self._reqs:
                raise ValueError(f"request {request_id!r} is already in the queue")
            req = Request(id=request_id, client=client or client_of(request_id), prompt_tokens=prompt_tokens,
                          max_tokens=max_tokens, arrival_s=now)
            if not self.policy.add(req, now):
                return False
            self._reqs[request_id] = req
            self._items[request_id] = item
            self._queued[req.client] += 1
            return True

    def peek(self) -> T | None:
        """The engine object of the request the policy admits next."""
        with self.lock:
            req = self.policy.peek()
            return None if req is None else self._items[req.id]

    def pop(self) -> T:
        """Admit the request `peek()` returned; its prompt is charged (unless it is a resumed one)."""
        with self.lock:
            req = self.policy.pop()
            self._queued[req.client] -= 1
            self._running[req.client] += 1
            return self._items.pop(req.id)

    # ---- progress -----------------------------------------------------------------------------------------------
    def output(self, request_id: str, tokens: int = 1) -> None:
        with self.lock:
            req = self._reqs.get(request_id)
            if req is not None and req.state is RequestState.RUNNING:
                self.policy.on_output(req, tokens)

    def prompt(self, request_id: str, prompt_tokens: int) -> None:
        """The request's prompt is now `prompt_tokens` long (e.g. the next turn of a streaming session): the
        difference is charged (or refunded) at once if it was admitted."""
        with self.lock:
            req = self._reqs.get(request_id)
            if req is not None:
                self.policy.on_prompt(req, prompt_tokens)

    def preempted(self, request_id: str, item: T) -> bool:
        """The engine put a running request back in its waiting queue (possibly as a new object, `item`).
        False if the id is unknown or not running (the engine's own bookkeeping: nothing to do)."""
        with self.lock:
            req = self._reqs.get(request_id)
            if req is None or req.state is not RequestState.RUNNING:
                return False
            self.policy.requeue(req)
            self._items[request_id] = item
            self._running[req.client] -= 1
            self._queued[req.client] += 1
            return True

    # ---- endings ------------------------------------------------------------------------------------------------
    def finished(self, request_id: str, output_tokens: int | None = None) -> None:
        """Done (finished or failed after admission): the account is reconciled to `output_tokens`."""
        with self.lock:
            req = self._reqs.pop(request_id, None)
            if req is None:
                return
            self._forget(req)
            if req.state is RequestState.RUNNING:
                self.policy.finish(req, output_tokens)
            else:
                self.policy.abort(req, output_tokens)

    def cancelled(self, request_id: str, prefilled: int | None = None, output_tokens: int | None = None) -> None:
        """Cancelled by its client. A running request is charged `prefilled` prompt tokens (its prompt was charged
        in full at admission) and `output_tokens`, when the engine knows them."""
        with self.lock:
            req = self._reqs.pop(request_id, None)
            if req is None:
                return
            self._forget(req)
            if req.admitted and prefilled is not None and prefilled < req.prompt_tokens:
                self.policy.on_prompt(req, prefilled)
            self.policy.abort(req, output_tokens)

    def abandon_all(self) -> int:
        """The engine is gone: cancel every request still here (charged what was reported). Returns how many."""
        with self.lock:
            left = list(self._reqs)
            for request_id in left:
                self.cancelled(request_id)
            return len(left)

    def _forget(self, req: Request) -> None:
        self._items.pop(req.id, None)
        (self._queued if req.state is RequestState.QUEUED else self._running)[req.client] -= 1

    # ---- inspection ---------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._items

    def __iter__(self) -> Iterator[T]:
        """The queued engine objects, in no particular order."""
        with self.lock:
            return iter(list(self._items.values()))

    def request(self, request_id: str) -> Request | None:
        return self._reqs.get(request_id)

    def accounts(self) -> dict[str, ClientAccount]:
        """Every client's counter, service, queued and running requests, read consistently (O(clients))."""
        with self.lock:
            pol = self.policy
            counters = pol.counters
            return {c: ClientAccount(counter=counters.get(c, 0.0), service=s, queued=self._queued[c],
                                     running=self._running[c], weight=pol.weight(c))
                    for c, s in pol.service.items()}

    def set_weight(self, client: str, weight: float) -> None:
        with self.lock:
            self.policy.set_weight(client, weight)
