"""A replica's connection to the shared state (Redis), for its life: connecting (one line when Redis cannot be
reached), loading the sync script, the sync task (every `interval_s`, early when woken; every 0.1 s while Redis is
lost), the wake-up listener (pub/sub), one round trip of the script with what it means for being up or degraded,
and leaving. What a sync carries and what its answer does to the ledger is the peer's (`shared_state.py`).

Redis lost: each round trip fails fast (the socket timeout is `max(0.5 s, 10 × interval_s)`), the replica is
degraded (one warning), and the sync task retries every 0.1 s; redis-py's connection pool reconnects on the next
call, to the same Redis or to a restarted one (one warning when it answers again). That a restarted Redis lost its
data is read from the answer's epoch, by the peer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..settings.urls import redact, redact_text
from .scripts import SYNC_LUA

log = logging.getLogger("fairserve.gateway.state")

DEFAULT_INTERVAL_S = 0.02  # how often charges are flushed and global counters pulled
DEFAULT_TTL_S = 3.0  # a silent replica's leases and backlog stop counting after this long
DEFAULT_SPARE = 1  # requests of headroom a replica's lease keeps beyond its demand, so arrivals need no sync
DEFAULT_HOLD_S = 0.5  # after Redis lost its data: no lease grows until every live replica had time to report
RETRY_S = 0.1  # while Redis is lost: how often the sync task tries again


class SharedStateError(Exception):
    """Redis could not be reached or answered nonsense: one line for the operator."""


@dataclass(frozen=True)
class StateSettings:
    url: str  # redis://[:PASSWORD@]HOST:PORT/DB, rediss:// for TLS
    interval_s: float = DEFAULT_INTERVAL_S
    ttl_s: float = DEFAULT_TTL_S
    prefix: str = "fairserve"  # key prefix: one Redis can hold several independent gateway groups
    spare: int = DEFAULT_SPARE
    hold_s: float = DEFAULT_HOLD_S  # several times a degraded replica's retry period (RETRY_S) and interval_s
    # no sync task or wake-up listener: whoever drives the replica calls `sync()` (a test stepping its own clock);
    # the socket timeout is then this many seconds, not 10 intervals
    stepped_timeout_s: float | None = None


def _client(url: str, timeout_s: float, **kw: Any) -> Any:
    """An asyncio Redis client for `url` (nothing connects yet); SharedStateError (one line) for a bad URL."""
    import redis.asyncio as aioredis

    try:
        return aioredis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, **kw)
    except ValueError as e:
        raise SharedStateError(redact_text(f"bad shared state URL {redact(url)!r}: {e}")) from None


async def _ping(client: Any, url: str) -> None:
    from redis.exceptions import RedisError

    try:
        await client.ping()
    except (RedisError, OSError) as e:
        raise SharedStateError(redact_text(f"cannot reach the shared state at {redact(url)}: {e}")) from None


async def probe(url: str, timeout_s: float = 2.0) -> None:
    """PING the shared state once: SharedStateError (one line) when it cannot be reached."""
    client = _client(url, timeout_s)
    try:
        await _ping(client, url)
    finally:
        await client.aclose()


class Link:
    """The connection's life for one replica (`SharedState` is one). A subclass says what a sync is (`sync()`, which
    calls `_round_trip` once or more) and how to leave (`_leave_args()`)."""

    def __init__(self, settings: StateSettings, replica: str, clock: Callable[[], float] | None) -> None:
        self.settings = settings
        # NOTE: injectable, so tests step time instead of sleeping; every replica sharing a Redis must then share it,
        # since it also measures the expiries in Redis (None: time.monotonic here, Redis's own clock there)
        self.clock = clock or time.monotonic
        self._redis_now = clock is not None
        self.replica = replica
        self.up = False  # the last sync reached Redis
        self.round_trips = 0  # syncs sent (each one round trip)
        self.last_sync = 0.0  # self.clock() of the last successful sync
        self.lease_until = 0.0  # self.clock() until which the leases of the last sync surely count
        self._client: Any = None
        self._sync_script: Any = None
        self._task: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._pubsub: Any = None
        self._stopping = False
        self._wake = asyncio.Event()  # set: the sync task syncs now rather than at its next interval

    async def sync(self) -> bool:
        raise NotImplementedError

    def _leave_args(self) -> list[Any]:
        raise NotImplementedError

    async def start(self) -> None:
        """Connect and sync once; SharedStateError (one line) when Redis cannot be reached."""
        url = self.settings.url
        timeout = self.settings.stepped_timeout_s or max(0.5, 10 * self.settings.interval_s)
        self._client = _client(url, timeout, health_check_interval=0)
        self._sync_script = self._client.register_script(SYNC_LUA)
        try:
            await _ping(self._client, url)
        except SharedStateError:
            await self._client.aclose()
            raise
        await self.sync()
        if not self.up:
            raise SharedStateError(f"the shared state at {redact(url)} did not answer a sync")
        if self.settings.stepped_timeout_s is not None:
            return
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run())
        self._listener = loop.create_task(self._listen())

    async def stop(self) -> None:
        """Stop syncing and leave: this replica's leases and backlog stop counting at once (best effort)."""
        if self._task is not None:
            # NOTE: the flag too: Python 3.11's wait_for can swallow a cancel that lands as its wait ends
            self._stopping = True
            self._wake.set()
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._listener is not None:
            self._stopping = True
            # NOTE: closing its connection ends the listener: redis-py's pub/sub read may not end on a cancel
            if self._pubsub is not None:
                await self._pubsub.aclose()
            done, _ = await asyncio.wait({self._listener}, timeout=1.0)
            if not done:
                self._listener.cancel()
            self._listener = None
        if self._client is not None:
            try:
                await self._sync_script(args=self._leave_args())
            except Exception:  # NOTE: leaving is best effort: the TTL ends whatever is left
                pass
            await self._client.aclose()
            self._client = None

    async def _round_trip(self, args: list[Any]) -> list[Any] | None:
        """The sync script once: its answer, or None when Redis did not answer (then degraded, warned once)."""
        sent = self.clock()
        try:
            self.round_trips += 1
            # NOTE: bytes already: the client's own encoding of a sync's ~100 arguments was a third of its CPU
            reply: list[Any] = await self._sync_script(args=[_encoded(a) for a in args])
        except Exception as e:  # NOTE: any failure of Redis degrades to local state; nothing on the request path
            if self.up:
                log.warning(
                    "shared state at %s lost (%s): serving from local state",
                    redact(self.settings.url),
                    redact_text(str(e)),
                )
            self.up = False
            return None
        if not self.up and self.last_sync:
            log.warning("shared state at %s is back", redact(self.settings.url))
        self.up = True
        self.last_sync = self.clock()
        self.lease_until = sent + self.settings.ttl_s
        return reply

    async def _run(self) -> None:
        while not self._stopping:
            try:
                interval = self.settings.interval_s
                # NOTE: not asyncio.wait_for, which on Python 3.11 drops a cancel that lands as the wake-up does
                async with asyncio.timeout(interval if self.up else max(interval, RETRY_S)):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            await self.sync()

    async def _listen(self) -> None:
        """Wake-ups: another replica's sync gave back capacity this replica waits for (pub/sub on `P:wake:REPLICA`),
        so it syncs now rather than at its next interval."""
        client = self._client
        while not self._stopping:
            pubsub = self._pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(f"{self.settings.prefix}:wake:{self.replica}")
                async for _ in pubsub.listen():
                    self._wake.set()
            except Exception:  # NOTE: Redis lost: the sync loop reports it; listen again once it may be back
                if not self._stopping:
                    await asyncio.sleep(RETRY_S)
            finally:
                self._pubsub = None
                await pubsub.aclose()


def _encoded(v: Any) -> bytes:
    """A script argument as the Redis client would send it."""
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode()
    return repr(v).encode()  # NOTE: int and float, as the client's own encoder writes them
