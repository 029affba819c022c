"""Fairness and performance metrics over request records. Pure functions; no plotting.

Service is the paper's weighted tokens, W = w_p * prompt + w_q * output. A request's prompt counts when its first
token appears (the end of its prefill) and its output tokens are spread evenly from its first to its latest token,
as the paper's artifact does. A client is *backlogged* at time t when it has a request that arrived and was not yet
admitted. Comparisons between clients use service divided by the client's weight.

`summarize` costs O(events log events) in time and O(events) in memory: curves are read only where needed
(`ServiceCurve`), backlog is kept as runs (`backlog_runs`), Jain's index is summed from runs (`backlogged_jain`)
and the largest backlogged difference is found by a bounded exact search (`largest_backlogged_difference`). The
dense clients x times functions (`service_curves`, `backlogged`, `backlogged_difference`, `windowed_jain`) serve
figures and are the test oracles.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from .core.cost import CostFunction, LinearCost
from .core.fairness import jain_index
from .records import RequestRecord


@dataclass(frozen=True)
class ClientStats:
    client: str
    requests: int
    finished: int
    rejected: int
    unfinished: int
    prompt_tokens: int          # of admitted requests
    output_tokens: int          # generated
    service: float              # weighted tokens received
    service_rate: float         # service per second over the run
    response_mean_s: float | None   # time to first token
    response_p50_s: float | None
    response_p90_s: float | None


@dataclass(frozen=True)
class Summary:
    duration_s: float
    clients: dict[str, ClientStats]
    output_tokens_per_s: float
    service_per_s: float
    max_backlogged_diff: float              # largest |ΔW_f - ΔW_g| over an interval both were backlogged
    max_backlogged_diff_pair: tuple[str, str] | None
    jain_index: float | None                # mean over windows, among clients backlogged >= 90% of the window
    w_p: float
    w_q: float
    max_backlogged_diff_upper: float | None = None  # proven upper bound; equals max_backlogged_diff when exact
    max_backlogged_diff_exact: bool = True          # False: the search hit its work limit, the value is a bracket

    def to_dict(self) -> dict:
        d = asdict(self)
        d["clients"] = {c: asdict(s) for c, s in self.clients.items()}
        return d


def describe_difference(s: Summary) -> str:
    """'2,631 (a vs b)', or, when the search stopped at its work limit, the proven bracket said as such."""
    pair = f" ({' vs '.join(s.max_backlogged_diff_pair)})" if s.max_backlogged_diff_pair else ""
    if s.max_backlogged_diff_exact:
        return f"{s.max_backlogged_diff:,.0f}{pair}"
    return (f"between {s.max_backlogged_diff:,.0f}{pair} and {s.max_backlogged_diff_upper:,.0f} "
            f"(estimate: the exact search stopped at its work limit)")


def by_client(records: Sequence[RequestRecord]) -> dict[str, list[RequestRecord]]:
    out: dict[str, list[RequestRecord]] = {}
    for r in records:
        out.setdefault(r.client, []).append(r)
    return out


def time_grid(end_s: float, step_s: float = 1.0) -> np.ndarray:
    return np.arange(0.0, end_s + step_s / 2, step_s)


class ServiceCurve:
    """One client's accumulated service, prepared once and read at any grid points: O(log requests) a point.

    Linear cost: prompt + first token as a step at the first token, the other output tokens as a ramp to the latest
    token. Any other h(x, y): the same step, then h(x, y(t)) with y rising evenly (read request by request)."""

    def __init__(self, served: list[RequestRecord], times: np.ndarray, h: CostFunction) -> None:
        self.times = times
        first = np.array([r.first_token_s for r in served], dtype=float)
        last = np.array([r.last_token_s if r.last_token_s is not None else r.first_token_s for r in served])
        self._steps = _Steps(first, np.array([h.total(r.prompt_tokens, 1) for r in served], dtype=float))
        self._linear = isinstance(h, LinearCost)
        if self._linear:
            ramp = np.array([h.w_q * (r.output_tokens - 1) for r in served], dtype=float)
            flat = (last - first) <= 0
            self._flat = _Steps(first[flat], ramp[flat])
            s, e, a = first[~flat], last[~flat], ramp[~flat]
            slope = a / (e - s)
            self._starts, self._ends = _Edge(s, slope), _Edge(e, slope)
            self.monotone = bool(np.all(self._steps.amount >= 0) and np.all(ramp >= 0))
        else:
            self._served, self._first, self._last, self._h = served, first, last, h
            self.monotone = True        # NOTE: the cost contract (core/cost.py): h is monotone in y
        # grid points at and after which the curve may change: the first token's step to the latest token
        self.changes = (np.searchsorted(times, first, side="left"), np.searchsorted(times, last, side="right"))
        # linear cost: grid points where the sampled curve may bend (it is linear in between), else None
        i1, i2 = self.changes[0], np.searchsorted(times, last, side="left")
        self.bends = np.concatenate((i1 - 1, i1, i2 - 1, i2)) if self._linear else None

    def at(self, idx: np.ndarray) -> np.ndarray:
        """Accumulated service at the grid points `idx` (indices into `times`)."""
        t = self.times[idx]
        if self._linear:
            ramps = self._flat(t)
            ramps = ramps + 1.0 * self._starts(t)
            ramps = ramps + -1.0 * self._ends(t)
            return self._steps(t) + ramps
        return self._steps(t) + self._curved(np.asarray(idx))

    def _curved(self, idx: np.ndarray) -> np.ndarray:
        """Sum over requests of h(x, y(t)) - h(x, 1), y rising evenly from 1 to its output over [first, last]."""
        h, times = self._h, self.times
        total = np.zeros(len(idx))
        lo = np.searchsorted(times, self._first, side="right")
        hi = np.searchsorted(times, self._last, side="right")
        for r, f, l_, a, b in zip(self._served, self._first, self._last, lo, hi):
            x, n = r.prompt_tokens, r.output_tokens
            base = h.total(x, 1)
            inside = (idx >= a) & (idx < b)
            if inside.any():
                y = 1 + (n - 1) * (times[idx[inside]] - f) / (l_ - f)
                total[inside] += np.array([h.total(x, v) for v in y]) - base
            total[idx >= b] += h.total(x, n) - base
        return total


class _Steps:
    """Sum of `amount` over the events at or before a time (events sorted once)."""

    def __init__(self, at: np.ndarray, amount: np.ndarray) -> None:
        order = np.argsort(at, kind="stable")
        self.at, self.amount = at[order], amount[order]
        self.cum = np.concatenate(([0.0], np.cumsum(self.amount)))

    def __call__(self, times: np.ndarray) -> np.ndarray:
        return self.cum[np.searchsorted(self.at, times, side="right")]


class _Edge:
    """sum over ramp edges at or before t of slope * (t - edge)."""

    def __init__(self, edge: np.ndarray, slope: np.ndarray) -> None:
        order = np.argsort(edge, kind="stable")
        self.at = edge[order]
        self.cs = np.concatenate(([0.0], np.cumsum(slope[order])))
        self.cse = np.concatenate(([0.0], np.cumsum((slope * edge)[order])))

    def __call__(self, times: np.ndarray) -> np.ndarray:
        k = np.searchsorted(self.at, times, side="right")
        return times * self.cs[k] - self.cse[k]


def prepare_curves(records: Sequence[RequestRecord], times: np.ndarray, w_p: float = 1.0, w_q: float = 2.0,
                   cost: CostFunction | None = None) -> dict[str, ServiceCurve]:
    """Every client's `ServiceCurve` on the grid `times` (clients in order of first appearance)."""
    h = cost or LinearCost(w_p, w_q)
    return {client: ServiceCurve([r for r in rs if r.first_token_s is not None and r.output_tokens > 0], times, h)
            for client, rs in by_client(records).items()}


