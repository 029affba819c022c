"""Per-client statistics and the run summary that `simulate`, `bench` and `reproduce` print; Jain's index over
backlogged windows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..core.account import SEP, parents
from ..core.cost import CostFunction, LinearCost
from ..core.fairness import jain_index
from ..records import RequestRecord
from .curves import ServiceCurve, backlog_runs, by_client, prepare_curves, time_grid
from .difference import largest_backlogged_difference


@dataclass(frozen=True)
class ClientStats:
    client: str
    requests: int
    finished: int
    rejected: int
    unfinished: int
    prompt_tokens: int  # of admitted requests
    output_tokens: int  # generated
    service: float  # weighted tokens received
    service_rate: float  # service per second over the run
    response_mean_s: float | None  # time to first token
    response_p50_s: float | None
    response_p90_s: float | None


@dataclass(frozen=True)
class Summary:
    duration_s: float
    clients: dict[str, ClientStats]
    output_tokens_per_s: float
    service_per_s: float
    max_backlogged_diff: float  # largest |ΔW_f - ΔW_g| over an interval both were backlogged
    max_backlogged_diff_pair: tuple[str, str] | None
    jain_index: float | None  # mean over windows, among clients backlogged >= 90% of the window
    w_p: float
    w_q: float
    max_backlogged_diff_upper: float | None = None  # proven upper bound; equals max_backlogged_diff when exact
    max_backlogged_diff_exact: bool = True  # False: the search hit its work limit, the value is a bracket

    def to_dict(self) -> dict:
        d = asdict(self)
        d["clients"] = {c: asdict(s) for c, s in self.clients.items()}
        return d


def describe_difference(s: Summary) -> str:
    """'2,631 (a vs b)', or, when the search stopped at its work limit, the proven bracket said as such."""
    pair = f" ({' vs '.join(s.max_backlogged_diff_pair)})" if s.max_backlogged_diff_pair else ""
    if s.max_backlogged_diff_exact:
        return f"{s.max_backlogged_diff:,.0f}{pair}"
    return (
        f"between {s.max_backlogged_diff:,.0f}{pair} and {s.max_backlogged_diff_upper:,.0f} "
        f"(estimate: the exact search stopped at its work limit)"
    )


def summary_table(s: Summary, title: str, window_s: float = 60.0, e2e: dict[str, float | None] | None = None) -> str:
    """The run summary `simulate` and `bench` print: a row per client, then throughput, the largest backlogged
    difference and Jain's index (over `window_s` windows); `e2e` adds a column of mean end-to-end latency."""

    def sec(v: float | None, width: int) -> str:
        return f"{v:>{width - 1}.2f}s" if v is not None else f"{'-':>{width}}"

    extra = f"{'e2e mean':>10}" if e2e is not None else ""
    lines = [
        title,
        f"{'client':<14}{'reqs':>6}{'done':>6}{'rej':>6}{'unf':>6}{'service':>11}{'svc/s':>9}"
        f"{'resp mean':>11}{'p50':>8}{'p90':>8}{extra}",
    ]
    for c in s.clients.values():
        lines.append(
            f"{c.client:<14}{c.requests:>6}{c.finished:>6}{c.rejected:>6}{c.unfinished:>6}"
            f"{c.service:>11,.0f}{c.service_rate:>9.1f}{sec(c.response_mean_s, 11)}"
            f"{sec(c.response_p50_s, 8)}{sec(c.response_p90_s, 8)}"
            + (sec(e2e.get(c.client), 10) if e2e is not None else "")
        )
    groups: dict[str, float] = {}
    for c in s.clients.values():
        for g in parents(c.client):
            groups[g] = groups.get(g, 0.0) + c.service
    total = sum(c.service for c in s.clients.values()) or 1.0
    for g in sorted(groups):  # a group's service is its tenants'
        lines.append(f"{'  ' * g.count(SEP)}group {g}: service {groups[g]:,.0f} ({100 * groups[g] / total:.1f}%)")
    jain = f"{s.jain_index:.3f}" if s.jain_index is not None else "n/a (no window with 2 clients backlogged in it)"
    lines += [
        f"throughput: {s.output_tokens_per_s:.1f} output tokens/s, {s.service_per_s:.1f} service/s",
        f"max service difference between backlogged clients: {describe_difference(s)}",
        f"Jain's index ({window_s:.3g} s windows, clients backlogged in them): {jain}",
    ]
    return "\n".join(lines)


