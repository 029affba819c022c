"""Fairness across gateway replicas: the ledger's counters and the backends' capacity, shared through Redis; this
module is the peer's part (what a sync pushes, what its answer pulls into the ledger and the leases).

What Redis holds, and the script that reads and writes it, are in `redis_scripts.py`; what a sync sends it and what
it answers (named dataclasses, laid out once) in `sync_codec.py`; the connection's life (connecting, the sync task,
wake-ups, leaving, being degraded) in `shared_link.py`.

A sync costs what changed, on the replica and in Redis: the replica sends the accounts changed since its last sync
(`Changes`, the ledger's listener: no pass over all accounts) and its backlog's changes; Redis answers the
global values of those, of at most `PULL` tenants changed elsewhere (the oldest changes first: under heavy churn
the other tenants' local copies catch up within a few syncs, and a tenant's copy is refreshed whenever this replica
charges it or it becomes backlogged here), of every weight set by an admin, and the two smallest counters
backlogged anywhere. Only a counter reset, and a first sync (of a replica, or after Redis lost its data), read or
write every tenant.

Nothing on the request path waits for Redis: the replica keeps its own ledger, orders its queue by it, and admits
within its lease, all synchronously. A background task calls `sync()` every `interval_s` (and early when capacity
should move): one Lua script, one round trip, which adds this replica's charges since the last sync, updates its
backlog and liveness, resizes its leases, and answers the global values above and the new leases. The replica then
writes the global values into its ledger (`Ledger.apply_remote`, `Ledger.set_weight`) and its leases into its
backends' limits.

Fairness across replicas: this is the ledger's `Peers`; the counter lift uses the smallest counter among tenants
backlogged anywhere (`lift_floor`). The comparison is per model pool (gateway/dispatch/pools.py: a pool is the backends
that serve a model, `Head.key` their URLs): a replica whose pool head may be admitted but finds no lease with room
reports itself waiting, with that head's tenant and pool (`P:st`); a replica admits a request unless another
replica waits for a different tenant with a smaller counter in a pool that shares a backend with the request's
(`may_admit`), so a saturated pool holds up no other. One that may not admit a pool's head asks no more lease on its
backends than it has in flight and reports no wait for it, so the capacity flows to the replica holding the smallest
waiting counter, and two replicas that each see the other first do not both stand still. A replica syncs early when
it starts waiting, and when it holds lease room it cannot use while others wait (`waiting`); that sync wakes the
waiting replicas (pub/sub, `Link._listen`), which sync at once.

A sync's additive part (charges, lifts, weights set, a reset) is a numbered batch (`P:sn`: the last number applied,
per replica): a sync whose answer was lost is sent again with the same batch, which Redis applies only if it did
not already, so a timed-out sync that Redis ran late never charges twice.

Leases are safe against every interleaving of a replica's admissions with its syncs: while a sync is in flight the
replica admits only within `keep` (at most its lease, at least what it has in flight), and the script never sets
its lease below `min(keep, old lease)`; a sync that fails leaves it at `keep`, since Redis may have run it.

Redis lost while running: the replica keeps serving from its local ledger (its lease as above until `ttl_s` after
the last sync that answered, then `max(1, limit // replicas)` of each backend, the replicas it last saw alive),
reports itself degraded, retries every 0.1 s, and on reconnection adds everything charged meanwhile. A fresh Redis
(a new epoch) holds every lease at what its replica has in flight for `hold_s`, until the other replicas have
reported theirs, and takes each tenant's counter, service and weight from the first replica that writes it back;
each replica writes back its own part of the quotas' use too (`on_sync`, gateway/quota/gate.py).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from ...core import Account, Ledger, Request
from ..settings.urls import redact
from .changes import Changes, Unanswered
from .codec import WHOLE, Arg, BatchHead, LeaseAsk, StarvedHead, SyncAnswer, SyncBatch, Weight, encode, leave
from .heads import BackendSlot, Head, HeadOrder, Pools, pool_key
from .link import (
    DEFAULT_HOLD_S,
    DEFAULT_INTERVAL_S,
    DEFAULT_SPARE,
    DEFAULT_TTL_S,
    Link,
    SharedStateError,
    StateSettings,
    probe,
)

__all__ = [
    "DEFAULT_HOLD_S",
    "DEFAULT_INTERVAL_S",
    "DEFAULT_SPARE",
    "DEFAULT_TTL_S",
    "PULL",
    "BackendSlot",
    "Head",
    "SharedState",
    "SharedStateError",
    "StateSettings",
    "pool_key",
    "probe",
]

PULL = 8  # at most this many tenants changed elsewhere per answer (the rest come with the next syncs)


class SharedState(HeadOrder, Link):
    """One replica's link to the shared state. `start()` connects (SharedStateError if Redis is unreachable) and
    starts the sync task; `stop()` leaves. It is the ledger's `Peers`: the ledger attaches itself
    (`Ledger(policy, ..., peers=shared)`), which registers `changes` as its listener, and asks it for the lift's
    floor. The
    scheduler calls `may_admit` (synchronous, no I/O), `waiting` after each dispatch, `set_weight` and `reset`
    (admin); everything else happens in `sync()`."""

    def __init__(
        self,
        settings: StateSettings,
        backends: Sequence[BackendSlot],
        tokens_of: Callable[[Request], int],
        on_change: Callable[[], None] = lambda: None,
        replica: str | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(settings, replica or f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:8]}", clock)
        self.backends = list(backends)
        self.tokens_of = tokens_of  # the capacity tokens a queued request will take on a backend
        self.on_change = on_change  # called after a sync changed leases or counters (the scheduler dispatches)
        # called after each answered sync, True when Redis had lost its data (the quota gate writes its use back)
        self.on_sync: Callable[[bool], None] = lambda lost: None
        self.replicas = 1  # live replicas at the last sync
        self.changes = Changes(tokens_of)  # what changed here since the last sync
        self._floor: list[tuple[float, str]] = []  # the two smallest counters backlogged on any replica
        # the heads of other live replicas that may admit them but have no lease with room: (counter, tenant),
        # smallest first; while one of them is smaller than this replica's head, this replica does not admit
        self._starved: list[tuple[float, str, str]] = []  # (counter, tenant, pool)
        self._sent_starved: frozenset[str] = frozenset()  # the pools the last sync reported this replica starved in
        self._gained = False  # the last answer grew a lease: a replica starved again may sync early again
        # the batch of additive changes (charges, weights, a reset) sent but not answered: sent again, unchanged,
        # until answered; Redis applies a batch once (`P:sn`), so a lost answer never charges twice
        self._token = uuid.uuid4().hex[:12]
        self._number = 0
        self._unanswered: Unanswered | None = None
        self._epoch, self._seq, self._wseq = "", "0", "0"  # what the last answer was up to (only later changes come)
        self._generation: str | None = None  # of counter resets, as of the last answer
        self._restore = False  # send every tenant next time: Redis lost its data
        self._weights: dict[str, float] = {}  # admin changes not yet sent
        self._seed: dict[str, float] = {}  # configured weights: set in Redis if not set there (`attach`)
        self._reset = False
        self._mean_tokens = 0.0  # of requests seen, for the token lease's headroom
        self._others_wait: dict[str, tuple[bool, bool]] = {}  # per backend: other replicas wait for capacity
        self._sync_lock = asyncio.Lock()
        self.ledger: Ledger = None  # type: ignore[assignment]  # NOTE: the ledger attaches itself (`attach`)
        # the model pools (gateway/dispatch/pools.py binds itself); without them, one pool of every backend
        self.pools: Pools | None = None
        self._all = pool_key(b.cfg.url for b in self.backends)
        self._urls: dict[str, frozenset[str]] = {}  # a pool's backend URLs, by its key
        self.changes.pool_of = lambda req: self._all

    # ---- the ledger's Peers (synchronous, no I/O) ----------------------------------------------------------------
    def attach(self, ledger: Ledger) -> None:
        """The ledger whose counters this replica shares (called by `Ledger(..., peers=self)`); its changes are
        heard from then on (`Changes`, the ledger's listener), so a sync sends only those."""
        if not ledger.policy.capabilities.shares_counters:
            raise ValueError(f"shared state needs a policy that shares its counters, not {ledger.policy.name!r}")
        self.ledger = ledger
        ledger.listen(self.changes)
        self._seed = dict(ledger.weights)

    def lift_floor(self, acct: Account, local_floor: float | None) -> float | None:
        """The lift's floor for a node (tenant or group) at the top of the tree: the smallest counter among the
        nodes at the top backlogged here or on any live replica (as of the last sync: the smallest two, so that the
        node's own is passed over); the lift is sent with the next sync. Below the top, the floor among its siblings
        queued here: the next sync lifts a node that became backlogged anywhere to the smallest counter among its
        siblings backlogged on any replica, in Redis (`redis_backlog.py`), and every replica takes that counter."""
        if acct.parent is not None:
            return local_floor
        floor = local_floor
        for c, tenant in self._floor:
            if tenant != acct.tenant:
                floor = c if floor is None else min(floor, c)
                break
        if floor is not None and floor > acct.counter:
            # NOTE: net of the charges since the last sync, which the sync adds after applying the lift
            lifts = self.changes.lifts
            net = floor - (acct.service - self.changes.synced.get(acct, 0.0)) / acct.weight
            lifts[acct] = max(lifts.get(acct, net), net)
        return floor

    def note_tokens(self, tokens: int) -> None:
        """A request of `tokens` capacity tokens arrived (sizes the token lease's headroom)."""
        self._mean_tokens += (tokens - self._mean_tokens) * 0.1

    def set_weight(self, tenant: str, weight: float) -> None:
        """An admin change: sent with the next sync, so every replica has it within `interval_s` plus theirs."""
        self._weights[tenant] = weight

    def reset(self) -> None:
        """Every counter to 0 on every replica (with the next sync), this one's already reset by the caller."""
        self._reset = True
        self._drop_lifts()

    def _drop_lifts(self) -> None:
        """The counters were reset here: lifts not yet sent no longer hold."""
        self.changes.lifts.clear()
        self.changes.counters_reset()

    # ---- the sync -----------------------------------------------------------------------------------------------
    def _args(self) -> tuple[list[Arg], dict[Account, tuple[float, float]], list[tuple[int, int | None]]]:
        """The next sync's ARGV (`sync_codec.encode` of `_batch()`), the values of the nodes it charges, and the
        limits each backend admits within while it is in flight."""
        batch, snap, keeps = self._batch()
        return encode(batch), snap, keeps

    def _batch(self) -> tuple[SyncBatch, dict[Account, tuple[float, float]], list[tuple[int, int | None]]]:
        s = self.settings
        if self._unanswered is None:
            charges, snap = self.changes.batch(self.ledger, self._restore)
            weights = [Weight(tenant=t, weight=w) for t, w in self._weights.items()]
            self._number += 1
            self._unanswered = Unanswered(self._number, charges, weights, snap, self._reset)
            self._weights, self._reset = {}, False
        else:  # NOTE: the same batch again, and the whole backlog: Redis may not have had the last changes
            self.changes.full = True
            self.changes.backlog_changes(self.ledger, ())
        sending = self._unanswered
        # NOTE: dispatch admits while anything fits, so an eligible head still queued found no lease with room: its
        # pool's queued requests are the demand on the pool's backends; a backend only of heads that may not be
        # admitted gets no spare (its room goes to the replica whose head comes first)
        demand: dict[str, tuple[int, int]] = {}
        deferred: set[str] = set()
        starved: list[StarvedHead] = []
        for h in self.heads():
            urls = self._backends_of(h.key)
            if self.may_admit(h.req):
                starved.append(StarvedHead(tenant=h.req.tenant, pool=h.key))
                tokens = self.changes.pool_tokens.get(h.key, 0)
                for url in urls:
                    r, t = demand.get(url, (0, 0))
                    demand[url] = (r + h.queued, t + tokens)
            else:
                deferred |= urls
        self._sent_starved = frozenset(h.pool for h in starved)
        backends: list[LeaseAsk] = []
        keeps: list[tuple[int, int | None]] = []
        for b in self.backends:
            lr, lt = b.cfg.max_inflight_requests, b.cfg.max_inflight_tokens or 0
            demand_r, demand_t = demand.get(b.cfg.url, (0, 0))
            spare_r = 0 if b.cfg.url in deferred and b.cfg.url not in demand else s.spare
            spare_t = int(spare_r * self._mean_tokens) + spare_r
            need_r, need_t = b.requests + min(demand_r, lr), b.tokens + min(demand_t, lt)
            wait_r, wait_t = self._others_wait.get(b.cfg.url, (False, False))
            keep_r = min(b.limit, need_r + (0 if wait_r else spare_r))
            keep_t = min(b.token_limit, need_t + (0 if wait_t else spare_t)) if b.token_limit is not None else None
            keeps.append((keep_r, keep_t))
            backends.append(
                LeaseAsk(
                    url=b.cfg.url,
                    limit_requests=lr,
                    limit_tokens=lt,
                    used_requests=b.requests,
                    used_tokens=b.tokens,
                    need_requests=need_r,
                    need_tokens=need_t,
                    spare_requests=spare_r,
                    spare_tokens=spare_t,
                    keep_requests=keep_r,
                    keep_tokens=keep_t or 0,
                )
            )
        backlog = self.changes.sent
        head = BatchHead(
            prefix=s.prefix,
            replica=self.replica,
            ttl_ms=int(s.ttl_s * 1000),
            hold_ms=int(s.hold_s * 1000),
            now_ms=int(self.clock() * 1000) if self._redis_now else None,
            epoch=self._epoch,
            since=self._seq,
            weights_since=self._wseq,
            pull=PULL,
            batch=f"{self._token}:{sending.number}",
            reset=sending.reset,
            mode=backlog.mode,
            lifts=self.ledger.policy.capabilities.lifts,
        )
        batch = SyncBatch(
            head,
            charges=sending.charges,
            weights=sending.weights,
            seeds=[Weight(tenant=t, weight=w) for t, w in self._seed.items()],
            backlogged=backlog.backlogged,
            unbacklogged=backlog.unbacklogged,
            starved=starved,
            backends=backends,
        )
        return batch, sending.snap, keeps

    async def sync(self) -> bool:
        """One round trip: flush, pull, resize the leases. False (and degraded) when Redis did not answer. After a
        sync whose answer was lost, the first answered one carries only that sync's batch again: a second round
        trip then flushes what was charged since."""
        async with self._sync_lock:  # NOTE: one at a time, or an older answer could overwrite a newer lease
            retry = self._unanswered is not None
            ok = await self._sync()
            if ok and retry:
                ok = await self._sync()
            return ok

    def take_early_sync(self) -> bool:
        """Whether an early sync was asked for since this was last called (`waiting`, or another replica's
        wake-up), and the request cleared. For a driver that makes the syncs itself (`StateSettings.
        stepped_timeout_s`: no sync task takes the request): it calls `sync()` when this says True."""
        asked = self._wake.is_set()
        self._wake.clear()
        return asked

    async def _sync(self) -> bool:
        args, snap, keeps = self._args()
        reset = self._unanswered is not None and self._unanswered.reset
        before = [(b.limit, b.token_limit or 0) for b in self.backends]
        # NOTE: until the answer, admit only within what the new lease is sure to cover (the script never goes below
        # it): a lease shrinks only after this replica stopped using what it gives up
        for b, (keep_r, keep_t) in zip(self.backends, keeps, strict=True):
            b.limit, b.token_limit = keep_r, keep_t
        reply = await self._round_trip(args)
        if reply is None:  # NOTE: the batch stays unanswered: sent again as it is (Redis may have run it: it skips it)
            self.changes.full = True
            self._degrade()
            return False
        self._unanswered = None
        self._seed = {}
        self._apply(SyncAnswer.decode(reply), snap, reset)
        self.on_sync(self._restore)
        self._gained = any(
            b.limit > r or (b.token_limit or 0) > t for b, (r, t) in zip(self.backends, before, strict=True)
        )
        self.on_change()
        return True

    @property
    def epoch(self) -> str:
        """The data's epoch as of the last answer ("" before the first): Redis sets a new one when it lost its data."""
        return self._epoch

    def _leave_args(self) -> list[Arg]:
        return leave(self.settings.prefix, self.replica, self._token)

    def _apply(self, answer: SyncAnswer, snap: dict[Account, tuple[float, float]], reset: bool) -> None:
        epoch = answer.epoch
        # NOTE: a new epoch: Redis lost its data; the next sync writes back every tenant this replica knows (where
        # no other replica has yet), with the charges not yet sent on top, and its whole backlog; a tenant another
        # replica wrote back lower keeps this replica's value, whose difference the next sync adds
        self._restore = bool(self._epoch) and epoch != self._epoch
        self.changes.apply(self.ledger, answer, snap, self._weights, restore=self._restore)
        if self._restore:
            self._seed = dict(self.ledger.weights)  # set where unset, as at start
        generation = answer.generation
        if not self._restore and not reset and self._generation not in (None, generation):
            self.ledger.reset()  # NOTE: another replica's admin reset: O(tenants), as a reset is
            self._drop_lifts()
        if self._restore or not answer.known and self.changes.sent.mode != WHOLE:  # NOTE: Redis forgot this replica
            self.changes.full = True
        self._epoch, self._seq, self._wseq, self._generation = epoch, answer.since, answer.weights_since, generation
        self._floor = [(f.counter, f.node) for f in answer.floor]
        self._starved = sorted((w.counter, w.tenant, w.pool) for w in answer.waiting)
        self.replicas = answer.replicas
        for b, lease in zip(self.backends, answer.leases, strict=True):
            b.limit = lease.requests
            b.token_limit = lease.tokens if b.cfg.max_inflight_tokens else None
            self._others_wait[b.cfg.url] = (lease.others_wait_requests, lease.others_wait_tokens)

    def _degrade(self) -> None:
        """Redis did not answer: no view of the others, and past the lease an equal share of each backend."""
        self._floor = []
        self._starved = []
        if self.clock() >= self.lease_until:
            # NOTE: the others stop counting this replica's leases now; with no view of them, an equal share
            n = max(self.replicas, 1)
            for b in self.backends:
                b.limit = max(1, b.cfg.max_inflight_requests // n)
                b.token_limit = max(1, b.cfg.max_inflight_tokens // n) if b.cfg.max_inflight_tokens else None
        self.on_change()

    def status(self) -> dict[str, Any]:
        """For /healthz."""
        return {
            "url": redact(self.settings.url),
            "up": self.up,
            "degraded": not self.up,
            "replica": self.replica,
            "replicas": self.replicas,
            "round_trips": self.round_trips,
            "last_sync_age_s": round(self.clock() - self.last_sync, 3) if self.last_sync else None,
            "waiting_for_capacity": self.up and bool(self._sent_starved),  # as the last sync reported it
            # each backend's limit (over all replicas) and this replica's lease of it
            "backends": [
                {
                    "url": redact(b.cfg.url),
                    "limit_requests": b.cfg.max_inflight_requests,
                    "lease_requests": b.limit,
                    "limit_tokens": b.cfg.max_inflight_tokens,
                    "lease_tokens": b.token_limit,
                }
                for b in self.backends
            ],
        }
