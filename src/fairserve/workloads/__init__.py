"""Workloads: the paper's synthetic workloads and loaders for real request traces."""

from .base import DEFAULT_KV_TOKENS, DEFAULT_LATENCY_PROFILE, Arrival, Workload, WorkloadError
from .prefixed import PREFIX_WORKLOADS, prefix_workload
from .real import ALL_WORKLOADS, LOWER_BOUND, find_arena_trace, get_workload
from .synthetic import WORKLOADS, make_workload
from .traces import TRACE_FORMATS, load_trace

__all__ = [
    "ALL_WORKLOADS",
    "LOWER_BOUND",
    "PREFIX_WORKLOADS",
    "prefix_workload",
    "find_arena_trace",
    "get_workload",
    "DEFAULT_KV_TOKENS",
    "DEFAULT_LATENCY_PROFILE",
    "TRACE_FORMATS",
    "WORKLOADS",
    "Arrival",
    "Workload",
    "WorkloadError",
    "load_trace",
    "make_workload",
]
