"""Replicas of the shared state as objects in one process, for the tests against a real redis-server
(tests/test_shared_state*.py): a ledger, backends and a link to Redis, admitting with the gateway's own capacity
check, and a clock the tests step."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator

from fairserve.core import Ledger, make_policy
from fairserve.gateway.dispatch.pools import Backend, claim
from fairserve.gateway.settings.backends import BackendConfig
from fairserve.gateway.shared.state import SharedState, StateSettings

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