def service_curves(records: Sequence[RequestRecord], times: np.ndarray, w_p: float = 1.0,
                   w_q: float = 2.0, cost: CostFunction | None = None) -> dict[str, np.ndarray]:
    """Accumulated service of each client at each time in `times` (sorted). `cost` (any h(x, y)) replaces the
    linear w_p/w_q; output tokens are taken to appear evenly in time, so a request's service at time t is
    h(x, y(t)), which for a non-linear h is not a straight line. Dense: clients x times."""
    every = np.arange(len(times))
    return {c: curve.at(every) for c, curve in prepare_curves(records, times, w_p, w_q, cost).items()}


def service_rates(curves: dict[str, np.ndarray], times: np.ndarray, window_s: float = 60.0) -> dict[str, np.ndarray]:
    """Service per second in a window centred on each time (the paper: ±30 s)."""
    out = {}
    for client, curve in curves.items():
        lo = np.interp(np.clip(times - window_s / 2, times[0], times[-1]), times, curve)
        hi = np.interp(np.clip(times + window_s / 2, times[0], times[-1]), times, curve)
        out[client] = (hi - lo) / window_s
    return out


def response_times(records: Sequence[RequestRecord], times: np.ndarray,
                   window_s: float = 60.0) -> dict[str, np.ndarray]:
    """Mean time to first token of each client's requests whose first token came in a window centred on each
    time (the paper's ±30 s); NaN where there was none."""
    out = {}
    for client, rs in by_client(records).items():
        done = sorted((r.first_token_s, r.first_token_s - r.arrival_s) for r in rs if r.first_token_s is not None)
        at = np.array([d[0] for d in done])
        cum = np.concatenate(([0.0], np.cumsum([d[1] for d in done])))
        lo = np.searchsorted(at, times - window_s / 2, side="left")
        hi = np.searchsorted(at, times + window_s / 2, side="right")
        n = hi - lo
        with np.errstate(invalid="ignore", divide="ignore"):
            out[client] = np.where(n > 0, (cum[hi] - cum[lo]) / np.maximum(n, 1), np.nan)
    return out


