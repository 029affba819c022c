"""Replicas of the shared state, for the tests against a real redis-server: as objects in one process
(tests/test_shared_state*.py: a ledger, backends and a link to Redis, admitting with the gateway's own capacity check,
and a clock the tests step), as the gateway's own schedulers stepped on the test's clock (`Stepped`,
tests/test_replicas_clock.py), and as gateways through HTTP in front of fake backends that count what they hold in
flight (`Counted`, `drive`: tests/test_replicas.py, tests/test_replicas_faults.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass

import httpx

from fairserve.api.server import running_server
from fairserve.core import Ledger, make_policy
from fairserve.gateway.admission.footprint import Footprint
from fairserve.gateway.admission.scheduler import Scheduler
from fairserve.gateway.admission.ticket import Ending, Ticket
from fairserve.gateway.dispatch.pools import Backend, claim
from fairserve.gateway.metrics.prometheus import GatewayMetrics
from fairserve.gateway.settings.backends import BackendConfig
from fairserve.gateway.shared.state import SharedState, StateSettings
from support.gateway import FakeBackend, auth, chat_body, config

_prefixes = itertools.count()


class Clock:
    """A clock the test steps (`advance`): the replicas' timers and the expiries in Redis both read it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Replica:
    """A ledger, two backends and a link to the shared state: what a gateway replica holds, without HTTP. Admission
    uses the gateway's own capacity check (`scheduler.claim`)."""

    def __init__(
        self,
        url: str,
        prefix: str,
        limits=((4, None), (4, None)),
        ttl_s: float = 3.0,
        spare: int = 1,
        policy: str = "vtc",
        tenants=("heavy", "light"),
        interval_s: float = 0.01,
        hold_s: float = 0.5,
        clock: Clock | None = None,
        early_syncs: bool = False,
    ) -> None:
        self.early_syncs = early_syncs
        self.backends = [
            Backend(BackendConfig(url=f"http://b{i}", max_inflight_requests=r, max_inflight_tokens=t))
            for i, (r, t) in enumerate(limits)
        ]
        self.state = SharedState(
            StateSettings(url, interval_s=interval_s, ttl_s=ttl_s, prefix=prefix, spare=spare, hold_s=hold_s),
            self.backends,
            tokens_of=lambda r: r.prompt_tokens,
            on_change=self.admit,
            clock=clock,
        )
        self.ledger = Ledger(make_policy(policy), tenants, peers=self.state)
        self.ids = itertools.count()
        self.running = []

    def arrive(self, tenant: str, prompt: int = 10, n: int = 1) -> None:
        for _ in range(n):
            self.ledger.arrive(next(self.ids), tenant, prompt, 10)
        self.admit()

    def _fits(self, req) -> bool:
        req.item = claim(self.backends, req, req.prompt_tokens, self.state, (), self.state.clock())
        return req.item is not None

    def admit(self) -> None:
        """Admit what fits; with `early_syncs`, as the scheduler dispatches: the shared state may then sync early
        (tests that step the syncs by hand leave it off)."""
        self.running += self.ledger.admit(self._fits)
        if self.early_syncs:
            self.state.waiting()

    def finish(self, k: int | None = None) -> None:
        done, self.running = (self.running, []) if k is None else (self.running[:k], self.running[k:])
        for req in done:
            req.item.requests -= 1
            req.item.tokens -= req.prompt_tokens
            self.ledger.output(req, 5)
            self.ledger.settle(req)
        self.admit()

    def counter(self, tenant: str) -> float:
        return self.ledger.accounts[tenant].counter


def prefix() -> str:
    return f"t{next(_prefixes)}"


@contextlib.asynccontextmanager
async def started(redis, n: int = 2, **kw) -> AsyncIterator[list[Replica]]:
    """`n` replicas sharing a key prefix of their own (and a `Clock`, when given as `clock=`), started; stopped on the
    way out, also when the test fails."""
    p = prefix()
    rs = [Replica(redis.url, p, **kw) for _ in range(n)]
    try:
        for r in rs:
            await r.state.start()
        yield rs
    finally:
        for r in rs:
            await r.state.stop()


def run(coro):
    return asyncio.run(coro)


# ---- gateway replicas stepped on the test's clock -----------------------------------------------------------------
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


# ---- gateway replicas through HTTP --------------------------------------------------------------------------------
LIMIT = 2  # requests in flight per backend, over all replicas
TOKENS = 8  # output tokens per request
DELAY_S = 0.01  # per token
HEAVY, LIGHT = 8, 4  # streams: heavy alice on replica 1; light bob, this many on each of replicas 2 and 3


class Counted:
    """A fake backend's ASGI app that counts its POSTs in flight, until the answer is complete: its last byte, or a
    stream's `[DONE]` (what follows is the server closing the response, after the client was answered in full);
    `peak`, the most at once since the test last set it. `fake`: the backend (`fake.paused` stalls its streams)."""

    def __init__(self, fake: FakeBackend) -> None:
        self.fake, self.app, self.now, self.peak = fake, fake.app, 0, 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        self.now += 1
        self.peak = max(self.peak, self.now)
        open_ = [True]

        async def counted_send(message):
            if (
                open_[0]
                and message["type"] == "http.response.body"
                and (not message.get("more_body") or b"[DONE]" in message.get("body", b""))
            ):
                open_[0] = False
                self.now -= 1
            await send(message)

        try:
            await self.app(scope, receive, counted_send)
        finally:
            if open_[0]:
                self.now -= 1


