"""Loading real request traces: fairserve CSV/JSONL, Azure LLM inference, BurstGPT, Mooncake.

See docs/workloads.md for the formats and the rules (dropped rows, client assignment).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from . import trace_files as rec
from .base import Arrival, Workload, WorkloadError

TRACE_FORMATS: tuple[str, ...] = ("auto", "fairserve", "azure", "burstgpt", "mooncake")
DEFAULT_TRACE_CLIENTS = 8


def assign_clients(n_requests: int, clients: int, seed: int) -> list[str]:
    """The seeded rule for traces without client ids: request k (in time order) goes to
    client i with probability proportional to 1/(i+1), using default_rng(seed).

    One uniform draw per request, so a prefix of the trace (``limit``) keeps its clients.
    """
    weights = 1.0 / np.arange(1, clients + 1)
    cdf = np.cumsum(weights / weights.sum())
    u = np.random.default_rng(seed).random(n_requests)
    idx = np.minimum(np.searchsorted(cdf, u, side="right"), clients - 1)
    names = [f"client-{i}" for i in range(clients)]
    return [names[i] for i in idx.tolist()]


def _check_options(fmt: str, clients: int | None, limit: int | None, time_scale: float) -> None:
    if fmt not in TRACE_FORMATS:
        raise WorkloadError(f"unknown trace format {fmt!r}; valid formats: {', '.join(TRACE_FORMATS)}")
    if clients is not None and (isinstance(clients, bool) or not isinstance(clients, int) or clients < 1):
        raise WorkloadError(f"clients must be a positive integer, got {clients!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise WorkloadError(f"limit must be a positive integer, got {limit!r}")
    if not (isinstance(time_scale, (int, float)) and math.isfinite(time_scale) and time_scale > 0):
        raise WorkloadError(f"time_scale must be a positive number, got {time_scale!r}")


def load_trace(
    path: str | os.PathLike[str],
    fmt: str = "auto",
    *,
    clients: int | None = None,
    seed: int = 0,
    limit: int | None = None,
    time_scale: float = 1.0,
) -> Workload:
    """Read a request trace into a Workload named after the file stem.

    fmt: "auto" (from the extension and the header/keys), "fairserve", "azure",
    "burstgpt" or "mooncake". clients/seed: the client-assignment rule for traces
    without client ids (ignored for fairserve traces, which carry them). limit keeps
    the first N requests by time; time_scale divides arrival times (2.0 = twice as fast).
    """
    _check_options(fmt, clients, limit, time_scale)
    path = Path(path)
    text = rec.read_text(path)
    if rec.is_jsonl(path, text):
        fmt, records = rec.jsonl_records(path, text, fmt)
    else:
        fmt, records = rec.csv_records(path, text, fmt)
    t_col, _, p_col, o_col = rec.COLUMNS[fmt]

    rows: list[tuple[Any, ...]] = []  # (time, or azure's (whole seconds, fraction); client or None; prompt; output;
    # prefix)
    dropped = 0
    origin = (math.inf, 0.0)  # azure: the earliest row, dropped or not
    for line, t_raw, c_raw, p_raw, o_raw, extra in records:
        if fmt == "azure":
            stamp = rec.datetime_seconds(path, line, t_col, t_raw)  # (whole seconds, fraction)
            origin = min(origin, stamp)
            when: Any = stamp
        else:
            t = when = rec.number(path, line, t_col, t_raw) / (1000.0 if fmt == "mooncake" else 1.0)
            if t < 0:
                raise WorkloadError(f"{path}:{line}: {t_col} is negative: {t_raw!r}")
        prompt = rec.whole(path, line, p_col, p_raw)
        output = rec.whole(path, line, o_col, o_raw)
        client = None
        if fmt == "fairserve":
            client = str(c_raw).strip()
            if not client:
                raise WorkloadError(f"{path}:{line}: client is empty")
            if prompt < 1 or output < 1:
                raise WorkloadError(f"{path}:{line}: {p_col} and {o_col} must be >= 1, got {prompt} and {output}")
        elif prompt < 1 or output < 1:
            # e.g. BurstGPT failures (0 response tokens): not requests the server completed.
            dropped += 1
            continue
        rows.append((when, client, prompt, output, rec.prefix_segments(path, line, fmt, extra, prompt)))

    if fmt == "azure":  # seconds since the earliest row (the first row of a sorted trace)
        w0, f0 = origin
        rows = [((w - w0) + (f - f0), *rest) for (w, f), *rest in rows]
    if not rows:
        why = f" ({dropped} rows dropped for {p_col} or {o_col} < 1)" if dropped else ""
        raise WorkloadError(f"{path}: trace has no requests{why}")

    rows.sort(key=lambda r: r[0])  # stable: ties keep file order
    if limit is not None:
        rows = rows[:limit]
    if fmt != "fairserve":
        names = assign_clients(len(rows), clients or DEFAULT_TRACE_CLIENTS, seed)
        rows = [(t, name, *rest) for (t, _, *rest), name in zip(rows, names, strict=False)]
    arrivals = [Arrival(t / time_scale, c, p, o, prefix) for t, c, p, o, prefix in rows]
    return Workload(path.stem, arrivals, arrivals[-1].arrival_s)
