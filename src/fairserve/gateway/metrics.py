"""Prometheus metrics, in a private registry per app. Labels come only from configured tenants and backends."""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .scheduler import Scheduler

P = "fairserve_gateway_"
OUTCOMES = ("ok", "invalid", "rejected", "queue_full", "timeout", "client_disconnected", "backend_error",
            "backend_rejected", "internal_error")
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


def jain_index(values: list[float]) -> float:
    """(Σx)² / (n·Σx²); 1.0 for fewer than two values or all zeros."""
    square = sum(v * v for v in values)
    if len(values) < 2 or square == 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * square)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens of settled requests (backend usage when "
                                     "reported, else the estimate)", ["tenant"], registry=r)
        self.output_tokens = Counter(P + "output_tokens", "Output tokens of settled requests", ["tenant"],
                                     registry=r)
        self.requests = Counter(P + "requests", "Requests by how they ended", ["tenant", "outcome"], registry=r)
        self.queue_wait = Histogram(P + "queue_wait_seconds", "Time from arrival (or requeue) to dispatch",
                                    ["tenant"], buckets=WAIT_BUCKETS, registry=r)
        self._live = _Live()
        r.register(self._live)

    def bind(self, scheduler: Scheduler) -> None:
        self._live.scheduler = scheduler
        for t in scheduler.tenants:          # every configured tenant shows up from the start
            self.prompt_tokens.labels(t)
            self.output_tokens.labels(t)
            self.queue_wait.labels(t)
            for outcome in OUTCOMES:
                self.requests.labels(t, outcome)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _Live(Collector):
    """Values read from the policy and the backends at scrape time."""

    scheduler: Scheduler | None = None

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        s = self.scheduler
        if s is None:
            return
        policy, tenants = s.policy, s.tenants
        counters, service = policy.counters, policy.service
        fam = CounterMetricFamily(P + "service", "Service charged by the policy: w_p*prompt + w_q*output "
                                  "(live; reconciliation may correct it slightly)", labels=["tenant"])
        counter = GaugeMetricFamily(P + "counter", "The policy's virtual counter (service / weight, lifted)",
                                    labels=["tenant"])
        queue = GaugeMetricFamily(P + "queue_length", "Queued requests", labels=["tenant"])
        flying = GaugeMetricFamily(P + "tenant_inflight_requests", "Requests being served", labels=["tenant"])
        weight = GaugeMetricFamily(P + "tenant_weight", "Tenant weight", labels=["tenant"])
        for t in tenants:
            fam.add_metric([t], service.get(t, 0.0))
            counter.add_metric([t], counters.get(t, 0.0))
            queue.add_metric([t], s.queued[t])
            flying.add_metric([t], s.in_flight[t])
            weight.add_metric([t], policy.weight(t))
        yield from (fam, counter, queue, flying, weight)
        backlogged = [t for t in policy.queued_clients() if t in s.queued]
        spread = max(counters.get(t, 0.0) for t in backlogged) - min(counters.get(t, 0.0) for t in backlogged) \
            if backlogged else 0.0
        yield GaugeMetricFamily(P + "backlogged_counter_spread", "Max minus min counter among backlogged tenants",
                                value=spread)
        yield GaugeMetricFamily(P + "jain_index", "Jain's index of weighted service among backlogged tenants",
                                value=jain_index([service.get(t, 0.0) / policy.weight(t) for t in backlogged]))
        reqs = GaugeMetricFamily(P + "backend_inflight_requests", "Requests in flight", labels=["backend"])
        toks = GaugeMetricFamily(P + "backend_inflight_tokens", "Prompt + max_tokens of requests in flight",
                                 labels=["backend"])
        up = GaugeMetricFamily(P + "backend_healthy", "1 if the last attempt reached the backend", labels=["backend"])
        limit = GaugeMetricFamily(P + "backend_limit_requests", "In-flight request limit now (adaptive backends: "
                                  "from the backend's /metrics; else max_inflight_requests)", labels=["backend"])
        for b in s.backends:
            reqs.add_metric([b.url], b.requests)
            toks.add_metric([b.url], b.tokens)
            up.add_metric([b.url], 1.0 if b.healthy else 0.0)
            limit.add_metric([b.url], b.limit)
        yield from (reqs, toks, up, limit)
