"""Active health checks: every `health_interval_s` each backend's `health_path` is read; an answer below 500 means
up (the server is there and answering; a 404 from a server without that path still counts), a 5xx, no connection or
no answer within the timeout means down. A backend marked down by a failed request is checked at once.

The models a backend serves (unless its config names them) are read from its `/v1/models` at start and with each
check that finds it up (gateway/dispatch/pools.py routes by them); an answer that is not a model list leaves them as
they were. Without active checks (`health_interval_s = 0`) the gateway sends nothing of its own to a backend: its
config's `models`, else it serves any model.

No client request is spent finding out that a backend is down or back: while none is up, requests wait in the queue
(`Scheduler.healthy`, `/healthz`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import httpx

from ...api.protocol import parse_json
from ..admission.scheduler import Scheduler
from ..component import Part, ReloadError, cancelled
from ..settings.config import GatewayConfig
from .pools import Backend

log = logging.getLogger("fairserve.gateway")


class HealthMonitor(Part):
    def __init__(self, sched: Scheduler, client: httpx.AsyncClient) -> None:
        self.sched, self.client = sched, client
        self.configure(sched.cfg)
        self._task: asyncio.Task[None] | None = None
        self._now = asyncio.Event()

    def check(self, old: GatewayConfig, new: GatewayConfig) -> None:
        if (old.health_interval_s > 0) != (new.health_interval_s > 0):
            raise ReloadError("health_interval_s changed: only a restart turns active health checks on or off")

    def configure(self, cfg: GatewayConfig) -> None:
        """`cfg`'s path, interval and timeout, from the next check on (a live reload keeps checks on or off)."""
        self.path, self.interval_s = cfg.health_path, cfg.health_interval_s
        self.timeout_s = max(0.5, min(self.interval_s, cfg.connect_timeout_s + 5.0))

    async def start(self) -> None:
        """The models each backend serves, before the first request; then the checks, in a task of their own."""
        await self.discover_all()
        if self.interval_s > 0:
            self.sched.probe = lambda _: self._now.set()
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        await cancelled(self._task)

    async def check_backend(self, b: Backend) -> None:
        """One check of `b`, its result applied."""
        headers = {"authorization": f"Bearer {b.cfg.api_key}"} if b.cfg.api_key else {}
        try:
            resp = await self.client.get(b.url + self.path, headers=headers, timeout=self.timeout_s)
            reason = f"{self.path} answered HTTP {resp.status_code}" if resp.status_code >= 500 else ""
        except httpx.TimeoutException:
            reason = f"{self.path} did not answer within {self.timeout_s:g} s"
        except httpx.HTTPError as e:
            reason = f"{self.path} unreachable ({type(e).__name__})"
        if reason:
            self.sched.backend_down(b, reason)
        else:
            await self.discover(b)
            self.sched.backend_up(b)

    async def discover(self, b: Backend) -> None:
        """Read the models `b` serves from its /v1/models (not if its config names them)."""
        if b.cfg.models:
            return
        headers = {"authorization": f"Bearer {b.cfg.api_key}"} if b.cfg.api_key else {}
        try:
            resp = await self.client.get(b.url + "/v1/models", headers=headers, timeout=self.timeout_s)
            doc = parse_json(resp.content) if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return
        data = doc.get("data") if isinstance(doc, dict) else None
        if isinstance(data, list):
            before = b.models
            b.serves(data)
            if b.models != before:
                log.info("backend %s serves %s", b.name, ", ".join(sorted(b.models or ())) or "no model")

    async def discover_all(self) -> None:
        """At start: every backend's models, within the health check's timeout (with active checks)."""
        await self._within(self.discover, self.sched.backends)

    async def check_all(self, backends: list[Backend]) -> None:
        """`backends` (added by a reload, not yet serving) checked and their models read, within the health check's
        timeout (with active checks)."""
        await self._within(self.check_backend, backends)

    async def _within(self, each: Callable[[Backend], Awaitable[None]], backends: list[Backend]) -> None:
        if self.interval_s <= 0 or not backends:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.timeout_s + 0.5):
                await asyncio.gather(*(each(b) for b in backends))

    async def _run(self) -> None:
        backends = self.sched.backends
        while True:
            self._now.clear()
            try:
                await asyncio.gather(*(self.check_backend(b) for b in backends))
            except Exception as e:  # NOTE: a bug here must not end the checks for good
                log.error("health check: %r", e)
            # NOTE: asyncio.timeout, not wait_for, which on Python 3.11 can swallow stop()'s cancellation
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self._now.wait()
            if self._now.is_set():  # a request found a backend down: check again soon, but not in a busy loop
                await asyncio.sleep(min(0.2, self.interval_s))
