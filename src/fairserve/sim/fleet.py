"""A fleet of simulated engines behind one dispatcher (`fairserve simulate --engines N`): the paper's future work
(§C.3), as fairserve's gateway runs it in front of N servers.

One ledger holds the fleet's queue in the policy's order, and the gateway's own dispatch places its requests
(gateway/dispatch/pools.py `Dispatch`: the admission pass, `claim`, least-loaded with capacity per backend, and the
`dispatch` rule of gateway/dispatch/placement.py), on the simulation's clock. Each engine is a `SimEngine` with its
own KV pool and latency model that runs what it is sent in arrival order (FCFS, as a server behind a gateway does);
its capacity, the backend's `max_inflight_tokens`, is its pool, so what it is sent it admits at its next admission
round, and requests wait in the fleet's queue, in the policy's order. The fair share is the gateway's: prompt tokens
are charged at dispatch, output tokens as they are decoded.

The loop moves to the next event: an arrival (it joins the ledger), a finish, an engine ready or let go
(sim/autoscale.py). An engine with nothing queued whose pool holds knows the tick of its next finish
(`SimEngine.next_finish_tick`) and moves there in one run; one with requests of its own queued steps ahead of the
fleet's clock first, in turn. At an event every engine is brought to it (its clock then at most one decode step
past it), the output decoded so far is charged, and the dispatcher runs one admission pass: a decision reads
charges at most one decode step ahead on another engine.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, cast

from ..core import Ledger, make_policy
from ..core.request import RequestState
from .autoscale import Scaling
from .engine import SimEngine
from .prefix_cache import prompt_keys
from .requests import EngineConfig, SimRequest, SimResult, record_of, sim_requests, too_large
from .ticks import FOREVER, at_or_after, seconds

BLOCK_TOKENS = 16  # prefix dispatch: the blocks of a request's prefix (the gateway's, gateway/dispatch/locality.py)

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..gateway.dispatch.placement import Placement
    from ..gateway.dispatch.pools import Backend, Dispatch
    from .latency import LatencyModel

QUEUED, REJECTED = RequestState.QUEUED, RequestState.REJECTED


@dataclass(eq=False, slots=True)
class Ticket:
    """What the gateway's dispatch reads of a queued request (as gateway/admission/ticket.py's)."""

    tokens: int  # the capacity it takes on an engine: its prompt and output
    pool: Any = None
    model: str | None = None
    tried: frozenset[str] = frozenset()
    backend: Any = None  # the engine's backend, once dispatched
    copy: SimRequest | None = None  # the request as its engine runs it
    prefix: tuple[str, ...] = ()  # prefix dispatch: its prompt's blocks, named as the engines' caches name them


@dataclass(eq=False)
class Member:
    """One engine of the fleet, from the moment it is asked for to the moment it is let go."""

    name: str
    engine: SimEngine
    started_s: float  # asked for: it costs from here
    ready_s: float  # it takes requests from here
    stopped_s: float | None = None
    idle_since: float = 0.0  # nothing in flight since (while `running` is empty)
    running: dict[SimRequest, SimRequest] = field(default_factory=dict)  # its request -> the fleet's
    requests: int = 0
    served: float = 0.0  # charged for the requests it finished

    def busy(self) -> bool:
        return bool(self.engine.batch.running or self.engine.ledger.num_queued)


@dataclass(frozen=True)
class EngineReport:
    name: str
    started_s: float
    ready_s: float
    stopped_s: float | None
    busy_s: float
    requests: int
    service: float


@dataclass(frozen=True)
class FleetReport:
    dispatch: str
    engines: list[EngineReport]
    engine_seconds: float  # every engine from asked for to let go (or the run's end): the cost
    counts: list[tuple[float, int]]  # (time, engines up or starting) at each change

    def text(self) -> str:
        """The engines (when each was up, how busy, what it served) and the cost, as `fairserve simulate` prints."""
        lines = [
            f"fleet: {len(self.engines)} engines, dispatch {self.dispatch}, {self.engine_seconds:,.0f} engine-seconds",
            f"  {'engine':<10} {'up (s)':>15} {'busy (s)':>9} {'requests':>9} {'service':>12}",
        ]
        for e in self.engines:
            up = f"{e.started_s:.0f}-{'' if e.stopped_s is None else f'{e.stopped_s:.0f}'}"
            lines.append(f"  {e.name:<10} {up:>15} {e.busy_s:9.0f} {e.requests:9,} {e.service:12,.0f}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """As `--json` writes it (`summary.fleet`)."""
        return {
            "dispatch": self.dispatch,
            "engine_seconds": self.engine_seconds,
            "engines": [asdict(e) for e in self.engines],
            "engines_over_time": [{"t": t, "engines": n} for t, n in self.counts],
        }


class Fleet:
    """`run(arrivals)`: one simulation of the fleet (one instance runs one)."""

    def __init__(
        self,
        ledger: Ledger,
        latency: LatencyModel,
        config: EngineConfig,
        engines: int,
        placement: Placement | None = None,
        scaling: Scaling | None = None,
    ) -> None:
        from ..gateway.dispatch.pools import Dispatch  # NOTE: here: the gateway's package loads its config models

        self.ledger, self.latency, self.config, self.scaling = ledger, latency, config, scaling
        self.t = 0  # the fleet's clock, in ticks (an engine's clock is ahead of it by at most one iteration)
        self.backends: list[Backend] = []  # the dispatcher's list (changed in place, as gateway/dispatch/fleet.py)
        self.draining: list[Backend] = []
        self.pools: Dispatch = Dispatch(self.backends, lambda: ledger, False, lambda: seconds(self.t), placement)
        self.members: list[Member] = []
        self.by_url: dict[str, Member] = {}
        self.counts: list[tuple[float, int]] = []
        self._queue: deque[SimRequest] = deque()  # the fleet's requests in arrival order (the oldest queued first)
        first = engines if scaling is None else min(max(engines, scaling.low), scaling.high)
        for _ in range(first):
            self._ask(ready_after=0.0)
        self._place()

    @property
    def now(self) -> float:
        return seconds(self.t)

    # ---- the fleet's engines -------------------------------------------------------------------------------------
    def _ask(self, ready_after: float) -> Member:
        policy = make_policy("fcfs")  # NOTE: a server behind a gateway runs what it is sent in arrival order
        engine = SimEngine(Ledger(policy), self.latency, self.config)
        engine.clock.t = self.t
        m = Member(f"engine-{len(self.members)}", engine, self.now, self.now + ready_after, idle_since=self.now)
        self.members.append(m)
        self.by_url[self._url(m)] = m
        return m

    @staticmethod
    def _url(m: Member) -> str:
        return f"http://{m.name}"

    def _place(self) -> None:
        """The dispatcher's backends become the engines ready and not let go (the gateway's reload path)."""
        from ..gateway.dispatch import fleet
        from ..gateway.settings.backends import BackendConfig

        cfg = self.config
        configs = [
            BackendConfig(url=self._url(m), max_inflight_requests=cfg.running_max, max_inflight_tokens=cfg.pool_tokens)
            for m in self.members
            if m.stopped_s is None and m.ready_s <= self.now
        ]
        fleet.apply(self, fleet.plan(self, configs))
        self.counts.append((self.now, sum(m.stopped_s is None for m in self.members)))

    def _serving(self) -> list[Member]:
        return [m for m in self.members if m.stopped_s is None and m.ready_s <= self.now]

    # ---- the run -------------------------------------------------------------------------------------------------
    def run(self, arrivals: Iterable, until_s: float | None = None) -> SimResult:
        reqs = sim_requests(arrivals)
        due = [at_or_after(r.arrival_s) for r in reqs]
        horizon = FOREVER if until_s is None else at_or_after(until_s)
        i = 0
        while True:
            busy = [m for m in self.members if m.stopped_s is None and m.busy()]
            # NOTE: an engine with nothing queued whose pool holds knows the tick of its next finish, and runs there
            # in one move when the fleet's next event comes; any other steps ahead of the fleet's clock, in turn
            finish = {m: m.engine.next_finish_tick() for m in busy}
            t_scale = self._next_scaling()
            t = min(due[i] if i < len(reqs) else FOREVER, t_scale, *(k for k in finish.values() if k is not None))
            stepping = [m for m in busy if finish[m] is None and m.engine.clock.t < min(t, horizon)]
            if stepping:
                m = min(stepping, key=lambda m: m.engine.clock.t)
                others = min((o.engine.clock.t for o in stepping if o is not m), default=FOREVER)
                self._run(m, min(t, max(others, m.engine.clock.t + 1), horizon))
                if m.engine.just_finished:
                    self._event(min(m.engine.clock.t, horizon))
                continue
            if t >= FOREVER or t >= horizon:
                break
            while i < len(reqs) and due[i] <= t:
                self._arrive(reqs[i])
                i += 1
            self._event(t, scale=t_scale <= t)
        return self._result(reqs, until_s)

    def _run(self, m: Member, until: int) -> None:
        """`m`'s engine runs up to tick `until` or its first finish."""
        if not m.engine.advance_until(until, to_finish=True):
            m.idle_since = seconds(m.engine.clock.t)

    def _event(self, t: int, scale: bool = False) -> None:
        """At tick `t`: every engine is brought there and its finishes taken, the scaling rule acts, and the
        dispatcher runs one pass over the charges up to date."""
        self.t = max(self.t, t)
        for m in self.members:
            if m.stopped_s is None and m.busy() and m.engine.clock.t < self.t:
                self._run(m, self.t)
        for m in self.members:
            if m.engine.just_finished:
                self._finished(m)
        if scale:
            self._scale()
        self._dispatch()

    def _arrive(self, r: SimRequest) -> None:
        cfg = self.config
        if too_large(cfg, r.prompt_tokens, r.output_tokens) is not None:
            r.state = REJECTED
            return
        pool = self.pools.route(None)
        r.item = t = Ticket(r.prompt_tokens + cfg.prompt_extra_tokens + r.output_tokens, pool)
        if self.pools.placement.prefix_delta is not None:
            own = ("own", r.id) if r.continued_as is None else r.continued_as
            keys = prompt_keys(r.prompt_tokens + cfg.prompt_extra_tokens, BLOCK_TOKENS, own, r.prefix)
            t.prefix = tuple(repr(k) for k in keys)  # NOTE: (the name of its prefix so far, its end)
        if self.ledger.add(r, now=r.arrival_s):
            pool.queued += 1
            self._queue.append(r)

    def _charge(self) -> None:
        """Charge every request in flight for the output its engine decoded so far."""
        output = self.ledger.output
        for m in self.members:
            step = m.engine.batch.step
            for copy, r in m.running.items():
                n = copy.generated_at(step) - r.output_done
                if n > 0:
                    output(r, n)

    def _dispatch(self) -> None:
        """One admission pass of the gateway's dispatcher; each request admitted goes to its engine."""
        self._charge()
        for req in self.pools.admit():
            r = cast(SimRequest, req)  # NOTE: the fleet's ledger holds only SimRequests
            t: Ticket = r.item
            m = self.by_url[t.backend.url]
            copy = SimRequest(
                id=r.id,
                tenant=r.tenant,
                prompt_tokens=r.prompt_tokens,
                max_tokens=r.max_tokens,
                predicted_output=r.predicted_output,
                arrival_s=r.arrival_s,
                output_tokens=r.output_tokens,
                prefix=r.prefix,
                continued_as=r.continued_as,
            )
            if not m.busy():
                m.engine.clock.t = max(m.engine.clock.t, self.t)  # NOTE: an idle engine's clock waited where it was
            m.engine.submit(copy)
            t.copy, m.running[copy] = copy, r
            m.requests += 1

    def _finished(self, m: Member) -> None:
        for copy in m.engine.just_finished:
            r = m.running.pop(copy)
            self.ledger.output(r, copy.generated - r.output_done)
            self.ledger.settle(r)
            m.served += r.charged
            b = r.item.backend
            b.requests -= 1
            b.tokens -= r.item.tokens
        m.engine.just_finished.clear()  # NOTE: taken once
        if not m.running:
            m.idle_since = self.now

    # ---- scaling (sim/autoscale.py) --------------------------------------------------------------------------------
    def _oldest_queued(self) -> SimRequest | None:
        q = self._queue
        while q and q[0].state is not QUEUED:
            q.popleft()
        return q[0] if q else None

    def _next_scaling(self) -> int:
        """The tick of the next scaling event (FOREVER: none)."""
        s = self.scaling
        if s is None:
            return FOREVER
        starting = [m.ready_s for m in self.members if m.stopped_s is None and m.ready_s > self.now]
        if starting:
            return at_or_after(min(starting))
        up = sum(m.stopped_s is None for m in self.members)
        oldest = self._oldest_queued()
        if oldest is not None:
            return at_or_after(oldest.arrival_s + s.wait_s) if up < s.high else FOREVER
        idle = [m.idle_since for m in self.members if m.stopped_s is None and not m.running]
        return at_or_after(min(idle) + s.idle_s) if idle and up > s.low else FOREVER

    def _scale(self) -> None:
        s = self.scaling
        assert s is not None
        now, live = self.now, [m for m in self.members if m.stopped_s is None]
        oldest = self._oldest_queued()
        if oldest is not None and now - oldest.arrival_s >= s.wait_s - 1e-9 and len(live) < s.high:
            if not any(m.ready_s > now for m in live):
                self._ask(ready_after=s.delay_s)
        elif oldest is None and len(live) > s.low:
            idle = [m for m in live if not m.running and m.ready_s <= now and now - m.idle_since >= s.idle_s - 1e-9]
            if idle:
                idle[-1].stopped_s = now  # NOTE: the newest first
        self._place()

    # ---- the result ----------------------------------------------------------------------------------------------
    def _result(self, reqs: list[SimRequest], until_s: float | None) -> SimResult:
        self._charge()
        end = max([self.now, *(seconds(m.engine.clock.t) for m in self.members if m.stopped_s is None)])
        # NOTE: a run to a horizon holds its engines to it (the cost counts them there), a drained one to its end
        up_to = end if until_s is None else max(end, until_s)
        on = {copy: m.engine for m in self.members for copy in m.running}
        # NOTE: as the engine ran it (its times, its output), or as the fleet held it (queued: unfinished; rejected)
        ran = [r.item.copy if isinstance(r.item, Ticket) and r.item.copy is not None else r for r in reqs]
        records = [record_of(r, on[r].batch.step, on[r].now) if r in on else record_of(r, 0, end) for r in ran]
        engines = [
            EngineReport(m.name, m.started_s, m.ready_s, m.stopped_s, m.engine.busy_s, m.requests, m.served)
            for m in self.members
        ]
        cost = sum((m.stopped_s if m.stopped_s is not None else up_to) - m.started_s for m in self.members)
        return SimResult(
            records,
            self.ledger,
            end,
            sum(m.engine.batch.step for m in self.members),
            sum(m.engine.prefills for m in self.members),
            sum(m.engine.preemptions for m in self.members),
            sum(m.engine.busy_s for m in self.members),
            self.config,
            0,
            [r.cached_tokens for r in ran] if self.config.prefix_cache else None,
            FleetReport(self.pools.placement.name, engines, cost, self.counts),
        )
