"""Service curves, service rates, response times and backlog, from request records (see the package's docstring).

The run-based functions (`prepare_curves`, `backlog_runs`) take all clients at once: a request's events (its first
token, its latest token, its arrival, its admission) become grid indices and a client's grid index i the composite
integer key client * (n_t + 1) + i, so that one sort and one search serve every client (exact, being integers)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

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


class Curves(Mapping[str, "ServiceCurve"]):
    """Every client's accumulated service, prepared once and read at any (client, grid point): O(log events) a
    point, each computed on its own, so a point reads the same float whichever other points are read with it.

    Linear cost: prompt + first token as a step at the first token, the other output tokens as a ramp to the latest
    token. Any other h(x, y): the same step, then h(x, y(t)) with y rising evenly (read request by request).
    An event at time s (a step, a ramp's start or end) counts at grid point i iff times[i] >= s, that is iff
    i >= searchsorted(times, s, 'left'): events are kept under composite keys (client, grid index), with each
    client's running sums of step, slope and slope * start (ramps are t * Σslope - Σslope * start). The sums run
    client by client: a sum over all clients, less its value where the client begins, would round the client's
    service to the size of everyone's. A client's `ServiceCurve` is a view of this."""

    def __init__(self, records: Sequence[RequestRecord], times: np.ndarray, h: CostFunction) -> None:
        self.times, self.span = times, len(times) + 1
        index: dict[str, int] = {}
        who = np.array([index.setdefault(r.client, len(index)) for r in records], dtype=np.int64)
        self.names, self.index = list(index), index
        served_at = np.flatnonzero([r.first_token_s is not None and r.output_tokens > 0 for r in records])
        served_at = served_at[np.argsort(who[served_at], kind="stable")]
        served = [records[i] for i in served_at.tolist()]
        first = np.array([r.first_token_s for r in served], dtype=float)
        last = np.array([r.first_token_s if r.last_token_s is None else r.last_token_s for r in served], dtype=float)
        # per served request (sorted by client): its client, the grid points of its first token (the step) and of
        # its latest token ('left': the ramp's end; 'right': the first point after every change it makes)
        self.client = client = who[served_at]
        self.first_at = np.searchsorted(times, first, side="left")
        self.last_at = np.searchsorted(times, last, side="left")
        self.done_at = np.searchsorted(times, last, side="right")
        self.requests = np.searchsorted(client, np.arange(len(index) + 1))  # client c's: requests[c] to requests[c + 1]
        self.linear = isinstance(h, LinearCost)
        step = charges(h, served, np.ones(len(served), dtype=np.int64))
        if isinstance(h, LinearCost):  # the ramp: w_q * (y - 1)
            ramp = h.w_q * (np.array([r.output_tokens for r in served], dtype=np.int64) - 1)
        else:
            ramp = np.zeros(len(served))
            self._served, self._first, self._last, self._h = served, first, last, h
        # NOTE: h is monotone in y (core/cost.py's contract); a price for cached tokens may be below the prompt's
        self.monotone = np.bincount(client[(step < 0) | (ramp < 0)], minlength=len(index)) == 0
        # the events: a request's step (with its ramp if that takes no time) and its ramp's start, its ramp's end
        flat = (last - first) <= 0
        slope = np.where(flat, 0.0, ramp / np.where(flat, 1.0, last - first))
        ends = ~flat & (ramp != 0)
        keys = np.concatenate((client * self.span + self.first_at, client[ends] * self.span + self.last_at[ends]))
        amounts = np.column_stack(
            (
                np.concatenate((np.where(flat, step + ramp, step), np.zeros(int(ends.sum())))),
                np.concatenate((slope, -slope[ends])),
                np.concatenate((slope * first, -slope[ends] * last[ends])),
            )
        )
        order = np.argsort(keys, kind="stable")
        self._keys = keys[order]
        cuts = np.searchsorted(self._keys, np.arange(len(index) + 1) * self.span)
        self._steps, self._slopes, self._starts = _running_sums(amounts[order], cuts).T.copy()

    def at(self, client: int | np.ndarray, idx: np.ndarray) -> np.ndarray:
        """Accumulated service of `client` (an index into `names`, or an array of them) at the grid points `idx`."""
        client, idx = np.broadcast_arrays(np.asarray(client, dtype=np.int64), np.asarray(idx, dtype=np.int64))
        # the running sums' row: client c's events are rows [cuts[c] + c + 1, cuts[c + 1] + c], after a row of 0
        row = np.searchsorted(self._keys, client * self.span + idx, side="right") + client
        if self.linear:
            return self._steps[row] + (self.times[idx] * self._slopes[row] - self._starts[row])
        return self._steps[row] + self._curved(client, idx)

    def _curved(self, client: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """Sum over requests of h(x, y(t)) - h(x, 1), y rising evenly from 1 to its output over [first, last]:
        client by client, request by request."""
        h, times, total = self._h, self.times, np.zeros(len(idx))
        order = np.argsort(client, kind="stable")
        groups = np.searchsorted(client[order], np.arange(len(self.names) + 1))
        for c in np.flatnonzero(np.diff(groups)).tolist():
            mine = order[groups[c] : groups[c + 1]]
            at, part = idx[mine], np.zeros(len(mine))
            rs = range(int(self.requests[c]), int(self.requests[c + 1]))
            lo = np.searchsorted(times, self._first[rs.start : rs.stop], side="right")
            hi = np.searchsorted(times, self._last[rs.start : rs.stop], side="right")
            for i, a, b in zip(rs, lo.tolist(), hi.tolist(), strict=True):
                r, f, l_ = self._served[i], self._first[i], self._last[i]
                x, n = r.prompt_tokens, r.output_tokens
                base = h.total(x, 1)
                inside = (at >= a) & (at < b)
                if inside.any():
                    y = 1 + (n - 1) * (times[at[inside]] - f) / (l_ - f)
                    part[inside] += np.array([h.total(x, v) for v in y]) - base
                part[at >= b] += h.total(x, n) - base
            total[mine] = part
        return total

    def __getitem__(self, name: str) -> ServiceCurve:
        return ServiceCurve(self, self.index[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


class ServiceCurve:
    """One client's accumulated service: a view of `Curves`, read at any grid points."""

    def __init__(self, curves: Curves, index: int) -> None:
        self.curves, self.index, self.times = curves, index, curves.times
        self.monotone = bool(curves.monotone[index])

    def at(self, idx: np.ndarray) -> np.ndarray:
        """Accumulated service at the grid points `idx` (indices into `times`)."""
        return self.curves.at(self.index, idx)


def charges(h: CostFunction, served: Sequence[RequestRecord], tokens: np.ndarray) -> np.ndarray:
    """What each request is charged with `tokens` (ints) of its output: h(x, y) + h.cached(x, c), x its prompt, c
    its cached prompt tokens, as the ledger charges (bit for bit); under the linear cost, all at once."""
    if isinstance(h, LinearCost):
        out = h.w_p * np.array([r.prompt_tokens for r in served], dtype=np.int64) + h.w_q * tokens
    else:
        out = np.array([h.total(r.prompt_tokens, y) for r, y in zip(served, tokens.tolist(), strict=True)])
    out = out.astype(float)
    cached = [i for i, r in enumerate(served) if r.cached_tokens]  # NOTE: h.cached(x, 0) is 0
    out[cached] += [h.cached(served[i].prompt_tokens, served[i].cached_tokens) for i in cached]
    return out


def prepare_curves(
    records: Sequence[RequestRecord],
    times: np.ndarray,
    w_p: float = 1.0,
    w_q: float = 2.0,
    cost: CostFunction | None = None,
) -> Curves:
    """Every client's service curve on the grid `times` (clients in order of first appearance): name -> curve."""
    return Curves(records, times, cost or LinearCost(w_p, w_q))


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
    curves = prepare_curves(records, times, w_p, w_q, cost)
    return {c: curves.at(i, every) for i, c in enumerate(curves.names)}


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
    after it (rejected requests never wait). All clients at once: arrivals (+1) and admissions (-1) at their grid
    indices, sorted by composite key; a client's requests waiting after each key are a running sum (of integers:
    exact), and a run starts where it turns positive and ends before it returns to 0 (or at the grid's end)."""
    index: dict[str, int] = {}
    who = np.array([index.setdefault(r.client, len(index)) for r in records], dtype=np.int64)
    waits = np.array([r.status != "rejected" for r in records], dtype=bool)
    arrived = np.array([r.arrival_s for r in records], dtype=float)
    admitted = np.array([np.nan if r.admit_s is None else r.admit_s for r in records], dtype=float)
    admits = waits & ~np.isnan(admitted)
    n_t, span = len(times), len(times) + 1
    at = np.searchsorted(times, np.concatenate((arrived[waits], admitted[admits])), side="left")
    keys = np.concatenate((who[waits], who[admits])) * span + at
    steps = np.repeat(np.array([1, -1], dtype=np.int64), [int(waits.sum()), int(admits.sum())])
    order = np.argsort(keys, kind="stable")
    keys, steps = keys[order], steps[order]
    first = group_starts(keys)
    keys, net = keys[first], np.add.reduceat(steps, first) if len(first) else steps
    client, point = keys // span, keys % span
    # requests waiting after each key: the running sum, less its value before the client's first key
    level = np.cumsum(net)
    begins = np.ones(len(keys), dtype=bool)
    begins[1:] = client[1:] != client[:-1]
    level -= (level - net)[np.maximum.accumulate(np.where(begins, np.arange(len(keys)), 0))]
    inside = point < n_t  # NOTE: events after the grid's end, each its client's last, change no grid point
    client, point, waiting = client[inside], point[inside], level[inside] > 0
    was = np.zeros(len(client), dtype=bool)  # waiting before the key
    was[1:] = waiting[:-1] & (client[1:] == client[:-1])
    rise, fall = waiting & ~was, was & ~waiting
    through = waiting.copy()  # waiting after the client's last key: to the grid's end
    through[:-1] &= client[1:] != client[:-1]
    ends = np.where(fall, point - 1, n_t - 1)[fall | through]
    runs = np.column_stack((point[rise], ends)).astype(np.int64).reshape(-1, 2)
    cuts = np.searchsorted(client[rise], np.arange(len(index) + 1)).tolist()
    return {c: runs[cuts[i] : cuts[i + 1]] for i, c in enumerate(index)}


def run_arrays(curves: Curves, runs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`backlog_runs` as three arrays, sorted by client then time: each run's client (its index in `curves`), first
    and last grid index."""
    parts = [runs.get(c, np.zeros((0, 2), dtype=np.int64)) for c in curves.names]
    both = np.concatenate(parts) if parts else np.zeros((0, 2), dtype=np.int64)
    client = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
    return client, both[:, 0].astype(np.int64), both[:, 1].astype(np.int64)


def backlogged(records: Sequence[RequestRecord], times: np.ndarray) -> dict[str, np.ndarray]:
    """Whether each client had a request waiting for admission at each time (dense: clients x times)."""
    out = {}
    for client, runs in backlog_runs(records, times).items():
        busy = np.zeros(len(times) + 1, dtype=np.int64)
        np.add.at(busy, runs[:, 0], 1)
        np.add.at(busy, runs[:, 1] + 1, -1)
        out[client] = np.cumsum(busy[:-1]) > 0
    return out


# array helpers of the run-based metrics


def _running_sums(x: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    """The rows of `x` cut into segments [cuts[s], cuts[s + 1]), each summed from its own start: segment s's
    running sums are rows cuts[s] + s + 1 .. cuts[s + 1] + s of the result, after a row of zeros (at cuts[s] + s)."""
    out = np.zeros((len(x) + len(cuts) - 1, *x.shape[1:]))
    for s in np.flatnonzero(np.diff(cuts)).tolist():
        a, b = int(cuts[s]), int(cuts[s + 1])
        out[a + s + 1 : b + s + 1] = np.cumsum(x[a:b], axis=0)
    return out


def ranges(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """concatenate(arange(a, b) for a, b in zip(starts, stops)), vectorized."""
    lens = stops - starts
    ends = np.cumsum(lens)
    return np.arange(ends[-1] if len(ends) else 0) - np.repeat(ends - lens - starts, lens)


def covered(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The integers in the union of the intervals [lo, hi] (lo <= hi), sorted, each once."""
    if len(lo) == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(lo, kind="stable")
    lo, reach = lo[order], np.maximum.accumulate(hi[order])
    new = np.flatnonzero(np.concatenate(([True], lo[1:] > reach[:-1])))
    return ranges(lo[new], np.append(reach[new[1:] - 1], reach[-1]) + 1)


def group_starts(keys: np.ndarray) -> np.ndarray:
    """Where each run of equal values of the sorted `keys` begins: np.unique's work without np.unique, whose first
    call imports numpy.ma (7 ms of a command's time)."""
    if len(keys) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
