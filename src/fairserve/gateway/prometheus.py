"""The gateway's Prometheus metrics, in a private registry per app. Labels come only from configured tenants and
backends. Per-tenant live values come from the ledger (`tenancy.TenantCollector`); backends' from the scheduler."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..tenancy import TenantCollector

if TYPE_CHECKING:
    from .scheduler import Scheduler

P = "fairserve_gateway_"
OUTCOMES = (
    "ok",
    "invalid",
    "client_timeout",
    "rejected",
    "queue_full",
    "timeout",
    "client_disconnected",
    "backend_error",
    "backend_rejected",
    "shutdown",
    "internal_error",
)
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.prompt_tokens = Counter(
            P + "prompt_tokens",
            "Prompt tokens of settled requests (backend usage when reported, else the estimate)",
            ["tenant"],
            registry=r,
        )
        self.output_tokens = Counter(P + "output_tokens", "Output tokens of settled requests", ["tenant"], registry=r)
        self.requests = Counter(P + "requests", "Requests by how they ended", ["tenant", "outcome"], registry=r)
        self.queue_wait = Histogram(
            P + "queue_wait_seconds",
            "Time from arrival (or requeue) to dispatch",
            ["tenant"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self._backends = _Backends()
        r.register(self._backends)

    def bind(self, scheduler: Scheduler) -> None:
        self._backends.scheduler = scheduler
        self.registry.register(TenantCollector(scheduler, scheduler.tenants, P))
        for t in scheduler.tenants:  # every configured tenant shows up from the start
            self.prompt_tokens.labels(t)
            self.output_tokens.labels(t)
            self.queue_wait.labels(t)
            for outcome in OUTCOMES:
                self.requests.labels(t, outcome)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _Backends(Collector):
    """Each backend's in-flight requests and tokens, health and limit, read at scrape time."""

    scheduler: Scheduler | None = None

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        s = self.scheduler
        if s is None:
            return
        reqs = GaugeMetricFamily(P + "backend_inflight_requests", "Requests in flight", labels=["backend"])
        toks = GaugeMetricFamily(
            P + "backend_inflight_tokens", "Prompt + max_tokens of requests in flight", labels=["backend"]
        )
        up = GaugeMetricFamily(
            P + "backend_healthy",
            "1 if the backend is up (its last health check or request reached it)",
            labels=["backend"],
        )
        limit = GaugeMetricFamily(
            P + "backend_limit_requests",
            "In-flight request limit now (adaptive backends: from the backend's /metrics; else max_inflight_requests)",
            labels=["backend"],
        )
        for b in s.backends:  # NOTE: the URL without credentials: /metrics may be readable by anyone
            reqs.add_metric([b.name], b.requests)
            toks.add_metric([b.name], b.tokens)
            up.add_metric([b.name], 1.0 if b.healthy else 0.0)
            limit.add_metric([b.name], b.limit)
        yield from (reqs, toks, up, limit)
        if s.shared is not None:
            state = GaugeMetricFamily(
                P + "shared_state_up",
                "1 if the last sync with the shared state (Redis) succeeded; 0: serving from local state",
            )
            state.add_metric([], 1.0 if s.shared.up else 0.0)
            yield state
