"""The largest service difference between two clients while both are backlogged (the quantity Theorem 4.4
bounds): the bounded exact search, and the pairwise computation that is its test oracle."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .curves import ServiceCurve


def backlogged_difference(
    curves: dict[str, np.ndarray], busy: dict[str, np.ndarray], weights: dict[str, float] | None = None
) -> tuple[np.ndarray, float, tuple[str, str] | None]:
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
        for g in names[i + 1 :]:
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


WORK_PER_EVENT = 40.0  # the exact search's default budget: points read per event (runs, grid points, bends)
MIN_WORK = 1e6  # ... and at least this many (a fraction of a second), so small cases are always exact
# `fairserve simulate`'s summary: a budget linear in records, so that printing it costs a fraction of the run; where
# it stops short the summary says so and prints the proven bracket (the library's default is the one above)
PRINT_WORK_PER_RECORD, PRINT_MIN_WORK = 10.0, 2e5


def print_work_limit(records: int) -> float:
    return max(PRINT_WORK_PER_RECORD * records, PRINT_MIN_WORK)


@dataclass(frozen=True)
class BackloggedDifference:
    """The largest service difference between two clients over a stretch in which both were backlogged."""

    value: float  # the largest difference found; the exact maximum when `exact`
    pair: tuple[str, str] | None  # the pair that reached `value` (names sorted), None when it is 0
    upper: float  # a proven upper bound on the maximum (== value when exact)
    exact: bool


def largest_backlogged_difference(
    curves: dict[str, ServiceCurve],
    runs: dict[str, np.ndarray],
    weights: dict[str, float] | None = None,
    work_limit: float | None = None,
) -> BackloggedDifference:
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
    points, values, bends, bent_parts = [], [], [], []
    busy_service, busy_weight = np.zeros(n_t + 1), np.zeros(n_t + 1)
    for i, c in enumerate(names):
        rs, curve = runs[c], curves[c]
        lo, hi = curve.changes
        spans = [np.arange(a, b + 1) for a, b in zip(lo.tolist(), hi.tolist(), strict=True)]
        ch = np.unique(np.concatenate(spans)) if spans else np.zeros(0)
        ch = ch.astype(np.int64)
        ch = ch[(ch >= 1) & (ch < n_t)]
        pts = np.unique(np.concatenate((ch, ch - 1, rs.ravel())))
        v = curve.at(pts) / wt[i]
        points.append(pts)
        values.append(v)
        if curve.bends is None:
            bends.append(pts)
            bent_parts.append(v)
        else:
            b_pts = np.unique(np.concatenate((curve.bends, rs.ravel())))
            b_pts = b_pts[(b_pts >= 0) & (b_pts < n_t)]
            bends.append(b_pts)
            bent_parts.append(curve.at(b_pts) / wt[i])
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
    bent = np.concatenate(bent_parts)
    slack = 1e-8 * (scale + 1.0)  # NOTE: float rounding of the bounds, far above their few ulps
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
    best, work = 0.0, 0.0
    pair: tuple[str, str] | None = None
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
        bound = np.minimum(ends[len(lo) :] - ends[: len(lo)], rise[r] + fall[cand])
        maybe = bound + slack >= best
        if not maybe.any():
            continue
        cand, lo, hi = cand[maybe], lo[maybe], hi[maybe]
        approx = _gains_where_bent(f, client[cand], lo, hi, keys, bent, n_t)
        work += len(cand) + approx.work
        mine = None
        for p in np.argsort(-approx.gain, kind="stable").tolist():  # the likeliest first: best rises at once
            if approx.gain[p] + slack < best:
                break
            a, b, g = int(lo[p]), int(hi[p]), int(client[cand[p]])
            # exactly, on every grid point of the stretch, as `backlogged_difference` reads it
            if mine is None:
                mine = curves[names[f]].at(np.arange(s, e + 1)) / wt[f]
                work += e - s + 1
            d = mine[a - s : b - s + 1] - curves[names[g]].at(np.arange(a, b + 1)) / wt[g]
            gain = float(np.max(d - np.minimum.accumulate(d)))
            work += b - a + 1
            a_name, b_name = sorted((names[f], names[g]))
            key = (a_name, b_name)
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


def _gains_where_bent(
    f: int, partners: np.ndarray, lo: np.ndarray, hi: np.ndarray, keys: np.ndarray, values: np.ndarray, n_t: int
) -> _Gains:
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
