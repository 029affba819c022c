"""The paper's `real` workload: the Chatbot Arena trace (27 clients, 1,500 requests, 10 minutes); and `get_workload`,
which serves every named workload: the synthetic ones, `real`, `lower-bound` (§4.1.1's construction), those
with shared prefixes (`workloads/prefixed.py`) and `flood` (a fleet's flooding tenant, `workloads/flood.py`).

The trace ships with fairserve (`workloads/data/`; from the paper's artifact, Apache-2.0: see NOTICE).
`$FAIRSERVE_ARENA_TRACE` points at another copy instead; a path that does not exist is an error, not a fallback.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from .base import Workload, WorkloadError
from .flood import FLOOD, flood_workload
from .prefixed import PREFIX_WORKLOADS, make_prefix_workload
from .synthetic import WORKLOADS, make_workload
from .traces import load_trace

ARENA_TRACE = "arena_27clients_10min.csv"
PACKAGED_ARENA_TRACE = Path(__file__).resolve().parent / "data" / ARENA_TRACE
REAL = "real"
LOWER_BOUND = "lower-bound"


def find_arena_trace() -> Path | None:
    """`$FAIRSERVE_ARENA_TRACE` if set (None if that file does not exist), else the packaged trace."""
    env = os.environ.get("FAIRSERVE_ARENA_TRACE")
    path = Path(env) if env else PACKAGED_ARENA_TRACE
    return path if path.is_file() else None


def get_workload(name: str, seed: int = 0, duration_s: float | None = None) -> Workload:
    """A named synthetic workload, `real` (the Arena trace) or `lower-bound` (§4.1.1's construction, sized for the
    default engine: the A10G preset's pool of 10,000 tokens and its server's tokens; it has no randomness)."""
    if name == LOWER_BOUND:
        # NOTE: imported here: the construction is sized to an engine (sim/), and sim imports workloads
        from ..sim import engine_config
        from ..sim.lower_bound import lower_bound_workload

        if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
            raise WorkloadError(f"workload {name!r}: duration_s must be a positive number")
        config = engine_config()
        return (
            lower_bound_workload(config) if duration_s is None else lower_bound_workload(config, duration_s=duration_s)
        )
    if name in PREFIX_WORKLOADS:
        return make_prefix_workload(name, seed=seed, duration_s=duration_s)
    if name == FLOOD:
        return flood_workload(seed=seed, duration_s=duration_s)
    if name != REAL:
        if name not in WORKLOADS:  # NOTE: here, where every name is known (synthetic.py knows its own only)
            raise WorkloadError(f"unknown workload {name!r}; valid names: {', '.join(ALL_WORKLOADS)}")
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


ALL_WORKLOADS = (*WORKLOADS, LOWER_BOUND, REAL, *PREFIX_WORKLOADS, FLOOD)