def jain_window(duration_s: float, window_s: float = 60.0) -> float:
    """The window of Jain's index for a run of `duration_s`: `window_s`, or a quarter of a shorter run (a 30 s run
    has no 60 s window, and its index would read n/a however many clients were backlogged)."""
    return min(window_s, max(duration_s / 4, 1.0))


jain = jain_index  # the one Jain's index of fairserve (core/fairness.py): summaries, servers, bench


def _jain(total, total_sq, n):
    """`jain_index` over arrays of window sums (Σx, Σx², n), element-wise."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total_sq == 0, 1.0, total**2 / (n * total_sq))


def _window_size(times: np.ndarray, window_s: float) -> int:
    step = times[1] - times[0] if len(times) > 1 else window_s
    return max(1, int(round(window_s / step)))


def windowed_jain(
    curves: dict[str, np.ndarray],
    busy: dict[str, np.ndarray],
    times: np.ndarray,
    window_s: float = 60.0,
    weights: dict[str, float] | None = None,
) -> np.ndarray:
    """Jain's index over the weighted service in consecutive windows, among clients backlogged for at least 90% of
    the window; NaN for windows with fewer than two such clients. Dense (clients x times); `backlogged_jain` is
    the same from runs, in time linear in events."""
    weights = weights or {}
    k = _window_size(times, window_s)
    out = []
    for a in range(0, len(times) - k, k):
        xs = [
            (curves[c][a + k] - curves[c][a]) / weights.get(c, 1.0)
            for c in curves
            if busy[c][a : a + k + 1].mean() >= 0.9
        ]
        out.append(jain(xs) if len(xs) >= 2 else np.nan)
    return np.array(out)


def backlogged_jain(
    curves: dict[str, ServiceCurve],
    runs: dict[str, np.ndarray],
    times: np.ndarray,
    window_s: float = 60.0,
    weights: dict[str, float] | None = None,
) -> np.ndarray:
    """`windowed_jain` without the clients x times arrays. A client counts in a window when its runs cover 90% of
    the window's grid points: whole windows inside a run are counted with a difference array, the few windows a
    run only touches one by one. Service is read only in windows where a client's curve changes (from its first
    token to its latest), elsewhere it adds 0 to both sums. O(events log events)."""
    weights = weights or {}
    k = _window_size(times, window_s)
    n_windows = len(range(0, len(times) - k, k))
    if n_windows == 0:
        return np.array([])
    inside = np.zeros(n_windows + 1, dtype=np.int64)  # difference array: clients backlogged all window long
    touched: dict[int, int] = {}  # window -> clients backlogged >= 90% of it, partly
    at_w, xs = [], []
    for c, curve in curves.items():
        rs = runs[c]
        full_lo = np.minimum(-(-rs[:, 0] // k), n_windows)
        full_hi = np.minimum((rs[:, 1] - k) // k, n_windows - 1)
        full = full_lo <= full_hi
        np.add.at(inside, full_lo[full], 1)
        np.add.at(inside, full_hi[full] + 1, -1)
        partial: dict[int, int] = {}
        for s, e, flo, fhi, f in zip(
            rs[:, 0].tolist(), rs[:, 1].tolist(), full_lo.tolist(), full_hi.tolist(), full.tolist(), strict=False
        ):
            for w in range(max(0, -(-(s - k) // k)), min(n_windows - 1, e // k) + 1):
                if not (f and flo <= w <= fhi):
                    partial[w] = partial.get(w, 0) + min(e, w * k + k) - max(s, w * k) + 1
        counted = {w for w, n in partial.items() if n / (k + 1) >= 0.9}
        for w in counted:
            touched[w] = touched.get(w, 0) + 1
        first, last = curve.changes
        lo = np.maximum(np.maximum(first, 1) - 1, 0) // k
        hi = np.minimum((np.maximum(last, 1) - 1) // k, n_windows - 1)
        spans = [np.arange(a, b + 1) for a, b in zip(lo.tolist(), hi.tolist(), strict=True)]
        ws = np.unique(np.concatenate(spans)) if spans else np.zeros(0)
        ws = ws.astype(np.int64)
        if len(ws) == 0:
            continue
        if len(rs) == 0:
            continue
        j = np.searchsorted(rs[:, 0], ws * k, side="right") - 1
        whole = (j >= 0) & (rs[np.maximum(j, 0), 1] >= ws * k + k)
        ws = ws[whole | np.isin(ws, list(counted))]
        v = curve.at(np.concatenate((ws * k + k, ws * k)))
        at_w.append(ws)
        x = v[: len(ws)] - v[len(ws) :]
        # NOTE: a curve's ramp formula leaves float noise (~1e-16 of its size) where no service happened: not service
        x[np.abs(x) <= 1e-9 * np.abs(v[: len(ws)])] = 0.0
        xs.append(x / weights.get(c, 1.0))
    n = np.cumsum(inside[:-1])
    for w, m in touched.items():
        n[w] += m
    at_w_all = np.concatenate(at_w) if at_w else np.zeros(0, dtype=np.int64)
    x = np.concatenate(xs) if xs else np.zeros(0)
    total = np.bincount(at_w_all, weights=x, minlength=n_windows)
    total_sq = np.bincount(at_w_all, weights=x * x, minlength=n_windows)
    return np.where(n >= 2, _jain(total, total_sq, n), np.nan)


def _percentile(ordered: list[float], q: float) -> float | None:
    """`np.percentile(x, q)` (its default, linear method, and its arithmetic, so bit for bit) of `ordered` (sorted):
    a summary takes two per client, and numpy's call costs ~0.1 ms whatever the size."""
    if not ordered:
        return None
    at = q / 100 * (len(ordered) - 1)
    lo = int(at)
    if lo >= len(ordered) - 1:
        return ordered[-1]
    a, b, t = ordered[lo], ordered[lo + 1], at - lo
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


