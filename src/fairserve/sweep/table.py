"""The sweep's tables: every run's summary figures aggregated over seeds (mean and 95% confidence interval), as CSV
and Markdown, and the runs one by one (CSV). Each file opens with the fairserve version, the seeds and the full
configuration."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .spec import AXES, Point, seeds_text
from .stats import Interval, mean_ci
from .store import write_atomic


@dataclass(frozen=True)
class Metric:
    name: str  # the key in a run's metrics
    title: str
    fmt: str  # Markdown cells
    figure: bool  # drawn against each swept parameter


METRICS = (
    Metric("throughput_tok_s", "throughput (output tokens/s)", "{:,.1f}", True),
    Metric("service_per_s", "service/s", "{:,.1f}", False),
    Metric("max_backlogged_diff", "largest backlogged difference", "{:,.0f}", True),
    Metric("jain_index", "Jain's index", "{:.3f}", True),
    Metric("ttft_p90_s", "p90 time to first token (s)", "{:.2f}", True),
    Metric("ttft_mean_s", "mean time to first token (s)", "{:.2f}", False),
    Metric("engine_seconds", "engine-seconds (a fleet's cost)", "{:,.0f}", False),
)
CI_NOTE = (
    "mean over seeds; ci95 = half-width of the 95% confidence interval of the mean "
    "(Student's t, n - 1 degrees of freedom); n = seeds with a value"
)


@dataclass(frozen=True)
class Row:
    group: tuple[str, str, str, str]  # policy, workload, kv_tokens, weights (`spec.AXES`)
    seeds: int
    stats: dict[str, Interval]  # per metric name


@dataclass(frozen=True)
class Provenance:
    """What every result file records."""

    version: str
    commit: str | None
    seeds: tuple[int, ...]
    config: dict[str, Any]
    runs: int

    def lines(self, markdown: bool = False) -> list[str]:
        config = json.dumps(self.config, sort_keys=True)
        return [
            f"fairserve {self.version}" + (f", commit {self.commit}" if self.commit else ""),
            f"seeds: {seeds_text(self.seeds)}; runs: {self.runs}",
            f"config: `{config}`" if markdown else f"config: {config}",
        ]


def aggregate(points: Sequence[Point], results: dict[Point, dict[str, Any]]) -> list[Row]:
    """One row per point without its seed, in grid order."""
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for p in points:
        groups.setdefault(p.group, []).append(results[p]["metrics"])
    return [
        Row(g, len(runs), {m.name: mean_ci([v for r in runs if (v := r.get(m.name)) is not None]) for m in METRICS})
        for g, runs in groups.items()
    ]


def _num(v: float | None) -> str:
    return "" if v is None or math.isnan(v) else repr(float(v))


def write_csv(rows: Sequence[Row], path: Path, prov: Provenance) -> None:
    out = io.StringIO()
    for line in [*prov.lines(), CI_NOTE]:
        out.write(f"# {line}\n")
    w = csv.writer(out, lineterminator="\n")
    w.writerow([*AXES, "seeds", *(f"{m.name}_{k}" for m in METRICS for k in ("mean", "ci95", "n"))])
    for r in rows:
        cells = [[_num(r.stats[m.name].mean), _num(r.stats[m.name].half), r.stats[m.name].n] for m in METRICS]
        w.writerow([*r.group, r.seeds, *(c for cs in cells for c in cs)])
    write_atomic(path, out.getvalue())


def write_runs_csv(points: Sequence[Point], records: dict[Point, dict[str, Any]], path: Path, prov: Provenance) -> None:
    """One row per run (`records`: the store's records, with their key)."""
    out = io.StringIO()
    for line in prov.lines():
        out.write(f"# {line}\n")
    w = csv.writer(out, lineterminator="\n")
    w.writerow([*AXES, "seed", "kv_tokens_used", "requests", "finished", *(m.name for m in METRICS), "key"])
    for p in points:
        r = records[p]["result"]
        extra = [r["kv_tokens_used"], r["requests"], r["finished"]]
        w.writerow([*p.group, p.seed, *extra, *(_num(r["metrics"].get(m.name)) for m in METRICS), records[p]["key"]])
    write_atomic(path, out.getvalue())


def cell(iv: Interval, m: Metric, seeds: int) -> str:
    if iv.n == 0:
        return "—"
    text = m.fmt.format(iv.mean)
    if iv.n > 1:
        text += " ± " + m.fmt.format(iv.half)
    return text + (f" (n={iv.n})" if iv.n < seeds else "")


def markdown(rows: Sequence[Row], prov: Provenance, figures: Sequence[str] = ()) -> str:
    head = [*AXES, "seeds", *(m.title for m in METRICS)]
    lines = [
        "# fairserve sweep",
        "",
        *(f"- {line}" for line in prov.lines(markdown=True)),
        "",
        "Each cell: the mean over seeds ± the half-width of its 95% confidence interval (Student's t, n - 1 degrees "
        "of freedom); (n=k): only k seeds had a value.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(AXES) + "---:|" * (len(head) - len(AXES)),
    ]
    for r in rows:
        cells = [*r.group, str(r.seeds), *(cell(r.stats[m.name], m, r.seeds) for m in METRICS)]
        lines.append("| " + " | ".join(cells) + " |")
    if figures:
        lines += ["", "Figures:", "", *(f"- [{f}]({f})" for f in figures)]
    return "\n".join(lines) + "\n"


def write_markdown(rows: Sequence[Row], path: Path, prov: Provenance, figures: Sequence[str] = ()) -> None:
    write_atomic(path, markdown(rows, prov, figures))