def backlog_runs(records: Sequence[RequestRecord], times: np.ndarray) -> dict[str, np.ndarray]:
    """Each client's backlogged stretches on the grid: an (n, 2) array of [first, last] grid indices, in time order.
    O(requests log requests); a grid point is backlogged when a request arrived at or before it and was admitted
    after it (rejected requests never wait)."""
    out = {}
    for client, rs in by_client(records).items():
        waiting = [r for r in rs if r.status != "rejected"]
        arrived = np.sort(np.searchsorted(times, [r.arrival_s for r in waiting], side="left"))
        admitted = np.sort(np.searchsorted(times, [r.admit_s for r in waiting if r.admit_s is not None], side="left"))
        edges = np.unique(np.concatenate((arrived, admitted)))
        edges = edges[edges < len(times)]
        waiting_after = (np.searchsorted(arrived, edges, side="right")
                         - np.searchsorted(admitted, edges, side="right")) > 0
        rise = waiting_after & ~np.concatenate(([False], waiting_after[:-1]))
        fall = ~waiting_after & np.concatenate(([False], waiting_after[:-1]))
        starts = edges[rise]
        ends = np.concatenate((edges[fall] - 1, [len(times) - 1] if len(waiting_after) and waiting_after[-1] else []))
        out[client] = np.column_stack((starts, ends)).astype(np.int64).reshape(-1, 2)
    return out


def backlogged(records: Sequence[RequestRecord], times: np.ndarray) -> dict[str, np.ndarray]:
    """Whether each client had a request waiting for admission at each time (dense: clients x times)."""
    out = {}
    for client, runs in backlog_runs(records, times).items():
        busy = np.zeros(len(times) + 1, dtype=np.int64)
        np.add.at(busy, runs[:, 0], 1)
        np.add.at(busy, runs[:, 1] + 1, -1)
        out[client] = np.cumsum(busy[:-1]) > 0
    return out


