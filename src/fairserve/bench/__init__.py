"""Load generator: replay a workload against any OpenAI-compatible streaming endpoint, one API key per client,
and measure per-client service, response time, latency, fairness and throughput (see `runner` for what is
measured and how)."""

from .report import (
    bench_document,
    bench_duration,
    e2e_latency_mean,
    format_table,
    summarize_bench,
    write_json,
    write_plots,
)
from .runner import (
    DEFAULT_MODEL,
    DEFAULT_TIMEOUT_S,
    ENDPOINTS,
    BenchRecord,
    endpoint_url,
    resolve_keys,
    run_bench,
    run_bench_async,
)

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_TIMEOUT_S",
    "ENDPOINTS",
    "BenchRecord",
    "bench_document",
    "bench_duration",
    "e2e_latency_mean",
    "endpoint_url",
    "format_table",
    "resolve_keys",
    "run_bench",
    "run_bench_async",
    "summarize_bench",
    "write_json",
    "write_plots",
]
