"""Gateway replicas stepped on the test's clock (`Stepped`, tests/test_replicas_clock.py): each the gateway's own
`Scheduler`, with the real `SharedState` against a real redis-server, in front of backends the test plays step by
step; the clients are closed loops (`Stream`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fairserve.gateway.admission.footprint import Footprint
from fairserve.gateway.admission.scheduler import Scheduler
from fairserve.gateway.admission.ticket import Ending, Ticket
from fairserve.gateway.metrics.prometheus import GatewayMetrics
from fairserve.gateway.shared.state import SharedState, StateSettings
from support.state_replicas import Clock, prefix


def _stepped_scheduler(prefix: str, clock: Clock, hold_s: float) -> type[Scheduler]:
    """The gateway's `Scheduler` whose shared state is the real `SharedState` on the test's clock and key prefix, its
    syncs left to the test (`stepped_timeout_s`: no sync task, no listener; an early sync the replica asks for,
    `waiting`, is made at the next step)."""

    def make(settings: StateSettings, *args, **kw) -> SharedState:
        # NOTE: a generous socket timeout, so that a loaded machine's slow round trip is not read as Redis lost (the
        # 0.5 s of a 20 ms interval failed a run so)
        settings = dataclasses.replace(settings, prefix=prefix, hold_s=hold_s, stepped_timeout_s=600.0)
        return SharedState(settings, *args, clock=clock, **kw)

    return type("SteppedScheduler", (Scheduler,), {"shared_state": staticmethod(make)})


@dataclass
class Stream:
    """A closed-loop client: `tenant` keeps `n` requests outstanding through replica `replica`."""

    replica: int
    tenant: str
    n: int
    start: int = 0  # the step its client starts at


@dataclass
class _Outstanding:
    sched: Scheduler
    ticket: Ticket
    admitted: bool = False  # and charged its prompt
    made: int = 0  # output tokens


class Stepped:
    """Gateway replicas as the gateway runs them, each its real `Scheduler` (ledger, dispatch, capacity check and,
    with `cfg.state`, the real `SharedState` against a real redis-server), in front of backends the test plays step by
    step on its own clock: every request running anywhere gets one output token per step of `step_s`, and ends at
    `output` tokens. Each replica syncs every `every` steps (the sync interval Δ = every·step_s), in order, and at the
    next step when it asked for an early sync. No sleep, no wall clock: a run is the same on any machine.

    Without `cfg.state` the replicas are independent: each its own ledger and the whole of each backend's limit.

    Measured after every step: `history`, what each tenant (and group) was charged over all replicas, from the
    test's own tally (w_p·prompt at admission, w_q per output token); `queued`, each tenant's requests queued over
    all replicas; `views`, each replica's counters as its ledger reads them (the shared ones, with shared state);
    and at every step `running`, the requests in flight on each backend over all replicas.

    `outage=(down, back)`: Redis (`redis`, the `RedisServer` at `cfg.state`) stops before step `down`, and starts
    again, empty, before step `back` (None: it stays down). It stops while nothing is charged (the test's clock stands
    still between steps): every replica first syncs until every charge is in Redis and read by every replica. While it
    is down every sync must fail (each replica degrades as the gateway does: its lease until `cfg.state_ttl_s` after
    its last answered sync, then `limit // replicas` of each backend); once it is back each replica syncs at every step
    until it is answered (the first sync on a pooled connection may find it closed): `rejoined`, the step by which
    every replica was. `hold_s`: how long a Redis that lost its data leases each replica only what it has in flight
    (the gateway's default in an outage; 0 otherwise, as no run without one needs it)."""

    def __init__(
        self,
        cfg,
        n: int,
        streams: list[Stream],
        prompt: int,
        output: int,
        step_s: float = 0.01,
        every: int = 2,
        hold_s: float = 0.0,
        redis=None,
        outage: tuple[int, int | None] | None = None,
    ) -> None:
        self.clock = Clock()
        self.cfg, self.streams, self.prompt, self.output = cfg, streams, prompt, output
        self.step_s, self.every = step_s, every
        self.shared = cfg.state is not None
        assert outage is None or (self.shared and redis is not None and redis.url == cfg.state)
        self.redis, self.outage = redis, outage
        self.down = False  # Redis stopped
        self._restarted = False  # Redis started again
        self.rejoined: int | None = None  # the step by which every replica had synced with Redis again
        self._kind = _stepped_scheduler(prefix(), self.clock, hold_s=hold_s)
        self.replicas = [self._scheduler(cfg.model_copy(deep=True)) for _ in range(n)]
        self.service: dict[str, float] = {}
        self.history: list[dict[str, float]] = []  # `service` after each step
        self.running: dict[str, list[int]] = {b.url: [] for b in cfg.backends}  # per backend, at each step
        self.views: list[list[dict[str, float]]] = []  # per step, per replica: node -> counter
        self.queued: list[dict[str, int]] = []  # per step: tenant -> requests queued over all replicas
        self.final: list[dict[str, float]] = []  # per replica, after the run: node -> service
        self._out: list[_Outstanding] = []

    def _scheduler(self, cfg) -> Scheduler:
        metrics = GatewayMetrics()
        sched = self._kind(cfg, metrics, self.clock)
        metrics.bind(sched)
        return sched

    def _charge(self, node: str, amount: float) -> None:
        parts = node.split("/")
        for k in range(1, len(parts) + 1):  # the tenant and every group above it
            path = "/".join(parts[:k])
            self.service[path] = self.service.get(path, 0.0) + amount

    def _submit(self, sched: Scheduler, tenant: str) -> None:
        t = sched.new_ticket(tenant, Footprint(self.prompt, self.output))
        assert sched.submit(t) is None
        self._out.append(_Outstanding(sched, t))

    def _note_admitted(self) -> None:
        for x in self._out:
            if not x.admitted and x.ticket.admitted.done():
                x.admitted = True
                self._charge(x.ticket.tenant, self.cfg.w_p * self.prompt)

    async def start(self) -> None:
        for sched in self.replicas:
            await sched.start()
        self._arrive(0)

    def _arrive(self, step: int) -> None:
        for s in self.streams:
            if s.start == step:
                for _ in range(s.n):
                    self._submit(self.replicas[s.replica], s.tenant)
        self._note_admitted()

    async def stop(self) -> None:
        for sched in self.replicas:
            await sched.stop()

    async def step(self) -> None:
        """One step: the backends make a token for every running request (those at `output` end, and their
        clients send the next at once), then the syncs due."""
        step = len(self.history)
        if self.outage is not None and step == self.outage[0]:
            await self._freeze()
            self.redis.stop()
            self.down = True
        if self.outage is not None and step == self.outage[1]:
            self.redis.start()  # NOTE: empty: no persistence
            self.down, self._restarted = False, True
        self.clock.advance(self.step_s)
        running = [x for x in self._out if x.admitted]
        for url, counts in self.running.items():
            counts.append(sum(x.ticket.backend.url == url for x in running))
        for x in running:
            x.made += 1
            x.sched.output(x.ticket, 1)
            self._charge(x.ticket.tenant, self.cfg.w_q)
        done = [x for x in running if x.made == self.output]
        self._out = [x for x in self._out if x.made < self.output]
        for x in done:
            assert x.sched.close(x.ticket, Ending("ok", prompt=self.prompt, output=self.output))
            self._submit(x.sched, x.ticket.tenant)
        self._arrive(len(self.history) + 1)
        if self.shared:
            due = len(self.history) % self.every == 0
            rejoining = self._restarted and self.rejoined is None
            for sched in self.replicas:
                early = sched.shared.take_early_sync()  # NOTE: taken (cleared) also when a sync is due anyway
                if due or early or (rejoining and not sched.shared.up):
                    ok = await sched.shared.sync()
                    assert ok != self.down or rejoining, f"a sync {'answered' if ok else 'failed'} at step {step}"
            if rejoining and all(sched.shared.up for sched in self.replicas):
                self.rejoined = step
            self._note_admitted()
        self.history.append(dict(self.service))
        views = [sched.view() for sched in self.replicas]
        self.views.append([{n: v.counter for n, v in {**x.tenants, **x.groups}.items()} for x in views])
        queued: dict[str, int] = {}
        for x in views:
            for n, v in x.tenants.items():
                queued[n] = queued.get(n, 0) + v.queued
        self.queued.append(queued)

    async def _freeze(self) -> None:
        """Every replica syncs, in order, until every charge is in Redis and every replica has read it: two rounds in
        which nothing was admitted (an answer may grow a lease, and a request admitted on it is charged its
        prompt)."""
        for _ in range(10):
            before = sum(x.admitted for x in self._out)
            for _ in range(2):
                for sched in self.replicas:
                    assert await sched.shared.sync()
            self._note_admitted()
            if sum(x.admitted for x in self._out) == before:
                return
        raise AssertionError("the replicas kept admitting while the clock stood still")

    async def run(self, steps: int) -> Stepped:
        """`steps` steps, then (with shared state) every replica syncs twice, in order, so each has every charge:
        `final` is then each replica's view of every node's service."""
        await self.start()
        try:
            for _ in range(steps):
                await self.step()
            for _ in range(2 if self.shared and not self.down else 0):
                for sched in self.replicas:
                    assert await sched.shared.sync()
            views = [sched.view() for sched in self.replicas]
            self.final = [{n: v.service for n, v in {**x.tenants, **x.groups}.items()} for x in views]
        finally:
            await self.stop()
        return self