def backlogged_difference(curves: dict[str, np.ndarray], busy: dict[str, np.ndarray],
                          weights: dict[str, float] | None = None) -> tuple[np.ndarray, float, tuple[str, str] | None]:
    """For every pair of clients and every stretch of time in which both were backlogged, the service difference
    accumulated since the stretch began (weights applied). Returns the per-time maximum over pairs, the overall
    maximum range (the quantity Theorem 4.4 bounds by 2U), and the pair that reached it. O(clients² × times):
    the test oracle of `largest_backlogged_difference`, and the per-time series of reproduce's figures."""
    weights = weights or {}
    names = sorted(curves)
    norm = {c: curves[c] / weights.get(c, 1.0) for c in names}
    n_t = len(next(iter(curves.values()))) if curves else 0
    series, best, pair = np.zeros(n_t), 0.0, None
    for i, f in enumerate(names):
        for g in names[i + 1:]:
            joint = busy[f] & busy[g]
            if not joint.any():
                continue
            d = norm[f] - norm[g]
            # index of the start of the current joint stretch, for every time
            starts = np.where(joint & ~np.concatenate(([False], joint[:-1])), np.arange(n_t), 0)
            start_idx = np.maximum.accumulate(starts)
            rel = np.where(joint, d - d[start_idx], 0.0)
            series = np.maximum(series, np.abs(rel))
            run_id = np.cumsum(joint & ~np.concatenate(([False], joint[:-1])))[joint]
            vals = d[joint]
            hi = np.full(run_id.max() + 1, -np.inf)
            lo = np.full(run_id.max() + 1, np.inf)
            np.maximum.at(hi, run_id, vals)
            np.minimum.at(lo, run_id, vals)
            spread = float(np.max(hi[1:] - lo[1:]))
            if spread > best:
                best, pair = spread, (f, g)
    return series, best, pair


WORK_PER_EVENT = 40.0      # the exact search's default budget: points read per event (runs, grid points, bends)
MIN_WORK = 1e6             # ... and at least this many (a fraction of a second), so small cases are always exact


@dataclass(frozen=True)
class BackloggedDifference:
    """The largest service difference between two clients over a stretch in which both were backlogged."""

    value: float                        # the largest difference found; the exact maximum when `exact`
    pair: tuple[str, str] | None        # the pair that reached `value` (names sorted), None when it is 0
    upper: float                        # a proven upper bound on the maximum (== value when exact)
    exact: bool


