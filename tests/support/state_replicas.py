"""Replicas of the shared state, for the tests against a real redis-server: as objects in one process
(tests/test_shared_state*.py: a ledger, backends and a link to Redis, admitting with the gateway's own capacity check,
and a clock the tests step), and as gateways through HTTP in front of fake backends that count what they hold in
flight (`Counted`, `drive`: tests/test_replicas.py, tests/test_replicas_faults.py). The gateway's own schedulers
stepped on the test's clock are tests/support/stepped_replicas.py's."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import httpx

from fairserve.api.server import running_server
from fairserve.core import Ledger, make_policy
from fairserve.gateway.dispatch.pools import Backend, claim
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
