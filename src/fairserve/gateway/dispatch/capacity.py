"""Adaptive capacity: a backend's in-flight request limit, driven by the backend's own Prometheus `/metrics`.

Why: a request queued inside the backend is out of the fair policy's reach (the backend serves its queue in its own
order), so the gateway should send no more than the backend can run at once and keep the rest in its own queue.
The rule (AIMD, once per scrape, between 1 and the configured `max_inflight_requests`):

- congested (the backend reports waiting/deferred requests, or KV-cache usage >= 0.95): lower the limit to what the
  backend runs, but at most halve it and lower it by at least 1 (multiplicative decrease);
- not congested, the gateway has a queue and this backend is full at the limit: raise the limit by 1 (additive);
- otherwise, keep it. No reading (scrape failed, unknown metrics): the static limit, as without `adaptive`.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ..component import Part, cancelled
from ..settings.config import GatewayConfig
from ..settings.urls import redact, redact_text

if TYPE_CHECKING:
    from ..admission.scheduler import Scheduler
    from .pools import Backend

log = logging.getLogger("fairserve.gateway")

KV_HIGH = 0.95  # KV-cache usage at which a backend is about to queue or preempt
# server -> (waiting, running, KV usage 0..1 or None): the metric names each server exposes, first found wins
SERVERS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "vllm": (
        ("vllm:num_requests_waiting",),
        ("vllm:num_requests_running",),
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ),
    "sglang": (("sglang:num_queue_reqs",), ("sglang:num_running_reqs",), ("sglang:token_usage",)),
    "llama.cpp": (
        ("llamacpp:requests_deferred",),
        ("llamacpp:requests_processing",),
        ("llamacpp:kv_cache_usage_ratio",),
    ),
}


@dataclass(frozen=True)
class Reading:
    server: str
    waiting: float
    running: float
    kv_usage: float | None = None

    @property
    def congested(self) -> bool:
        return self.waiting > 0 or (self.kv_usage is not None and self.kv_usage >= KV_HIGH)


def parse_metrics(text: str) -> Reading | None:
    """The first known server's reading from Prometheus text; None if none is recognised or the text is malformed.
    Samples of one name are summed (several models, data-parallel ranks)."""
    sums: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                sums[s.name] = sums.get(s.name, 0.0) + s.value
    except ValueError:
        return None

    def first(names: tuple[str, ...]) -> float | None:
        return next((sums[n] for n in names if n in sums), None)

    for server, (waiting, running, kv) in SERVERS.items():
        w, r = first(waiting), first(running)
        if w is not None and r is not None:
            return Reading(server, w, r, first(kv))
    return None


def next_limit(limit: int, maximum: int, reading: Reading | None, in_flight: int, backlog: int) -> int:
    """One AIMD step (see the module's docstring). `in_flight`: the gateway's requests on this backend;
    `backlog`: requests queued in the gateway."""
    if reading is None:
        return maximum
    if reading.congested:
        # NOTE: while more than the limit are in flight (sent before a decrease), the backend's queue is ours draining
        if in_flight > limit:
            return limit
        return max(1, min(limit - 1, max(int(reading.running), math.ceil(limit / 2))))
    if backlog > 0 and in_flight >= limit:
        return min(maximum, limit + 1)
    return limit


class CapacityMonitor(Part):
    """Scrapes the adaptive backends every `interval_s` and sets their `Backend.limit`."""

    def __init__(self, sched: Scheduler, client: httpx.AsyncClient, interval_s: float) -> None:
        self.sched, self.client, self.interval_s = sched, client, interval_s
        self.backends: list[Backend] = []
        self._failing: set[str] = set()  # backends whose last scrape gave no reading (logged once)
        self._task: asyncio.Task[None] | None = None
        self._started = False
        self.follow()

    def check(self, old: GatewayConfig, new: GatewayConfig) -> None:
        """Any interval applies live."""

    def configure(self, cfg: GatewayConfig) -> None:
        """From the next scrape on, of the scheduler's adaptive backends (a reload may have changed them)."""
        self.interval_s = cfg.metrics_interval_s
        self.follow()

    async def _read(self, b: Backend) -> Reading | None:
        url = b.cfg.metrics_url or b.url + "/metrics"
        headers = {"authorization": f"Bearer {b.cfg.api_key}"} if b.cfg.api_key else {}
        try:
            resp = await self.client.get(url, headers=headers, timeout=max(1.0, self.interval_s))
            reading = parse_metrics(resp.text) if resp.status_code == 200 else None
            why = f"HTTP {resp.status_code}" if resp.status_code != 200 else "no vLLM, SGLang or llama.cpp metrics"
        except httpx.HTTPError as e:
            reading, why = None, redact_text(f"{type(e).__name__}: {e}")
        if reading is None and b.url not in self._failing:  # NOTE: once per failing streak, not per scrape
            self._failing.add(b.url)
            log.warning(
                "adaptive capacity: no reading from %s (%s); using the static limit %d",
                redact(url),
                why,
                b.cfg.max_inflight_requests,
            )
        elif reading is not None and b.url in self._failing:
            self._failing.discard(b.url)
            log.info("adaptive capacity: reading %s metrics from %s", reading.server, redact(url))
        return reading

    async def step(self) -> None:
        """One scrape of every adaptive backend, then the new limits (and a dispatch, if any limit rose)."""
        readings = await asyncio.gather(*(self._read(b) for b in self.backends))
        backlog = self.sched.pools.num_queued
        rose = False
        for b, reading in zip(self.backends, readings, strict=False):
            new = next_limit(b.limit, b.cfg.max_inflight_requests, reading, b.requests, backlog)
            rose |= new > b.limit
            b.limit = new
        if rose:
            self.sched.dispatch()

    async def _run(self) -> None:
        while True:
            try:
                await self.step()
            except Exception as e:  # noqa: BLE001  NOTE: the gateway keeps serving on the limits it has
                log.error("adaptive capacity: %r", e)
            await asyncio.sleep(self.interval_s)

    def follow(self) -> None:
        """Scrape the scheduler's adaptive backends (again after a reload changed them), once started."""
        self.backends = [b for b in self.sched.backends if b.cfg.adaptive]
        if self._started and self.backends and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def start(self) -> None:
        """Scrape in a task of its own: nothing on the request path."""
        self._started = True
        self.follow()

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancelled(task)