def largest_backlogged_difference(curves: dict[str, ServiceCurve], runs: dict[str, np.ndarray],
                                  weights: dict[str, float] | None = None,
                                  work_limit: float | None = None) -> BackloggedDifference:
    """The overall maximum of `backlogged_difference` (same value, same pair) without visiting every pair.

    Write u = W/weight. For a pair (f, g) and a stretch J in which both were backlogged, the range of
    d = u_f - u_g over J is max over t1 <= t2 in J of d(t2) - d(t1), in the order of the pair where f gains.
    That gain is bounded two ways, for f's run r containing J and g's run q containing J:
      (a) d(t2) - d(t1) = Δu_f - Δu_g <= Δu_f(t1, t2) <= Δu_f(J) <= Δu_f(r)  (service never decreases);
      (b) for any one reference curve ρ(t) shared by all clients, d(t2) - d(t1) =
          [(u_f - ρ)(t2) - (u_f - ρ)(t1)] + [(u_g - ρ)(t1) - (u_g - ρ)(t2)] <= rise(r) + fall(q),
          the largest rise of u_f - ρ over r and the largest fall of u_g - ρ over q.
    Runs are scanned in decreasing bound ub(r) = min(Δu_f(r), rise(r) + the largest fall of another client's
    run); in a run, a partner run is read (exactly, on the grid) only when min(Δu_f(J), rise(r) + fall(q)) can
    reach the best gain found. The scan stops when ub(r) < best: exact. ρ only sets how much is pruned; here it is
    the service per unit weight of backlogged clients (what VTC equalizes). rise/fall are read at the grid points
    where the client's curve changes and their neighbours, where u - ρ can turn (ρ never decreases).
    The work (points read) is bounded by `work_limit`, default WORK_PER_EVENT per event (linear in events, at least
    MIN_WORK); if it runs out, the answer is the best gain found with `upper` the largest ub(r) left: a proven
    bracket, exact=False.
    """
    weights = weights or {}
    names = [c for c in curves if len(runs.get(c, ())) > 0]
    if len(names) < 2:
        return BackloggedDifference(0.0, None, 0.0, True)
    n_t = len(curves[names[0]].times)
    wt = np.array([weights.get(c, 1.0) for c in names])
    client = np.concatenate([np.full(len(runs[c]), i) for i, c in enumerate(names)])
    start = np.concatenate([runs[c][:, 0] for c in names])
    end = np.concatenate([runs[c][:, 1] for c in names])
    # the reference ρ: service of backlogged clients per unit of their weight, accumulated on the grid
    points, values, bends, bent = [], [], [], []
    busy_service, busy_weight = np.zeros(n_t + 1), np.zeros(n_t + 1)
    for i, c in enumerate(names):
        rs, curve = runs[c], curves[c]
        lo, hi = curve.changes
        ch = np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(lo.tolist(), hi.tolist())] or [[]]))
        ch = ch.astype(np.int64)
        ch = ch[(ch >= 1) & (ch < n_t)]
        pts = np.unique(np.concatenate((ch, ch - 1, rs.ravel())))
        v = curve.at(pts) / wt[i]
        points.append(pts)
        values.append(v)
        if curve.bends is None:
            bends.append(pts)
            bent.append(v)
        else:
            b_pts = np.unique(np.concatenate((curve.bends, rs.ravel())))
            b_pts = b_pts[(b_pts >= 0) & (b_pts < n_t)]
            bends.append(b_pts)
            bent.append(curve.at(b_pts) / wt[i])
        j = np.searchsorted(rs[:, 0], ch, side="right") - 1
        busy = (j >= 0) & (rs[np.maximum(j, 0), 1] >= ch)
        k = np.searchsorted(pts, ch)
        np.add.at(busy_service, ch[busy], (v[k] - v[k - 1])[busy] * wt[i])
        np.add.at(busy_weight, rs[:, 0], wt[i])
        np.add.at(busy_weight, rs[:, 1] + 1, -wt[i])
    busy_weight = np.cumsum(busy_weight)[:n_t]
    rho = np.cumsum(np.where(busy_weight > 0, busy_service[:n_t] / np.where(busy_weight > 0, busy_weight, 1), 0))
    gain_all, rise, fall = np.empty(len(start)), np.empty(len(start)), np.empty(len(start))
    at, scale = 0, float(np.abs(rho).max(initial=0.0))
    for i, c in enumerate(names):
        pts, v = points[i], values[i]
        u = v - rho[pts]
        scale = max(scale, float(np.abs(v).max(initial=0.0)))
        for s, e in runs[c].tolist():
            a, b = np.searchsorted(pts, s), np.searchsorted(pts, e, side="right")
            w = u[a:b]
            rise[at] = np.max(w - np.minimum.accumulate(w))
            fall[at] = np.max(np.maximum.accumulate(w) - w)
            gain_all[at] = v[b - 1] - v[a] if curves[c].monotone else np.inf
            at += 1
    keys = np.concatenate([i * (n_t + 1) + pts for i, pts in enumerate(bends)])
    bent = np.concatenate(bent)
    slack = 1e-8 * (scale + 1.0)       # NOTE: float rounding of the bounds, far above their few ulps
    # the largest fall of a run of another client: the top fall, or the runner-up from a different client
    order_fall = np.argsort(-fall, kind="stable")
    top = order_fall[0]
    other = next((r for r in order_fall if client[r] != client[top]), top)
    fall_else = np.where(client == client[top], fall[other], fall[top])
    ub = np.minimum(gain_all, rise + fall_else)
    by_start = np.argsort(start, kind="stable")
    sorted_start = start[by_start]
    if work_limit is None:
        work_limit = max(WORK_PER_EVENT * (len(start) + n_t + len(keys)), MIN_WORK)
    best, pair, work = 0.0, None, 0.0
    for r in np.argsort(-ub, kind="stable"):
        if ub[r] + slack < best:
            return BackloggedDifference(best, pair, best, True)
        if work > work_limit:
            return BackloggedDifference(best, pair, max(best, float(ub[r]) + slack), False)
        f, s, e = int(client[r]), int(start[r]), int(end[r])
        n_cand = np.searchsorted(sorted_start, e - 1, side="right")
        cand = by_start[:n_cand]
        cand = cand[(end[cand] >= s + 1) & (client[cand] != f)]
        lo, hi = np.maximum(start[cand], s), np.minimum(end[cand], e)
        keep = hi > lo
        cand, lo, hi = cand[keep], lo[keep], hi[keep]
        work += n_cand / 16 + len(cand)
        ends = curves[names[f]].at(np.concatenate((lo, hi))) / wt[f]
        bound = np.minimum(ends[len(lo):] - ends[:len(lo)], rise[r] + fall[cand])
        maybe = bound + slack >= best
        if not maybe.any():
            continue
        cand, lo, hi = cand[maybe], lo[maybe], hi[maybe]
        approx = _gains_where_bent(f, client[cand], lo, hi, keys, bent, n_t)
        work += len(cand) + approx.work
        mine = None
        for p in np.argsort(-approx.gain, kind="stable").tolist():     # the likeliest first: best rises at once
            if approx.gain[p] + slack < best:
                break
            a, b, g = int(lo[p]), int(hi[p]), int(client[cand[p]])
            # exactly, on every grid point of the stretch, as `backlogged_difference` reads it
            if mine is None:
                mine = curves[names[f]].at(np.arange(s, e + 1)) / wt[f]
                work += e - s + 1
            d = mine[a - s:b - s + 1] - curves[names[g]].at(np.arange(a, b + 1)) / wt[g]
            gain = float(np.max(d - np.minimum.accumulate(d)))
            work += b - a + 1
            key = tuple(sorted((names[f], names[g])))
            if gain > best or (gain == best and pair is not None and key < pair):
                best, pair = gain, key
    return BackloggedDifference(best, pair, best, True)


