"""Summaries, the printed table, the JSON document and the plots of a bench run (all times in workload seconds)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..metrics import (
    Summary,
    by_client,
    response_times,
    service_curves,
    service_rates,
    summarize,
    summary_table,
    time_grid,
)
from ..records import RequestRecord

RATE_WINDOW_S = 60.0  # the paper's ±30 s window, shrunk for short runs


def bench_duration(records: Sequence[RequestRecord], workload_duration_s: float) -> float:
    """A bench waits for every request, like `simulate --drain`: the workload's duration or the last event."""
    ends = [t for r in records for t in (r.finish_s, r.last_token_s, r.arrival_s) if t is not None]
    return max([workload_duration_s, *ends])


def summarize_bench(
    records: Sequence[RequestRecord], duration_s: float, weights: Mapping[str, float] | None = None
) -> Summary:
    return summarize(
        records,
        duration_s,
        weights=dict(weights) if weights else None,
        step_s=_step(duration_s),
        window_s=_window(duration_s),
    )


def bench_step(duration_s: float) -> float:
    """The time grid's step of a bench run's summary."""
    return _step(duration_s)


def _step(duration_s: float) -> float:
    return min(1.0, max(duration_s, 1e-3) / 200)


def _window(duration_s: float) -> float:
    return min(RATE_WINDOW_S, max(duration_s / 4, 2 * _step(duration_s)))


def e2e_latency_mean(records: Sequence[RequestRecord]) -> dict[str, float | None]:
    """Mean end-to-end latency (finish - arrival) of each client's finished requests."""
    out: dict[str, float | None] = {}
    for client, rs in by_client(records).items():
        lat = [r.finish_s - r.arrival_s for r in rs if r.status == "finished" and r.finish_s is not None]
        out[client] = float(np.mean(lat)) if lat else None
    return out


def format_table(summary: Summary, records: Sequence[RequestRecord], title: str) -> str:
    lines = [summary_table(summary, title, _window(summary.duration_s), e2e_latency_mean(records))]
    errors = sorted({e for r in records if (e := getattr(r, "error", None))})  # a BenchRecord's
    if errors:
        lines.append(f"{len(errors)} distinct error(s), e.g.: {errors[0]}")
    return "\n".join(lines)


def bench_document(
    summary: Summary, records: Sequence[RequestRecord], meta: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """`{"summary": {...meta, ...Summary}, "requests": [record.to_dict(), ...]}`, as `simulate --json` writes."""
    return {"summary": {**(meta or {}), **summary.to_dict()}, "requests": [r.to_dict() for r in records]}


def write_json(
    path: str | Path, summary: Summary, records: Sequence[RequestRecord], meta: Mapping[str, Any] | None = None
) -> Path:
    out = Path(path)
    out.write_text(json.dumps(bench_document(summary, records, meta), indent=1))
    return out


def write_plots(
    folder: str | Path, records: Sequence[RequestRecord], duration_s: float, label: str, title: str
) -> list[Path]:
    """service_rate.png and response_time.png in `folder` (created), one subplot titled `label`."""
    from ..reproduce import figures  # matplotlib is only needed here

    out = Path(folder)
    times = time_grid(duration_s, _step(duration_s))
    window = _window(duration_s)
    rates = service_rates(service_curves(records, times), times, window)
    rts = response_times(records, times, window)
    return [
        figures.service_rate(out / "service_rate.png", times, {label: rates}, f"{title}: service rate"),
        figures.response_time(out / "response_time.png", times, {label: rts}, f"{title}: response time"),
    ]
