"""The paper's `real` workload: the Chatbot Arena trace (27 clients, 1,500 requests, 10 minutes).

fairserve does not ship the trace. It is looked up in `$FAIRSERVE_ARENA_TRACE`, then in `shared/traces/` next to the
current directory or next to the source checkout; anything that needs it must say so cleanly when it is absent.
"""
from __future__ import annotations

import os
from pathlib import Path

from .base import Workload, WorkloadError
from .synthetic import WORKLOADS, make_workload
from .traces import load_trace

ARENA_TRACE = "arena_27clients_10min.csv"
REAL = "real"


def find_arena_trace() -> Path | None:
    env = os.environ.get("FAIRSERVE_ARENA_TRACE")
    candidates = [Path(env)] if env else []
    for base in (Path.cwd(), Path(__file__).resolve().parents[3]):
        candidates += [base / "shared" / "traces" / ARENA_TRACE, base.parent / "shared" / "traces" / ARENA_TRACE]
    return next((p for p in candidates if p.is_file()), None)


def get_workload(name: str, seed: int = 0, duration_s: float | None = None) -> Workload:
    """A named synthetic workload, or `real` (the Arena trace, when it can be found)."""
    if name != REAL:
        return make_workload(name, seed=seed, duration_s=duration_s)
    path = find_arena_trace()
    if path is None:
        raise WorkloadError(f"the 'real' workload needs the Chatbot Arena trace ({ARENA_TRACE}), which fairserve "
                            "does not ship; set FAIRSERVE_ARENA_TRACE=PATH or pass --trace FILE")
    w = load_trace(path)
    w = Workload(name=REAL, arrivals=w.arrivals, duration_s=600.0)
    if duration_s is not None:
        w = Workload(name=REAL, arrivals=[a for a in w.arrivals if a.arrival_s < duration_s], duration_s=duration_s)
    return w


ALL_WORKLOADS = (*WORKLOADS, REAL)
