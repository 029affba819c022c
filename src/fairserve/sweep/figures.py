"""The sweep's figures: for each swept parameter, one PNG per summary metric against it, one line per policy with
its 95% confidence interval (error bars; a band where the parameter is a number). When other parameters are swept
too, one panel per combination of their values. With no parameter swept but the policy, the policies side by side.
Agg only, no pyplot (as `reproduce`'s figures); the provenance is in each PNG's text chunks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .spec import AXES, DEFAULT
from .table import METRICS, Metric, Provenance, Row

PANEL_IN = (5.6, 3.8)
NAMES = {"kv_tokens": "KV pool (tokens)", "workload": "workload", "weights": "weights", "policy": "policy"}
MAX_COLUMNS = 3
DPI = 110
LOG_SPAN = 100.0  # a metric whose means span this factor is drawn on a log scale


def draw_all(rows: Sequence[Row], swept: Sequence[str], out_dir: Path, prov: Provenance) -> list[str]:
    """Write every figure into `out_dir`; their file names."""
    made = []
    for param in swept or ["policy"]:
        for m in METRICS:
            if m.figure:
                name = f"{param}-{m.name}.png"
                draw(rows, param, [s for s in swept if s != param], m, out_dir / name, prov)
                made.append(name)
    return made


def _values(rows: Sequence[Row], axis: str) -> list[str]:
    i = AXES.index(axis)
    return list(dict.fromkeys(r.group[i] for r in rows))


def draw(rows: Sequence[Row], param: str, others: Sequence[str], m: Metric, path: Path, prov: Provenance) -> Path:
    xi, oi = AXES.index(param), [AXES.index(o) for o in others]
    xs = _values(rows, param)
    numeric = param == "kv_tokens" and DEFAULT not in xs
    positions = [float(x) for x in xs] if numeric else list(range(len(xs)))
    panels = list(dict.fromkeys(tuple(r.group[i] for i in oi) for r in rows))
    policies = _values(rows, "policy")
    cols = min(MAX_COLUMNS, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(PANEL_IN[0] * cols, PANEL_IN[1] * nrows + 0.9), dpi=DPI, layout="constrained")
    axes = fig.subplots(nrows, cols, squeeze=False)
    handles = []
    means = [r.stats[m.name].mean for r in rows if not math.isnan(r.stats[m.name].mean)]
    log_y = bool(means) and min(means) > 0 and max(means) / min(means) >= LOG_SPAN  # NOTE: else small lines go flat
    for k, panel in enumerate(panels):
        ax = axes[k // cols][k % cols]
        for j, policy in enumerate(policies):
            at = {r.group[xi]: r.stats[m.name] for r in rows if r.group[0] == policy and _key(r, oi) == panel}
            px = [positions[i] for i, x in enumerate(xs) if x in at]
            ivs = [at[x] for x in xs if x in at]
            if not ivs:
                continue
            ys = [iv.mean for iv in ivs]
            err = [iv.half if not math.isnan(iv.half) else 0.0 for iv in ivs]
            line = ax.errorbar(px, ys, yerr=err, marker="o", ms=4, capsize=3, lw=1.5, color=f"C{j % 10}")
            if numeric and len(px) > 1:
                ax.fill_between(
                    px,
                    [y - e for y, e in zip(ys, err, strict=True)],
                    [y + e for y, e in zip(ys, err, strict=True)],
                    color=f"C{j % 10}",
                    alpha=0.15,
                    lw=0,
                )
            if k == 0:
                handles.append((line, policy))
        if numeric:
            if max(positions) / min(positions) >= 4:
                ax.set_xscale("log", base=2)
            ax.set_xticks(positions, [f"{int(p):,}" for p in positions])
            ax.minorticks_off()
        else:
            ax.set_xticks(positions, xs, rotation=20 if max(len(x) for x in xs) > 12 else 0)
        ax.set_xlabel(NAMES[param])
        ax.set_ylabel(m.title)
        if log_y:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        if others:
            ax.set_title(", ".join(f"{o} {v}" for o, v in zip(others, panel, strict=True)), fontsize="medium")
    for k in range(len(panels), nrows * cols):
        axes[k // cols][k % cols].set_visible(False)
    fig.suptitle(f"{m.title} vs {NAMES[param]}\nmean over seeds and its 95% confidence interval", fontsize="medium")
    if handles:
        fig.legend(
            [h for h, _ in handles],
            [p for _, p in handles],
            loc="outside lower center",
            ncols=min(len(handles), 6),
            frameon=False,
            fontsize="small",
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "Title": f"{m.title} vs {param}",
        "Software": f"fairserve {prov.version}",
        "Description": "\n".join(prov.lines()),
    }
    try:
        FigureCanvasAgg(fig).print_png(path, metadata=meta)
    finally:
        fig.clear()
    return path


def _key(r: Row, oi: Sequence[int]) -> tuple[str, ...]:
    return tuple(r.group[i] for i in oi)
