"""Service curves, service rates, response times and backlog, from request records (see the package's docstring)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..core.cost import CostFunction, LinearCost
from ..records import RequestRecord


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
        step = [h.total(r.prompt_tokens, 1) + h.cached(r.prompt_tokens, r.cached_tokens) for r in served]
        self._steps = _Steps(first, np.array(step, dtype=float))
        self._linear = isinstance(h, LinearCost)
        if isinstance(h, LinearCost):
            ramp = np.array([h.w_q * (r.output_tokens - 1) for r in served], dtype=np.float64)
            flat = (last - first) <= 0
            self._flat = _Steps(first[flat], ramp[flat])
            s, e, a = first[~flat], last[~flat], ramp[~flat]
            slope = a / (e - s)
            self._starts, self._ends = _Edge(s, slope), _Edge(e, slope)
            self.monotone = bool(np.all(self._steps.amount >= 0) and np.all(ramp >= 0))
        else:
            self._served, self._first, self._last, self._h = served, first, last, h
            self.monotone = True  # NOTE: the cost contract (core/cost.py): h is monotone in y
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
        for r, f, l_, a, b in zip(self._served, self._first, self._last, lo, hi, strict=False):
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


def prepare_curves(
    records: Sequence[RequestRecord],
    times: np.ndarray,
    w_p: float = 1.0,
    w_q: float = 2.0,
    cost: CostFunction | None = None,
) -> dict[str, ServiceCurve]:
    """Every client's `ServiceCurve` on the grid `times` (clients in order of first appearance)."""
    h = cost or LinearCost(w_p, w_q)
    return {
        client: ServiceCurve([r for r in rs if r.first_token_s is not None and r.output_tokens > 0], times, h)
        for client, rs in by_client(records).items()
    }


def service_curves(
    records: Sequence[RequestRecord],
    times: np.ndarray,
    w_p: float = 1.0,
    w_q: float = 2.0,
    cost: CostFunction | None = None,
) -> dict[str, np.ndarray]:
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


def response_times(
    records: Sequence[RequestRecord], times: np.ndarray, window_s: float = 60.0
) -> dict[str, np.ndarray]:
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
        waiting_after = (
            np.searchsorted(arrived, edges, side="right") - np.searchsorted(admitted, edges, side="right")
        ) > 0
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