@dataclass(frozen=True)
class _Gains:
    gain: np.ndarray
    work: int


def _ranges(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """concatenate(arange(a, b) for a, b in zip(starts, stops)), vectorized."""
    lens = stops - starts
    ends = np.cumsum(lens)
    return np.arange(ends[-1] if len(ends) else 0) - np.repeat(ends - lens - starts, lens)


def _gains_where_bent(f: int, partners: np.ndarray, lo: np.ndarray, hi: np.ndarray, keys: np.ndarray,
                      values: np.ndarray, n_t: int) -> _Gains:
    """For each partner stretch [lo, hi]: max over t1 <= t2 of d(t2) - d(t1), d = u_f - u_partner, read only at the
    stretch's ends and the grid points where f or the partner bend (d is linear in between, so its extremes are
    there). `keys` = client * (n_t + 1) + grid point, sorted, with the curves' `values` there; a curve between
    two of its points is their linear interpolation. Equal to the grid-wide gain up to rounding (the caller
    allows for it)."""
    span = n_t + 1
    seg = np.arange(len(partners))
    parts = [np.column_stack((seg, lo)), np.column_stack((seg, hi))]
    for who in (np.full(len(partners), f), partners):
        a = np.searchsorted(keys, who * span + lo)
        b = np.searchsorted(keys, who * span + hi, side="right")
        at = _ranges(a, b)
        parts.append(np.column_stack((np.repeat(seg, b - a), keys[at] - np.repeat(who * span, b - a))))
    both = np.concatenate(parts)
    both = both[np.argsort(both[:, 0] * span + both[:, 1], kind="stable")]
    s, x = both[:, 0], both[:, 1]
    d = _interpolate(keys, values, f * span + x) - _interpolate(keys, values, partners[s] * span + x)
    # segmented running minimum: each segment shifted below all the ones before it
    shift = 4.0 * (float(np.abs(d).max(initial=0.0)) + 1.0)
    shifted = d - shift * s
    rise = shifted - np.minimum.accumulate(shifted)
    first = np.searchsorted(s, seg)
    return _Gains(np.maximum.reduceat(rise, first) if len(first) else np.zeros(0), len(d))


def _interpolate(keys: np.ndarray, values: np.ndarray, at: np.ndarray) -> np.ndarray:
    k = np.minimum(np.searchsorted(keys, at, side="right") - 1, len(keys) - 2)
    gap = keys[k + 1] - keys[k]
    return values[k] + (values[k + 1] - values[k]) * np.clip((at - keys[k]) / gap, 0.0, 1.0)


jain = jain_index     # the one Jain's index of fairserve (core/fairness.py): summaries, servers, bench


def _jain(total, total_sq, n):
    """`jain_index` over arrays of window sums (Σx, Σx², n), element-wise."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total_sq == 0, 1.0, total ** 2 / (n * total_sq))


def _window_size(times: np.ndarray, window_s: float) -> int:
    step = times[1] - times[0] if len(times) > 1 else window_s
    return max(1, int(round(window_s / step)))


def windowed_jain(curves: dict[str, np.ndarray], busy: dict[str, np.ndarray], times: np.ndarray,
                  window_s: float = 60.0, weights: dict[str, float] | None = None) -> np.ndarray:
    """Jain's index over the weighted service in consecutive windows, among clients backlogged for at least 90% of
    the window; NaN for windows with fewer than two such clients. Dense (clients x times); `backlogged_jain` is
    the same from runs, in time linear in events."""
    weights = weights or {}
    k = _window_size(times, window_s)
    out = []
    for a in range(0, len(times) - k, k):
        xs = [(curves[c][a + k] - curves[c][a]) / weights.get(c, 1.0)
              for c in curves if busy[c][a:a + k + 1].mean() >= 0.9]
        out.append(jain(xs) if len(xs) >= 2 else np.nan)
    return np.array(out)


def backlogged_jain(curves: dict[str, ServiceCurve], runs: dict[str, np.ndarray], times: np.ndarray,
                    window_s: float = 60.0, weights: dict[str, float] | None = None) -> np.ndarray:
    """`windowed_jain` without the clients x times arrays. A client counts in a window when its runs cover 90% of
    the window's grid points: whole windows inside a run are counted with a difference array, the few windows a
    run only touches one by one. Service is read only in windows where a client's curve changes (from its first
    token to its latest), elsewhere it adds 0 to both sums. O(events log events)."""
    weights = weights or {}
    k = _window_size(times, window_s)
    n_windows = len(range(0, len(times) - k, k))
    if n_windows == 0:
        return np.array([])
    inside = np.zeros(n_windows + 1, dtype=np.int64)      # difference array: clients backlogged all window long
    touched: dict[int, int] = {}                          # window -> clients backlogged >= 90% of it, partly
    at_w, xs = [], []
    for c, curve in curves.items():
        rs = runs[c]
        full_lo = np.minimum(-(-rs[:, 0] // k), n_windows)
        full_hi = np.minimum((rs[:, 1] - k) // k, n_windows - 1)
        full = full_lo <= full_hi
        np.add.at(inside, full_lo[full], 1)
        np.add.at(inside, full_hi[full] + 1, -1)
        partial: dict[int, int] = {}
        for s, e, flo, fhi, f in zip(rs[:, 0].tolist(), rs[:, 1].tolist(), full_lo.tolist(), full_hi.tolist(),
                                     full.tolist()):
            for w in range(max(0, -(-(s - k) // k)), min(n_windows - 1, e // k) + 1):
                if not (f and flo <= w <= fhi):
                    partial[w] = partial.get(w, 0) + min(e, w * k + k) - max(s, w * k) + 1
        counted = {w for w, n in partial.items() if n / (k + 1) >= 0.9}
        for w in counted:
            touched[w] = touched.get(w, 0) + 1
        first, last = curve.changes
        lo = np.maximum(np.maximum(first, 1) - 1, 0) // k
        hi = np.minimum((np.maximum(last, 1) - 1) // k, n_windows - 1)
        ws = np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(lo.tolist(), hi.tolist())] or [[]]))
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
        x = v[:len(ws)] - v[len(ws):]
        # NOTE: a curve's ramp formula leaves float noise (~1e-16 of its size) where no service happened: not service
        x[np.abs(x) <= 1e-9 * np.abs(v[:len(ws)])] = 0.0
        xs.append(x / weights.get(c, 1.0))
    n = np.cumsum(inside[:-1])
    for w, m in touched.items():
        n[w] += m
    at_w_all = np.concatenate(at_w) if at_w else np.zeros(0, dtype=np.int64)
    x = np.concatenate(xs) if xs else np.zeros(0)
    total = np.bincount(at_w_all, weights=x, minlength=n_windows)
    total_sq = np.bincount(at_w_all, weights=x * x, minlength=n_windows)
    return np.where(n >= 2, _jain(total, total_sq, n), np.nan)


def _pct(x: np.ndarray, q: float) -> float | None:
    return float(np.percentile(x, q)) if len(x) else None


def client_stats(records: Sequence[RequestRecord], duration_s: float, w_p: float = 1.0,
                 w_q: float = 2.0, cost: CostFunction | None = None) -> dict[str, ClientStats]:
    h = cost or LinearCost(w_p, w_q)
    out = {}
    for client, rs in sorted(by_client(records).items()):
        rt = np.array([r.first_token_s - r.arrival_s for r in rs if r.first_token_s is not None])
        served = [r for r in rs if r.first_token_s is not None]
        prompt = sum(r.prompt_tokens for r in served)
        output = sum(r.output_tokens for r in rs)
        service = sum(h.total(r.prompt_tokens, r.output_tokens) for r in served)
        out[client] = ClientStats(
            client=client, requests=len(rs), finished=sum(r.status == "finished" for r in rs),
            rejected=sum(r.status == "rejected" for r in rs), unfinished=sum(r.status == "unfinished" for r in rs),
            prompt_tokens=prompt, output_tokens=output, service=service,
            service_rate=service / duration_s if duration_s > 0 else 0.0,
            response_mean_s=float(rt.mean()) if len(rt) else None, response_p50_s=_pct(rt, 50),
            response_p90_s=_pct(rt, 90))
    return out


def summarize(records: Sequence[RequestRecord], duration_s: float, w_p: float = 1.0, w_q: float = 2.0,
              weights: dict[str, float] | None = None, step_s: float = 1.0, window_s: float = 60.0,
              cost: CostFunction | None = None, work_limit: float | None = None) -> Summary:
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
    return Summary(duration_s=duration_s, clients=stats, output_tokens_per_s=per_s(total_out),
                   service_per_s=per_s(total_service), max_backlogged_diff=diff.value,
                   max_backlogged_diff_pair=diff.pair, jain_index=float(jains.mean()) if len(jains) else None,
                   w_p=w_p, w_q=w_q, max_backlogged_diff_upper=diff.upper, max_backlogged_diff_exact=diff.exact)
