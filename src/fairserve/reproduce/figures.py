"""PNG figures for the reproduction report. Agg only, no pyplot: every figure is a private `Figure` (thread/process
safe, nothing global) that is saved and released. Each public function writes `path` and returns it as a `Path`.

Clients keep one colour across the subplots of a figure (assigned from the sorted union of clients). When a figure
has more than `MAX_CLIENTS` clients, the `TOP_CLIENTS` with the most total value (over all subplots) are drawn in
colour and the rest as thin grey lines under one legend entry. Legends sit below the plots so they hide no data.
The line figures are laid out in fixed margins (`_margins`); the bar charts, whose category labels vary, by
constrained layout.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties

WIDTH_IN = 10.0
DPI = 110
MAX_CLIENTS = 10
TOP_CLIENTS = 8
GREY = "#b0b0b0"
_PALETTE = [f"C{i}" for i in range(10)]
PathLike = str | os.PathLike[str]


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _save(fig: Figure, path: PathLike) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        # NOTE: zlib's fastest level: a third of the encoding's CPU for files about a tenth larger
        FigureCanvasAgg(fig).print_png(out, pil_kwargs={"compress_level": 1})
    finally:
        fig.clear()  # no pyplot manager holds it; dropping the references frees it
    return out


LEGEND_COLUMNS = 5


def _legend_below(fig: Figure, handles: list, labels: list[str]) -> None:
    if handles:
        # NOTE: "outside" is constrained layout's; a figure laid out by `_margins` has kept room at its foot
        where: Literal["outside lower center", "lower center"] = (
            "outside lower center" if fig.get_layout_engine() is not None else "lower center"
        )
        fig.legend(handles, labels, loc=where, ncols=min(len(labels), LEGEND_COLUMNS), fontsize="small", frameon=False)


def _text_in(size: str, lines: int = 1) -> float:
    """The height, in inches, of `lines` lines of text at the named font size (matplotlib's line spacing, 1.2)."""
    return lines * 1.2 * FontProperties(size=size).get_size_in_points() / 72


def _margins(fig: Figure, rows: int, cols: int, title_lines: int, suptitle_lines: int, legend_entries: int) -> None:
    """Lay out a grid of line plots (tick labels at most about 7 characters wide, an x label under each plot, a y
    label on the left) in fixed margins from the number of lines of its texts, instead of constrained layout,
    which measures every text and was about a quarter of the reproduce figures' drawing time."""
    width, height = fig.get_size_inches()
    ticks_in, label_in = _text_in("medium") + 0.1, _text_in("medium") + 0.05  # tick labels, with ticks and pads
    title_in = _text_in("large", title_lines) + 0.1
    top = 0.08 + (_text_in("large", suptitle_lines) + 0.05 if suptitle_lines else 0) + title_in
    legend_in = _text_in("small", -(-legend_entries // LEGEND_COLUMNS)) + 0.1 if legend_entries else 0
    bottom = 0.05 + ticks_in + label_in + legend_in
    left, right, between = 0.95, 0.2, 0.25
    plot_w = (width - left - right - between * (cols - 1)) / cols
    plot_h = (height - top - bottom - (ticks_in + label_in + title_in) * (rows - 1)) / rows
    fig.subplots_adjust(
        left=left / width,
        right=1 - right / width,
        top=1 - top / height,
        bottom=bottom / height,
        wspace=between / plot_w,
        hspace=(ticks_in + label_in + title_in) / plot_h,
    )


def _check_series(times: np.ndarray, data: Mapping[str, Mapping[str, np.ndarray]], what: str) -> np.ndarray:
    t = np.asarray(times, dtype=float)
    if t.ndim != 1 or t.size == 0:
        raise ValueError(f"{what}: times must be a non-empty 1-D array, got shape {t.shape}")
    if not data:
        raise ValueError(f"{what}: no policies to plot (empty dict)")
    for policy, clients in data.items():
        if not clients:
            raise ValueError(f"{what}: policy {policy!r} has no clients")
        for client, ys in clients.items():
            if np.shape(ys) != t.shape:
                raise ValueError(f"{what}: {policy}/{client} has shape {np.shape(ys)}, times has {t.shape}")
    return t


def _client_styles(data: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, str | None]:
    """Colour per client, or None for the grey 'other clients'."""
    clients = sorted({c for per in data.values() for c in per})
    if len(clients) <= MAX_CLIENTS:
        return {c: _PALETTE[i % len(_PALETTE)] for i, c in enumerate(clients)}
    total = {c: sum(float(np.nansum(per[c])) for per in data.values() if c in per) for c in clients}
    top = sorted(sorted(clients, key=lambda c: -total[c])[:TOP_CLIENTS])
    return {c: (_PALETTE[top.index(c)] if c in top else None) for c in clients}


def _per_policy_lines(
    times: np.ndarray,
    data: Mapping[str, Mapping[str, np.ndarray]],
    title: str,
    ylabel: str,
    what: str,
    markers: bool = False,
) -> Figure:
    t = _check_series(times, data, what)
    styles = _client_styles(data)
    n = len(data)
    ncols = n if n <= 4 else 3
    nrows = -(-n // ncols)
    fig = Figure(figsize=(WIDTH_IN, 3.2 * nrows + 1.4), dpi=DPI)
    axes = fig.subplots(nrows, ncols, sharey=True, squeeze=False).ravel()
    legend: dict[str, Any] = {}
    others = sum(s is None for s in styles.values())
    kw: dict[str, Any] = {"marker": ".", "markersize": 3} if markers else {}
    for ax, (policy, clients) in zip(axes, data.items(), strict=False):
        for client in sorted(clients, key=lambda c: styles[c] is not None):  # grey first, under the colours
            ys = np.asarray(clients[client], dtype=float)
            colour = styles[client]
            if colour is None:
                (line,) = ax.plot(t, ys, color=GREY, linewidth=0.6, zorder=1, gid=client, **kw)
                legend.setdefault(f"other clients ({others})", line)
            else:
                (line,) = ax.plot(t, ys, color=colour, linewidth=1.4, zorder=2, gid=client, **kw)
                legend.setdefault(client, line)
        ax.set_title(policy)
        ax.set_xlabel("time (s)")
        ax.grid(True, alpha=0.3)
    for ax in axes[n:]:
        ax.set_visible(False)
    for ax in axes[::ncols]:
        ax.set_ylabel(ylabel)
    fig.suptitle(title)
    names = sorted(k for k in legend if not k.startswith("other clients"))
    names += [k for k in legend if k.startswith("other clients")]
    _margins(fig, nrows, ncols, 1, title.count("\n") + 1, len(names))
    _legend_below(fig, [legend[k] for k in names], names)
    return fig


def service_rate(path: PathLike, times: np.ndarray, rates: dict[str, dict[str, np.ndarray]], title: str) -> Path:
    """rates[policy][client] = service rate at each time; one subplot per policy, one line per client."""
    return _save(_per_policy_lines(times, rates, title, "service rate (weighted tokens/s)", "service_rate"), path)


def response_time(path: PathLike, times: np.ndarray, rts: dict[str, dict[str, np.ndarray]], title: str) -> Path:
    """rts[policy][client] = windowed mean time to first token (s); NaN (no request in the window) draws a gap."""
    fig = _per_policy_lines(times, rts, title, "response time (s)", "response_time", markers=True)
    return _save(fig, path)


def _accumulated_figure(
    times: np.ndarray, diffs: dict[str, np.ndarray], title: str, bound: float | None, ylabel: str
) -> Figure:
    t = _check_series(times, {"diffs": diffs} if diffs else {}, "accumulated_difference")
    fig = Figure(figsize=(WIDTH_IN, 5.0), dpi=DPI)
    ax = fig.add_subplot()
    for i, (label, ys) in enumerate(diffs.items()):
        ax.plot(t, np.asarray(ys, dtype=float), color=_PALETTE[i % len(_PALETTE)], linewidth=1.4, label=label)
    if bound is not None:
        ax.axhline(bound, color="black", linestyle="--", linewidth=1.2, label=f"bound 2U = {_fmt(bound)}")
    ax.set(title=title, xlabel="time (s)", ylabel=ylabel)
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    _margins(fig, 1, 1, title.count("\n") + 1, 0, len(labels))
    _legend_below(fig, handles, labels)
    return fig


def accumulated_difference(
    path: PathLike,
    times: np.ndarray,
    diffs: dict[str, np.ndarray],
    title: str,
    bound: float | None = None,
    ylabel: str = "service difference (weighted tokens)",
) -> Path:
    """One line per policy (or variant label); a dashed line 'bound 2U = …' when `bound` is given."""
    return _save(_accumulated_figure(times, diffs, title, bound, ylabel), path)


def _bars_figure(
    categories: Sequence[str],
    series: dict[str, list[float]],
    title: str,
    ylabel: str,
    reference: float | None,
    reference_label: str | None,
) -> Figure:
    if not series:
        raise ValueError("bars: no series to plot (empty dict)")
    if not categories:
        raise ValueError("bars: no categories")
    for name, values in series.items():
        if len(values) != len(categories):
            raise ValueError(f"bars: series {name!r} has {len(values)} values for {len(categories)} categories")
    fig = Figure(figsize=(WIDTH_IN, 5.0), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    x = np.arange(len(categories))
    width = 0.8 / len(series)
    small = len(categories) * len(series) > 24
    for i, (name, values) in enumerate(series.items()):
        bars = ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=name, color=_PALETTE[i % 10])
        ax.bar_label(
            bars,
            labels=[_fmt(float(v)) for v in values],
            fontsize=6 if small else 8,
            padding=2,
            rotation=90 if small else 0,
        )
    if reference is not None:
        ax.axhline(
            reference,
            color="black",
            linestyle="--",
            linewidth=1.2,
            label=reference_label or f"reference = {_fmt(reference)}",
        )
    ax.set_xticks(
        x, list(categories), rotation=45 if len(categories) > 8 else 0, ha="right" if len(categories) > 8 else "center"
    )
    ax.margins(y=0.15)
    ax.set(title=title, ylabel=ylabel)
    ax.grid(True, axis="y", alpha=0.3)
    _legend_below(fig, *ax.get_legend_handles_labels())
    return fig


def bars(
    path: PathLike,
    categories: list[str],
    series: dict[str, list[float]],
    title: str,
    ylabel: str,
    reference: float | None = None,
    reference_label: str | None = None,
) -> Path:
    """Grouped bars: one group per category, one bar per series, value labels on top; optional dashed reference."""
    return _save(_bars_figure(categories, series, title, ylabel, reference, reference_label), path)


def _bound_figure(labels: Sequence[str], measured: Sequence[float], bounds: Sequence[float], title: str) -> Figure:
    if not labels:
        raise ValueError("bound_chart: no workloads to plot (empty labels)")
    if not len(labels) == len(measured) == len(bounds):
        raise ValueError(f"bound_chart: {len(labels)} labels, {len(measured)} measured, {len(bounds)} bounds")
    m, b = np.asarray(measured, dtype=float), np.asarray(bounds, dtype=float)
    fig = Figure(figsize=(WIDTH_IN, 1.2 + 0.55 * len(labels) + 0.8), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(labels))
    ax.barh(y - 0.2, b, 0.4, color=GREY, label="theoretical bound 2U")
    ok = m <= b
    ax.barh(y[ok] + 0.2, m[ok], 0.4, color="C2", label="measured max difference (within bound)")
    if (~ok).any():
        ax.barh(y[~ok] + 0.2, m[~ok], 0.4, color="C3", label="measured max difference (ABOVE bound)")
    for yi, mi, bi in zip(y, m, b, strict=False):
        pct = 100 * mi / bi if bi > 0 else float("nan")
        share = "" if np.isnan(pct) else f" ({pct:.0f}% of bound)" if pct >= 1 else f" ({pct:.2g}% of bound)"
        ax.text(mi, yi + 0.2, f" {_fmt(mi)}{share}", va="center", fontsize=8)
        ax.text(bi, yi - 0.2, f" {_fmt(bi)}", va="center", fontsize=8, color="dimgray")
    if (m > 0).all() and (b > 0).all():
        ax.set_xscale("log")
        ax.set_xlim(float(min(m.min(), b.min())) / 3, float(max(m.max(), b.max())) * 5)
    else:
        ax.set_xlim(right=float(max(m.max(), b.max(), 1.0)) * 1.35)
    ax.set_yticks(y, list(labels))
    ax.invert_yaxis()
    ax.set(title=title, xlabel="max service difference (weighted tokens)")
    ax.grid(True, axis="x", alpha=0.3)
    _legend_below(fig, *ax.get_legend_handles_labels())
    return fig


def bound_chart(path: PathLike, labels: list[str], measured: list[float], bounds: list[float], title: str) -> Path:
    """Horizontal bars: measured max difference next to the theoretical bound, per workload."""
    return _save(_bound_figure(labels, measured, bounds, title), path)


Point = tuple[str, float, float]  # (label, x, y)


def _tradeoff_figure(
    panels: Mapping[str, Mapping[str, Sequence[Point]]],
    title: str,
    xlabel: str,
    ylabel: str,
    references: Sequence[tuple[float, str]],
    goals: Mapping[str, tuple[float, float]],
    log: bool = False,
) -> Figure:
    if not panels or not all(lines and all(lines.values()) for lines in panels.values()):
        raise ValueError("tradeoff: no curves to plot")
    names = list(dict.fromkeys(n for lines in panels.values() for n in lines))
    colours = {n: _PALETTE[i % len(_PALETTE)] for i, n in enumerate(names)}
    fig = Figure(figsize=(WIDTH_IN, 5.2), dpi=DPI)
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    legend: dict[str, Any] = {}
    for ax, (panel, lines) in zip(axes, panels.items(), strict=True):
        for name, points in lines.items():
            xs, ys = [p[1] for p in points], [p[2] for p in points]
            (line,) = ax.plot(xs, ys, color=colours[name], linewidth=1.4, marker="o", markersize=5, gid=name)
            legend.setdefault(name, line)
            for k, (label, x, y) in enumerate(points):
                # NOTE: alternate above and below, so that neighbouring points' labels overlap less
                ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4 if k % 2 else -10), fontsize=7)
            if name in goals:
                x0, y1 = goals[name]
                right = max(max(xs), x0) + 0.01
                legend.setdefault(
                    f"{name}: goal",
                    ax.fill_between([x0, right], 0, y1, color=colours[name], alpha=0.12, linewidth=0),
                )
        for value, label in references:
            legend.setdefault(label, ax.axhline(value, color="black", linestyle="--", linewidth=1.2))
        if log and all(p[2] > 0 for points in lines.values() for p in points):
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.set(title=panel, xlabel=xlabel)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel(ylabel)
    fig.suptitle(title)
    _margins(fig, 1, len(panels), 1, title.count("\n") + 1, len(legend))
    _legend_below(fig, list(legend.values()), list(legend))
    return fig


def tradeoff(
    path: PathLike,
    panels: Mapping[str, Mapping[str, Sequence[Point]]],
    title: str,
    xlabel: str,
    ylabel: str,
    references: Sequence[tuple[float, str]] = (),
    goals: Mapping[str, tuple[float, float]] | None = None,
    log: bool = False,
) -> Path:
    """One panel per entry of `panels` (sharing y), one line per curve through its labelled points (x, y), a curve
    keeping its colour across panels; `references`: dashed horizontal lines; `goals`, per curve, the region
    x >= x0, y <= y1 shaded in its colour; `log`: a logarithmic y axis (where every y is positive)."""
    return _save(_tradeoff_figure(panels, title, xlabel, ylabel, references, goals or {}, log), path)


def _steps_figure(
    lines: Mapping[str, Sequence[tuple[float, float]]],
    title: str,
    xlabel: str,
    ylabel: str,
    reference: tuple[float, str],
) -> Figure:
    if not lines or not all(lines.values()):
        raise ValueError("steps: no lines to plot")
    fig = Figure(figsize=(WIDTH_IN, 4.6), dpi=DPI)
    ax = fig.add_subplot()
    for i, (name, points) in enumerate(lines.items()):
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        # NOTE: offset a little each, so that lines at the same count stay apart
        ax.step(
            xs, np.asarray(ys) + 0.04 * i, where="post", color=_PALETTE[i % len(_PALETTE)], linewidth=1.6, label=name
        )
    ax.axhline(reference[0], color="black", linestyle="--", linewidth=1.2, label=reference[1])
    ax.set_ylim(0, reference[0] + 0.8)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    _margins(fig, 1, 1, title.count("\n") + 1, 0, len(labels))
    _legend_below(fig, handles, labels)
    return fig


def steps(
    path: PathLike,
    lines: Mapping[str, Sequence[tuple[float, float]]],
    title: str,
    xlabel: str,
    ylabel: str,
    reference: tuple[float, str],
) -> Path:
    """One step line per entry of `lines` through its (x, y) changes, each held until the next; `reference`: a
    dashed horizontal line (value, label) that also tops the y axis."""
    return _save(_steps_figure(lines, title, xlabel, ylabel, reference), path)
