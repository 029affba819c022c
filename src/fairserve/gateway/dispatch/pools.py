"""Where a request may go, and the admission pass: model pools, backend capacity, and the order across pools.

A backend serves the model ids its config names (`models = [...]`), else those it lists at `/v1/models` (read at start
and with each health check: gateway/dispatch/health.py; vLLM's LoRA adapters are in that list, with a `parent`); until a
list is known it serves any model. A request goes to the backends that serve its `model`, its **pool** (models served by
the same backends share one). A model no backend serves is the gateway's 404 `model_not_found`, except where every
backend serves the same models (one pool): then the backend answers for a model it does not know, as without the
gateway.

Counter scope: `per_model` gives each pool a ledger of its own (each pool its own resource: a tenant's use of one
pool does not count on another), `global` one ledger over the fleet (one account per tenant; per-model prices make
a token of one model cost more than another's). Either way the admission pass does not let a pool without room hold
up one with room: within a ledger, requests whose pool is full are passed over (`Ledger.pop`, then `Ledger.unpop`
at the end of the pass: their admission charges stand only during the pass) and the policy's order holds among the
requests of pools with room.

With shared state (several replicas, gateway/shared/state.py) the same holds across replicas: the pass also finds
each pool's head (its first request still queued: `heads`), a replica reports the heads that may be admitted but
find no lease with room as waiting, each with its pool (`Pool.key`, its backends' URLs, the same on every replica),
and a replica defers only to the waiting heads of pools that share a backend with its request's pool. A saturated
pool's waiting heads thus hold up no request for another pool, on any replica.

This is the place fleet-level dispatch grows (preemption across pools, locality): `Dispatch.admit` is the one pass.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...core import Ledger, Request, RequestState
from ..settings.backends import BackendConfig
from ..shared.heads import Head, pool_key
from ..shared.state import SharedState
from .locality import Locality
from .placement import Placement


@dataclass(eq=False)
class Backend:
    cfg: BackendConfig
    requests: int = 0  # in flight
    tokens: int = 0  # prompt + max_tokens of those in flight
    healthy: bool = True  # the last health check or attempt reached it
    down_until: float = 0.0  # down: skipped until then (inf: until a health check passes)
    reason: str = ""  # why it is down
    down_since: float = 0.0  # when it last went down (the scheduler's clock)
    busy_until: float = 0.0  # it answered 429/503 with Retry-After: skipped until then (health checks keep it)
    limit: int = 0  # in-flight request limit: max_inflight_requests, or adaptive (dispatch/capacity.py)
    token_limit: int | None = None  # in-flight token limit: max_inflight_tokens (with shared state: its lease)

    # the model ids it serves (None: not known yet, any) and their /v1/models entries
    models: frozenset[str] | None = None
    listing: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.limit = self.cfg.max_inflight_requests
        self.token_limit = self.cfg.max_inflight_tokens
        if self.cfg.models:
            self.serves([{"id": m, "object": "model", "created": 0, "owned_by": "fairserve"} for m in self.cfg.models])

    def serves(self, listing: list[dict[str, Any]]) -> None:
        """Its models are those of `listing` (a /v1/models `data`, adapters with a `parent` included)."""
        self.listing = [m for m in listing if isinstance(m, dict) and isinstance(m.get("id"), str)]
        self.models = frozenset(m["id"] for m in self.listing)

    def up(self, now: float) -> bool:
        return self.down_until <= now and self.busy_until <= now

    @property
    def url(self) -> str:
        return self.cfg.url

    @property
    def name(self) -> str:
        """The URL without credentials (shown, logged, a metrics label)."""
        return self.cfg.name

    def room_for(self, tokens: int) -> bool:
        if self.requests >= self.limit:
            return False
        limit = self.token_limit
        # NOTE: a request larger than the whole token budget still runs, alone, rather than blocking the queue
        return (
            limit is None
            or self.tokens + tokens <= limit
            or self.requests == 0
            and limit == self.cfg.max_inflight_tokens
        )

    def load(self) -> tuple[float, float]:
        limit = self.token_limit
        return self.requests / max(self.limit, 1), self.tokens / limit if limit else 0.0


def claim(
    backends: Collection[Backend],
    req: Request,
    tokens: int,
    shared: SharedState | None,
    tried: Collection[str],
    now: float,
) -> Backend | None:
    """The capacity check: the least-loaded backend that is up (at `now`, by the scheduler's clock), has not failed
    `req` (`tried`) and has room for one more request of `tokens` capacity tokens, which is then taken on it; None if
    there is none, or if shared state says another replica's tenant comes first."""
    if shared is not None and not shared.may_admit(req):
        return None
    room = [
        b for b in backends if b.url not in tried and b.down_until <= now and b.busy_until <= now and b.room_for(tokens)
    ]
    if not room:
        return None
    b = min(room, key=Backend.load)
    b.requests += 1
    b.tokens += tokens
    return b


class UnknownModel(Exception):
    """No backend serves the model (404 `model_not_found`)."""

    def __init__(self, model: str, served: list[str]) -> None:
        known = ", ".join(served) if served else "none"
        super().__init__(f"the model {model!r} does not exist or is not served here; models: {known}")
        self.model = model


@dataclass(eq=False)
class Pool:
    """The backends that serve a request's model; its requests go to them only."""

    backends: tuple[Backend, ...]
    ledger: Ledger  # its own (per_model) or the fleet's (global)
    queued: int = 0  # its requests waiting for admission
    key: str = ""  # its backends' URLs (`pool_key`): the same pool on every replica

    def __post_init__(self) -> None:
        self.key = pool_key(b.url for b in self.backends)

    @property
    def name(self) -> str:
        """The models all its backends serve (a label)."""
        common: frozenset[str] | None = None
        for b in self.backends:
            if b.models is not None:
                common = b.models if common is None else common & b.models
        return ",".join(sorted(common)) if common else "*"

    def has_room(self, now: float) -> bool:
        return any(b.up(now) and b.requests < b.limit for b in self.backends)


class Dispatch:
    """The pools, their ledgers, and the one admission pass over them (see the module's docstring)."""

    # NOTE: True: one order over every pool together, so that a saturated pool holds up the others (the counterfactual
    # the pool tests measure)
    strict = False

    def __init__(
        self,
        backends: list[Backend],
        make_ledger: Callable[[], Ledger],
        per_model: bool,
        clock: Callable[[], float] = time.monotonic,
        placement: Placement | None = None,
    ) -> None:
        self.backends = backends
        self.clock = clock  # the scheduler's
        self.placement = placement or Placement()  # which of its pool's backends a request may go to
        self.locality = Locality()  # prefix dispatch: the prefixes sent to each backend
        self.per_model = per_model
        self._make = make_ledger
        self.ledgers: list[Ledger] = [make_ledger()]  # the fleet's (global), or the first pool's (per_model)
        self.pools: dict[frozenset[str], Pool] = {}
        self._turn = 0  # which ledger's pass goes first (they may share backends)
        self._heads: list[tuple[Pool, Request]] = []  # with shared state: as the last pass found them
        shared = self.ledgers[0].peers
        if isinstance(shared, SharedState):
            shared.bind(self)

    def pool(self, backends: Collection[Backend]) -> Pool:
        key = frozenset(b.url for b in backends)
        p = self.pools.get(key)
        if p is None:
            ledger = self.ledgers[0]
            if self.per_model and self.pools:
                ledger = self._make()
                self.ledgers.append(ledger)
            p = self.pools[key] = Pool(tuple(b for b in self.backends if b.url in key), ledger)
        return p

    def served(self) -> list[str]:
        """Every model id some backend serves."""
        return sorted({m for b in self.backends for m in (b.models or ())})

    def route(self, model: str | None) -> Pool:
        """The pool of the backends that serve `model`; UnknownModel if there is none."""
        if model is None:
            return self.pool(self.backends)
        eligible = [b for b in self.backends if b.models is None or model in b.models]
        if not eligible:
            if len({b.models for b in self.backends}) > 1:
                raise UnknownModel(model, self.served())
            eligible = self.backends  # NOTE: one pool: its backends answer for a model they do not know
        return self.pool(eligible)

    @property
    def num_queued(self) -> int:
        return sum(x.num_queued for x in self.ledgers)

    def key_of(self, req: Request) -> str:
        """The pool of a queued request (its ticket's)."""
        return str(req.item.pool.key)

    def heads(self) -> list[Head]:
        """Each pool's first request still queued, as the last pass found them (shared state compares them across
        replicas); with `strict`, each ledger's first request, for every backend."""
        if self.strict:
            every = pool_key(b.url for b in self.backends)
            return [Head(every, req, x.num_queued) for x in self.ledgers if (req := x.peek()) is not None]
        return [Head(p.key, req, p.queued) for p, req in self._heads if req.state is RequestState.QUEUED and p.queued]

    def admit(self, shared: SharedState | None = None) -> list[Request]:
        """One admission pass over every ledger: the requests admitted, each with its backend taken
        (`ticket.backend`)."""
        ledgers, out = self.ledgers, []
        self._heads = []
        n = len(ledgers)
        self._turn = (self._turn + 1) % n
        for i in range(n):
            ledger = ledgers[(self._turn + i) % n]
            if ledger.num_queued:
                out += self._pass(ledger, shared)
        return out

    def _pass(self, ledger: Ledger, shared: SharedState | None) -> list[Request]:
        now = self.clock()
        if self.placement.prefix_delta is not None and shared is None and not self.strict:
            return self._near(ledger, now, self.placement.prefix_delta)
        queued = [p for p in self.pools.values() if p.ledger is ledger and p.queued]
        room = {p for p in queued if p.has_room(now)}
        # NOTE: with shared state every pool's head is found (the replicas compare them), not only those with room
        headless = set(queued) if shared is not None and not self.strict else set()
        admitted: list[Request] = []
        passed: list[Request] = []  # popped only to look behind them; put back, as they were, at the end
        full: set[Backend] = set()  # backends that failed a claim in this pass
        try:
            while room or headless:
                req = ledger.peek()
                if req is None:
                    break
                t = req.item
                pool: Pool = t.pool
                hand = self.placement.hand(req.tenant, pool.backends)
                if pool in room and not full.issuperset(hand):
                    t.backend = claim(hand, req, t.tokens, shared, t.tried, now)
                    if t.backend is not None:
                        ledger.pop()
                        pool.queued -= 1
                        admitted.append(req)
                        if not pool.queued:  # NOTE: else the pass would walk every full pool's queue for it
                            room.discard(pool)
                            headless.discard(pool)
                        continue
                    # NOTE: backends without room for it are full for the rest of the pass (the policy's order holds
                    # among the requests that may go to them); a pool is passed over when all its backends are, or
                    # when its request was held back for another reason (shared state, backends it failed on)
                    if any(b.up(now) and b.room_for(t.tokens) for b in hand):
                        room.discard(pool)
                    else:
                        full.update(hand)
                        if full.issuperset(pool.backends):
                            room.discard(pool)
                if self.strict:
                    break
                if pool in headless:
                    headless.discard(pool)
                    self._heads.append((pool, req))
                if not room and not headless:
                    break
                ledger.pop()
                passed.append(req)
        finally:
            for req in reversed(passed):
                ledger.unpop(req)
        return admitted

    def _near(self, ledger: Ledger, now: float, delta: float) -> list[Request]:
        """The pass of prefix dispatch (`dispatch = "prefix:DELTA"`, gateway/dispatch/locality.py), in the policy's
        order: a request whose prefix's home has room goes there; one whose home is full waits for it (popped, put
        aside) while the requests admitted past it are of tenants whose counter is at most DELTA above its tenant's
        (from the first one waiting); past that, and at the end of the pass, the waiting ones go to any backend of
        their pool with room, the least-loaded. So no backend stays idle while a request could run on it, and a
        request is overtaken for locality by at most DELTA of counter (docs/gateway.md: the bound)."""
        admitted: list[Request] = []
        popped: list[Request] = []  # in the order popped; those not admitted are put back, as they were, at the end
        waiting: list[Request] = []  # popped: their home is full
        floor, accounts = math.inf, ledger.accounts

        def place(req: Request, hand: Sequence[Backend]) -> None:
            t = req.item
            t.backend = claim(hand, req, t.tokens, None, t.tried, now)
            if t.backend is not None:
                t.pool.queued -= 1
                admitted.append(req)
                self.locality.record(t.backend.url, t.prefix)

        def release() -> None:
            for w in waiting:
                place(w, w.item.pool.backends)
            waiting.clear()

        try:
            while (req := ledger.peek()) is not None:
                if not any(b.up(now) and b.room_for(1) for b in self.backends):
                    break  # NOTE: no backend has room for anything: the pass is over
                t = req.item
                backends = [b for b in t.pool.backends if b.up(now) and b.url not in t.tried]
                counter = accounts[req.tenant].counter
                if counter > floor + delta:
                    release()  # NOTE: the ones waiting may be overtaken no further
                    floor = math.inf
                home = self.locality.home(t.prefix, backends) if t.prefix else None
                ledger.pop()
                popped.append(req)
                if not any(b.room_for(t.tokens) for b in backends):
                    continue  # its pool is full: looked behind
                if home is not None and not home.room_for(t.tokens):
                    floor = min(floor, counter)
                    waiting.append(req)
                    continue
                place(req, [home] if home is not None else backends)
            release()
        finally:
            done = set(admitted)
            for req in reversed(popped):
                if req not in done:
                    ledger.unpop(req)
        return admitted