@contextlib.contextmanager
def counted_backends(n: int = 2) -> Iterator[tuple[list[Counted], list[str]]]:
    """`n` fake backends (a token every `DELAY_S`), each `Counted`, served on loopback: (the apps, their URLs)."""
    apps = [Counted(FakeBackend(delay_s=DELAY_S)) for _ in range(n)]
    with contextlib.ExitStack() as stack:
        yield apps, [stack.enter_context(running_server(a)) for a in apps]


def replica_config(urls: list[str], state: str | None = None, ttl_s: float = 1.0):
    """A gateway replica's config: `urls` at `LIMIT` each, sharing `state` (syncs every 10 ms)."""
    return config(
        [{"url": u, "max_inflight_requests": LIMIT} for u in urls],
        state=state,
        state_interval_s=0.01,
        state_ttl_s=ttl_s,
    )


async def stream(c: httpx.AsyncClient, base: str, tenant: str, got: dict[str, list[tuple[float, int]]]) -> int:
    """One streamed request of `tenant` (`TOKENS` output tokens) through the gateway at `base`: its output tokens go
    to `got[tenant]` with their arrival times. Returns the status."""
    async with c.stream(
        "POST", base + "/v1/chat/completions", json=chat_body(TOKENS, stream=True), headers=auth(tenant)
    ) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                doc = json.loads(line[6:])
                n = sum(bool(ch["delta"].get("content")) for ch in doc["choices"])
                if n:
                    got[tenant].append((time.monotonic(), n))
        return r.status_code


async def drive(
    placement: dict[str, list[tuple[str, int]]],
    seconds: float,
    outcomes: list[str] | None = None,
    during: Callable[[], Awaitable[None]] | None = None,
    tokens: int | None = None,
) -> dict[str, list[tuple[float, int]]]:
    """Closed-loop streams: `placement[tenant]` = [(gateway URL, streams)], until `during()` (run meanwhile, its
    waits on conditions) returns, or until the tenants together received `tokens` output tokens; `seconds` is only a
    cap on either, an upper bound (AssertionError if it is reached first). Returns each tenant's output tokens with
    their arrival times; `outcomes` collects how each request ended (ok, or the error)."""
    got: dict[str, list[tuple[float, int]]] = {t: [] for t in placement}
    stop = [time.monotonic() + seconds]

    def going() -> bool:
        if tokens is not None and sum(n for xs in got.values() for _, n in xs) >= tokens:
            return False
        return time.monotonic() < stop[0]

    async def worker(c: httpx.AsyncClient, base: str, tenant: str) -> None:
        while going():
            try:
                status = await stream(c, base, tenant, got)
                if outcomes is not None:
                    outcomes.append("ok" if status == 200 else f"{tenant}: status {status}")
            except httpx.HTTPError as e:
                if outcomes is not None:
                    outcomes.append(f"{tenant}: {type(e).__name__}")
                return  # NOTE: its gateway is gone (the killed replica): this stream stops

    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=200)) as c:
        tasks = [
            asyncio.create_task(worker(c, base, t))
            for t, where in placement.items()
            for base, n in where
            for _ in range(n)
        ]
        if during is None:
            await asyncio.gather(*tasks)
        else:
            try:
                async with asyncio.timeout(seconds):
                    await during()
            except TimeoutError:
                raise AssertionError(f"during() not done in {seconds} s") from None
            finally:
                stop[0] = min(stop[0], time.monotonic())  # NOTE: also when during() failed: the streams end
                await asyncio.gather(*tasks)
    if tokens is not None:
        assert sum(n for xs in got.values() for _, n in xs) >= tokens, f"{tokens} tokens not served in {seconds} s"
    return got


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> float:
    """Wait for the async `check()` to hold, polling every 20 ms; the seconds it took (AssertionError past the
    bound, which is an upper bound on a condition that normally holds within milliseconds to a second: a loaded
    machine only makes it slower)."""
    t0 = time.monotonic()
    while not await check():
        assert time.monotonic() - t0 < timeout_s, f"not within {timeout_s} s: {what}"
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


def settled(metrics: str) -> dict[str, dict[str, float]]:
    """What one replica settled per tenant, from its /metrics text: {tenant: {"ok": requests that ended ok,
    "prompt": prompt tokens, "output": output tokens}} (its own requests only: these are not shared)."""
    out: dict[str, dict[str, float]] = {}
    names = {
        "fairserve_gateway_prompt_tokens_total": "prompt",
        "fairserve_gateway_output_tokens_total": "output",
        "fairserve_gateway_requests_total": "ok",
    }
    for line in metrics.splitlines():
        key, _, value = line.rpartition(" ")
        name, _, labels = key.partition("{")
        if name not in names or 'tenant="' not in labels:
            continue
        if name == "fairserve_gateway_requests_total" and 'outcome="ok"' not in labels:
            continue
        tenant = labels.split('tenant="', 1)[1].split('"', 1)[0]
        row = out.setdefault(tenant, {"ok": 0.0, "prompt": 0.0, "output": 0.0})
        row[names[name]] += float(value)
    return out