def client_stats(
    records: Sequence[RequestRecord],
    duration_s: float,
    w_p: float = 1.0,
    w_q: float = 2.0,
    cost: CostFunction | None = None,
) -> dict[str, ClientStats]:
    h = cost or LinearCost(w_p, w_q)
    out = {}
    for client, rs in sorted(by_client(records).items()):
        rt = np.array([r.first_token_s - r.arrival_s for r in rs if r.first_token_s is not None])
        ordered = sorted(rt.tolist())
        served = [r for r in rs if r.first_token_s is not None]
        prompt = sum(r.prompt_tokens for r in served)
        output = sum(r.output_tokens for r in rs)
        service = sum(
            h.total(r.prompt_tokens, r.output_tokens) + h.cached(r.prompt_tokens, r.cached_tokens) for r in served
        )
        out[client] = ClientStats(
            client=client,
            requests=len(rs),
            finished=sum(r.status == "finished" for r in rs),
            rejected=sum(r.status == "rejected" for r in rs),
            unfinished=sum(r.status == "unfinished" for r in rs),
            prompt_tokens=prompt,
            output_tokens=output,
            service=service,
            service_rate=service / duration_s if duration_s > 0 else 0.0,
            response_mean_s=float(rt.mean()) if len(rt) else None,
            response_p50_s=_percentile(ordered, 50),
            response_p90_s=_percentile(ordered, 90),
        )
    return out


def summarize(
    records: Sequence[RequestRecord],
    duration_s: float,
    w_p: float = 1.0,
    w_q: float = 2.0,
    weights: dict[str, float] | None = None,
    step_s: float = 1.0,
    window_s: float = 60.0,
    cost: CostFunction | None = None,
    work_limit: float | None = None,
) -> Summary:
    """Per-client statistics, throughput, the largest backlogged difference and the mean windowed Jain's index, in
    time O(events log events) and memory linear in events (see `largest_backlogged_difference` for its bound)."""
    stats = client_stats(records, duration_s, w_p, w_q, cost)
    times = time_grid(duration_s, step_s)
    curves = prepare_curves(records, times, w_p, w_q, cost)
    runs = backlog_runs(records, times)
    diff = largest_backlogged_difference(curves, runs, weights, work_limit)
    jains = backlogged_jain(curves, runs, times, window_s, weights)
    jains = jains[~np.isnan(jains)]
    total_out = sum(s.output_tokens for s in stats.values())
    total_service = sum(s.service for s in stats.values())
    per_s = (lambda v: v / duration_s) if duration_s > 0 else (lambda v: 0.0)
    return Summary(
        duration_s=duration_s,
        clients=stats,
        output_tokens_per_s=per_s(total_out),
        service_per_s=per_s(total_service),
        max_backlogged_diff=diff.value,
        max_backlogged_diff_pair=diff.pair,
        jain_index=float(jains.mean()) if len(jains) else None,
        w_p=w_p,
        w_q=w_q,
        max_backlogged_diff_upper=diff.upper,
        max_backlogged_diff_exact=diff.exact,
    )
