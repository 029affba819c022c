"""One run of a sweep, as a worker runs it (in this process, a local worker process or a Ray task): build the
workload, simulate, summarize. Everything it takes and returns is plain data (picklable)."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ..core import make_cost
from ..metrics import jain_window, summarize
from ..sim import simulate
from ..workloads import Workload, find_arena_trace, get_workload, load_trace
from .spec import Options, Point, Source
from .store import file_sha256, source_digest

REAL = "real"


@dataclass(frozen=True)
class Task:
    point: Point
    workload_sha256: str | None  # the workload file's hash as the sweep saw it (None: no file)
    digest: str  # the sweep's source digest: a worker running other code refuses the run


class WorkerMismatch(RuntimeError):
    """The worker's fairserve code or workload file is not the sweep's."""


def workload_file(source: Source) -> Path | None:
    """The file a source reads (a trace; `real`'s Arena trace), or None for a generated workload."""
    if source.kind == "trace":
        return Path(source.name)
    return find_arena_trace() if source.name == REAL else None


def load_workload(source: Source, seed: int, options: Options, sha256: str | None = None) -> Workload:
    """The run's workload; with `sha256`, the file it reads must have that hash."""
    if sha256 is not None:
        path = workload_file(source)
        if path is None or _sha256(str(path), path.stat().st_mtime_ns) != sha256:
            raise WorkerMismatch(f"{source.label}: the workload file here is not the one the sweep hashed")
    if source.kind == "trace":
        return _trace(source.name, options.trace_format, seed)
    return get_workload(source.name, seed=seed, duration_s=options.duration_s)


@lru_cache(maxsize=4)
def _trace(path: str, fmt: str, seed: int) -> Workload:
    return load_trace(path, fmt, seed=seed)


@lru_cache(maxsize=16)
def _sha256(path: str, mtime_ns: int) -> str:
    return file_sha256(path)


@cache
def own_digest() -> str:
    return source_digest()


def execute(task: Task) -> dict[str, Any]:
    """Run one point; its summary figures, per-client figures and where it ran."""
    if own_digest() != task.digest:
        raise WorkerMismatch(
            f"this worker runs other fairserve code (source digest {own_digest()}, the sweep's {task.digest}); "
            "run the same fairserve on every node"
        )
    p, opts = task.point, task.point.options
    workload = load_workload(p.source, p.seed, opts, task.workload_sha256)
    weights = dict(p.weights) if p.weights is not None else workload.weights
    run = p.sim_options()
    cost = make_cost(run.cost, run.w_p, run.w_q, run.w_cached)
    start = time.perf_counter()
    result = simulate(workload, run, weights=weights)
    window = jain_window(workload.duration_s)  # NOTE: a run shorter than 60 s gets an index too (as `simulate`)
    s = summarize(result.records, workload.duration_s, run.w_p, run.w_q, weights, window_s=window, cost=cost)
    ttft = np.array([r.first_token_s - r.arrival_s for r in result.records if r.first_token_s is not None])
    metrics = {
        "throughput_tok_s": s.output_tokens_per_s,
        "service_per_s": s.service_per_s,
        "max_backlogged_diff": s.max_backlogged_diff,
        "jain_index": s.jain_index,
        "ttft_p90_s": float(np.percentile(ttft, 90)) if len(ttft) else None,
        "ttft_mean_s": float(ttft.mean()) if len(ttft) else None,
        "engine_seconds": result.fleet.engine_seconds if result.fleet is not None else None,
    }
    return {
        "metrics": metrics,
        "max_backlogged_diff_exact": s.max_backlogged_diff_exact,
        "requests": len(workload.arrivals),
        "finished": sum(c.finished for c in s.clients.values()),
        "rejected": sum(c.rejected for c in s.clients.values()),
        "kv_tokens_used": result.config.kv_tokens,
        "duration_s": workload.duration_s,
        "clients": {
            c.client: {"service_rate": c.service_rate, "response_p90_s": c.response_p90_s, "finished": c.finished}
            for c in s.clients.values()
        },
        "wall_s": time.perf_counter() - start,
        "worker": {"host": socket.gethostname(), "pid": os.getpid()},
    }
