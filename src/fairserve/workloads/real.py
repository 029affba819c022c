"""The paper's `real` workload: the Chatbot Arena trace (27 clients, 1,500 requests, 10 minutes).

The trace ships with fairserve (`workloads/data/`; from the paper's artifact, Apache-2.0: see NOTICE).
`$FAIRSERVE_ARENA_TRACE` points at another copy instead; a path that does not exist is an error, not a fallback.
"""

from __future__ import annotations

import os
from pathlib import Path

from .base import Workload, WorkloadError
from .synthetic import WORKLOADS, make_workload
from .traces import load_trace

ARENA_TRACE = "arena_27clients_10min.csv"
PACKAGED_ARENA_TRACE = Path(__file__).resolve().parent / "data" / ARENA_TRACE
REAL = "real"


def find_arena_trace() -> Path | None:
    """`$FAIRSERVE_ARENA_TRACE` if set (None if that file does not exist), else the packaged trace."""
    env = os.environ.get("FAIRSERVE_ARENA_TRACE")
    path = Path(env) if env else PACKAGED_ARENA_TRACE
    return path if path.is_file() else None


def get_workload(name: str, seed: int = 0, duration_s: float | None = None) -> Workload:
    """A named synthetic workload, or `real` (the Arena trace)."""
    if name != REAL:
        return make_workload(name, seed=seed, duration_s=duration_s)
    path = find_arena_trace()
    if path is None:
        where = os.environ.get("FAIRSERVE_ARENA_TRACE") or str(PACKAGED_ARENA_TRACE)
        raise WorkloadError(
            f"the 'real' workload needs the Chatbot Arena trace ({ARENA_TRACE}); not found at {where} "
            "(FAIRSERVE_ARENA_TRACE=PATH or --trace FILE names another copy)"
        )
    w = load_trace(path)
    w = Workload(name=REAL, arrivals=w.arrivals, duration_s=600.0)
    if duration_s is not None:
        w = Workload(name=REAL, arrivals=[a for a in w.arrivals if a.arrival_s < duration_s], duration_s=duration_s)
    return w


ALL_WORKLOADS = (*WORKLOADS, REAL)
