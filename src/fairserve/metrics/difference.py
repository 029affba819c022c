"""The largest service difference between two clients while both are backlogged (the quantity Theorem 4.4
bounds): the bounded exact search, and the pairwise computation that is its test oracle."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .curves import Curves, covered, group_starts, ranges, run_arrays


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
    curves: Curves,
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
    client, start, end = run_arrays(curves, runs)  # clients are indices into curves.names from here on
    if len(client) == 0 or client[0] == client[-1]:  # sorted: fewer than two clients have runs
        return BackloggedDifference(0.0, None, 0.0, True)
    n_t = len(curves.times)
    setup = _Bounds(curves, client, start, end, np.array([weights.get(c, 1.0) for c in curves.names]))
    wt, rise, fall, keys, bent, slack = setup.wt, setup.rise, setup.fall, setup.keys, setup.bent, setup.slack
    # the largest fall of a run of another client: the top fall, or the runner-up from a different client
    order_fall = np.argsort(-fall, kind="stable")
    top = order_fall[0]
    other = next((r for r in order_fall if client[r] != client[top]), top)
    fall_else = np.where(client == client[top], fall[other], fall[top])
    ub = np.minimum(setup.gain_all, rise + fall_else)
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
        ends = curves.at(f, np.concatenate((lo, hi))) / wt[f]
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
                mine = curves.at(f, np.arange(s, e + 1)) / wt[f]
                work += e - s + 1
            d = mine[a - s : b - s + 1] - curves.at(g, np.arange(a, b + 1)) / wt[g]
            gain = float(np.max(d - np.minimum.accumulate(d)))
            work += b - a + 1
            a_name, b_name = sorted((curves.names[f], curves.names[g]))
            key = (a_name, b_name)
            if gain > best or (gain == best and pair is not None and key < pair):
                best, pair = gain, key
    return BackloggedDifference(best, pair, best, True)


class _Bounds:
    """The search's set-up, all runs at once: per run, gain_all = Δu_f(r) (inf where the curve may fall), rise and
    fall (of u - ρ); the curves per unit weight where they bend (`keys` = client * (n_t + 1) + grid point, sorted,
    and `bent`, their values); and `slack`, what float rounding may take from a bound."""

    def __init__(self, curves: Curves, client: np.ndarray, start: np.ndarray, end: np.ndarray, wt: np.ndarray) -> None:
        n_t, span = len(curves.times), len(curves.times) + 1
        self.wt = wt
        first_key, last_key = client * span + start, client * span + end
        has_runs = np.zeros(len(curves.names), dtype=bool)
        has_runs[client] = True
        req = has_runs[curves.client]
        who, lo, hi = curves.client[req], curves.first_at[req], np.minimum(curves.done_at[req], n_t - 1)
        # the points read: where a curve may change (ch: from a request's first token to after its latest, within
        # [1, n_t)), the points before those, and the runs' ends; intervals [max(lo, 1) - 1, hi] merged per client
        lo = np.maximum(lo, 1)
        some = lo <= hi
        pts = covered(
            np.concatenate((who[some] * span + lo[some] - 1, first_key, last_key)),
            np.concatenate((who[some] * span + hi[some], first_key, last_key)),
        )
        at, grid = pts // span, pts % span
        raw = curves.at(at, grid)
        v = raw / wt[at]
        # the reference ρ: service of backlogged clients per unit of their weight, accumulated on the grid; a
        # client's service between its consecutive points is counted where it was backlogged
        same = np.flatnonzero(at[1:] == at[:-1]) + 1
        j = np.searchsorted(first_key, pts[same], side="right") - 1
        busy = same[(j >= 0) & (last_key[np.maximum(j, 0)] >= pts[same])]
        busy_service = np.bincount(grid[busy], weights=raw[busy] - raw[busy - 1], minlength=n_t)
        w_run = wt[client]
        busy_weight = np.cumsum(
            np.bincount(start, weights=w_run, minlength=n_t + 1)
            - np.bincount(end + 1, weights=w_run, minlength=n_t + 1)
        )[:n_t]
        some_weight = busy_weight > 0
        rho = np.cumsum(np.where(some_weight, busy_service / np.where(some_weight, busy_weight, 1), 0))
        # per run: its points (its ends among them), u - ρ there, its largest rise and fall
        a, b = np.searchsorted(pts, first_key), np.searchsorted(pts, last_key, side="right")
        inside = ranges(a, b)
        heads = np.cumsum(b - a) - (b - a)
        seg = np.repeat(np.arange(len(a)), b - a)
        u = v[inside] - rho[grid[inside]]
        self.rise, self.fall = _rise_by_segment(u, seg, heads), _rise_by_segment(-u, seg, heads)
        self.gain_all = np.where(curves.monotone[client], v[b - 1] - v[a], np.inf)
        scale = max(float(np.abs(rho).max(initial=0.0)), float(np.abs(v).max(initial=0.0)))
        self.slack = 1e-8 * (scale + 1.0)  # NOTE: float rounding of the bounds, far above their few ulps
        if not curves.linear:
            self.keys, self.bent = pts, v
            return
        # linear cost: the points where a sampled curve may bend (it is linear in between), and the runs' ends
        i1, i2 = curves.first_at[req], curves.last_at[req]
        bends = np.concatenate((i1 - 1, i1, i2 - 1, i2))
        inside_grid = (bends >= 0) & (bends < n_t)
        keys = np.sort(np.concatenate((np.tile(who, 4)[inside_grid] * span + bends[inside_grid], first_key, last_key)))
        self.keys = keys[group_starts(keys)]
        self.bent = curves.at(self.keys // span, self.keys % span) / wt[self.keys // span]


def _rise_by_segment(x: np.ndarray, seg: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """For consecutive segments of `x` (`seg`: each position's segment, 0, 1, ...; `heads`: where each begins, none
    empty): max over i <= j in the segment of x[j] - x[i]. Each segment is shifted below all the ones before it, so
    one running minimum serves them all; the shift rounds x to the spacing of its size, added back to the result so
    that it stays an upper bound."""
    if len(heads) == 0:
        return np.zeros(0)
    shift = 4.0 * (float(np.abs(x).max(initial=0.0)) + 1.0)
    shifted = x - shift * seg
    rise = shifted - np.minimum.accumulate(shifted)
    return np.maximum.reduceat(rise, heads) + 2 * np.spacing(shift * len(heads))


@dataclass(frozen=True)
class _Gains:
    gain: np.ndarray
    work: int


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
    parts = [seg * span + lo, seg * span + hi]  # composite keys here: segment * span + grid point
    for who in (np.full(len(partners), f), partners):
        a = np.searchsorted(keys, who * span + lo)
        b = np.searchsorted(keys, who * span + hi, side="right")
        parts.append(keys[ranges(a, b)] + np.repeat((seg - who) * span, b - a))
    both = np.sort(np.concatenate(parts), kind="stable")  # NOTE: stable (timsort): fast on sorted parts
    s, x = both // span, both % span
    mine = slice(*np.searchsorted(keys, [f * span, f * span + span]).tolist())  # f's own points: a smaller search
    d = _interpolate(keys[mine] - f * span, values[mine], x) - _interpolate(keys, values, partners[s] * span + x)
    return _Gains(_rise_by_segment(d, s, np.searchsorted(s, seg)), len(d))


def _interpolate(keys: np.ndarray, values: np.ndarray, at: np.ndarray) -> np.ndarray:
    k = np.minimum(np.searchsorted(keys, at, side="right") - 1, len(keys) - 2)
    gap = keys[k + 1] - keys[k]
    return values[k] + (values[k + 1] - values[k]) * np.clip((at - keys[k]) / gap, 0.0, 1.0)
