"""/metrics: vLLM's gauge and counter names (labelled with model_name, as vLLM does) plus the emulator's outcomes.
Values are read from the driver at scrape time, into a registry private to one app."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .driver import Emulator


class EmulatorCollector(Collector):
    def __init__(self, emulator: Emulator) -> None:
        self.emulator = emulator

    def collect(self) -> Iterator[Metric]:
        em = self.emulator
        eng, labels, model = em.engine, ["model_name"], [em.config.model]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(model, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(model, value)
            return c

        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.", len(eng.running))
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", eng.ledger.num_queued)
        yield gauge(
            "vllm:gpu_cache_usage_perc", "KV-cache usage (1 means 100 percent).", eng.kv_used / eng.config.kv_tokens
        )
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", em.prompt_tokens_total)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", em.generation_tokens_total)
        if em.config.prefix_cache:  # NOTE: vLLM's names: tokens looked up in the prefix cache, and found there
            yield counter("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.", em.prefix_queries)
            yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", em.prefix_hits)
        outcomes = CounterMetricFamily("fairserve_emulator_requests", "Requests by how they ended.", labels=["outcome"])
        for outcome, n in sorted(em.outcomes.items()):
            outcomes.add_metric([outcome], n)
        yield outcomes
        yield CounterMetricFamily(
            "fairserve_emulator_cancelled",
            "Requests cancelled in the engine (client disconnect, drop or hang).",
            value=em.cancelled,
        )


def make_registry(emulator: Emulator) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EmulatorCollector(emulator))
    return registry
