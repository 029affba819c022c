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
from .curves import Curves, backlog_runs, charges, covered, group_starts, prepare_curves, run_arrays, time_grid
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
    curves: Curves,
    runs: dict[str, np.ndarray],
    times: np.ndarray,
    window_s: float = 60.0,
    weights: dict[str, float] | None = None,
) -> np.ndarray:
    """`windowed_jain` without the clients x times arrays, for all clients at once, O(events log events). Service is
    read only in windows where a client counts (`_counted`) and its curve changes (from its first token to its
    latest); elsewhere it adds 0 to both sums."""
    k = _window_size(times, window_s)
    n_windows = len(range(0, len(times) - k, k))
    if n_windows == 0:
        return np.array([])
    client, s, e = run_arrays(curves, runs)
    if len(s) == 0:  # no client was ever backlogged
        return np.full(n_windows, np.nan)
    n, counted = _counted(client, s, e, k, n_windows)
    # windows where a client's curve may change, merged per client: client * n_windows + window
    lo = (np.maximum(curves.first_at, 1) - 1) // k
    hi = np.minimum((np.maximum(curves.done_at, 1) - 1) // k, n_windows - 1)
    some = lo <= hi
    key = covered(curves.client[some] * n_windows + lo[some], curves.client[some] * n_windows + hi[some])
    c, w = key // n_windows, key % n_windows
    # ... where it counts: backlogged all window long (in its last run begun by then), or as `_counted` found
    j = np.maximum(np.searchsorted(client * len(times) + s, c * len(times) + w * k, side="right") - 1, 0)
    whole = (client[j] == c) & (s[j] <= w * k) & (e[j] >= w * k + k)
    keep = whole | (np.append(counted, -1)[np.searchsorted(counted, key)] == key)
    c, w = c[keep], w[keep]
    v = curves.at(np.concatenate((c, c)), np.concatenate((w * k + k, w * k)))
    x = v[: len(w)] - v[len(w) :]
    # NOTE: a curve's ramp formula leaves float noise (~1e-16 of its size) where no service happened: not service
    x[np.abs(x) <= 1e-9 * np.abs(v[: len(w)])] = 0.0
    x = x / np.array([(weights or {}).get(name, 1.0) for name in curves.names])[c]
    total, total_sq = (np.bincount(w, weights=y, minlength=n_windows) for y in (x, x * x))
    return np.where(n >= 2, _jain(total, total_sq, n), np.nan)


def _counted(client: np.ndarray, s: np.ndarray, e: np.ndarray, k: int, n_windows: int) -> tuple[np.ndarray, np.ndarray]:
    """How many clients count in each window w (grid points [w k, w k + k]), backlogged at 90% of its points, from
    runs [s, e] sorted by client then time; and, as client * n_windows + w, sorted, those a client's runs cover only
    partly. The windows inside a run (ceil(s / k) to floor(e / k) - 1) count with a difference array; a run covers
    part of at most two, ceil(s / k) - 1 and floor(e / k), whose covered points are summed per client."""
    lo, hi = -(-s // k), e // k
    full_lo, full_hi = np.minimum(lo, n_windows), np.minimum(hi - 1, n_windows - 1)
    full = full_lo <= full_hi
    inside = np.bincount(full_lo[full], minlength=n_windows + 1)
    inside -= np.bincount(full_hi[full] + 1, minlength=n_windows + 1)
    w, r = np.concatenate((lo - 1, hi)), np.tile(np.arange(len(s)), 2)
    part = np.concatenate((np.ones(len(s), dtype=bool), hi != lo - 1)) & (w >= 0) & (w < n_windows)
    w, r = w[part], r[part]
    key = client[r] * n_windows + w
    order = np.argsort(key, kind="stable")
    key, cover = key[order], (np.minimum(e[r], w * k + k) - np.maximum(s[r], w * k) + 1)[order]
    first = group_starts(key)
    covers = np.add.reduceat(cover, first) if len(first) else cover
    counted = key[first][covers / (k + 1) >= 0.9]
    return np.cumsum(inside[:-1]) + np.bincount(counted % n_windows, minlength=n_windows), counted


def client_stats(
    records: Sequence[RequestRecord],
    duration_s: float,
    w_p: float = 1.0,
    w_q: float = 2.0,
    cost: CostFunction | None = None,
) -> dict[str, ClientStats]:
    """Each client's requests, tokens, service and times to first token (clients in name order). All clients at
    once: sums with np.bincount, which adds each client's in record order as a loop over its requests would."""
    h = cost or LinearCost(w_p, w_q)
    index: dict[str, int] = {}
    who = np.array([index.setdefault(r.client, len(index)) for r in records], dtype=np.int64)
    n = len(index)
    code = {"finished": 0, "rejected": 1, "unfinished": 2}
    status = np.array([code.get(r.status, 3) for r in records], dtype=np.int64)
    by_status = np.bincount(who * 4 + status, minlength=4 * n).reshape(n, 4).T
    output = np.bincount(who, weights=[r.output_tokens for r in records], minlength=n)
    served_at = np.flatnonzero([r.first_token_s is not None for r in records])
    served, c = [records[i] for i in served_at.tolist()], who[served_at]
    prompt = np.bincount(c, weights=[r.prompt_tokens for r in served], minlength=n)
    tokens = np.array([r.output_tokens for r in served], dtype=np.int64)
    service = np.bincount(c, weights=charges(h, served, tokens), minlength=n)
    response = np.array([r.first_token_s for r in served], dtype=float) - np.array([r.arrival_s for r in served])
    count = np.bincount(c, minlength=n)
    mean = np.bincount(c, weights=response, minlength=n) / np.maximum(count, 1)
    ordered = response[np.lexsort((response, c))]  # client by client, each sorted
    columns = (*by_status, prompt, output, service, count, mean, *(_percentiles(ordered, count, q) for q in (50, 90)))
    rows = dict(zip(index, zip(*(column.tolist() for column in columns), strict=True), strict=True))
    out = {}
    for name in sorted(rows):
        finished, rejected, unfinished, other, prompt_n, output_n, svc, n_served, mean_s, p50_s, p90_s = rows[name]
        out[name] = ClientStats(
            client=name,
            requests=finished + rejected + unfinished + other,
            finished=finished,
            rejected=rejected,
            unfinished=unfinished,
            prompt_tokens=int(prompt_n),
            output_tokens=int(output_n),
            service=svc,
            service_rate=svc / duration_s if duration_s > 0 else 0.0,
            response_mean_s=mean_s if n_served else None,
            response_p50_s=p50_s if n_served else None,
            response_p90_s=p90_s if n_served else None,
        )
    return out


def _percentiles(ordered: np.ndarray, count: np.ndarray, q: float) -> np.ndarray:
    """`np.percentile(x, q)` of each client's x, bit for bit (its default, linear method, and its arithmetic), from
    `ordered`: each client's x in turn, `count` of them, sorted; meaningless where the count is 0."""
    pad = np.append(ordered, 0.0)  # NOTE: a read past a client's values (count 0 or 1) is not used
    start = np.cumsum(count) - count
    at = q / 100 * (count - 1)
    lo = np.floor(at).astype(np.int64)
    a, b = pad[np.clip(start + lo, 0, len(ordered))], pad[np.clip(start + lo + 1, 0, len(ordered))]
    t, diff = at - lo, b - a
    inside = np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)
    return np.where(lo >= count - 1, pad[np.clip(start + count - 1, 0, len(ordered))], inside)


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
