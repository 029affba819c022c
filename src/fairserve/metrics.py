"""Fairness and performance metrics over request records. Pure functions; no plotting.

Service is the paper's weighted tokens, W = w_p * prompt + w_q * output. A request's prompt counts when its first
token appears (the end of its prefill) and its output tokens are spread evenly from its first to its latest token,
as the paper's artifact does. A client is *backlogged* at time t when it has a request that arrived and was not yet
admitted. Comparisons between clients use service divided by the client's weight.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from .core.cost import CostFunction, LinearCost
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

    def to_dict(self) -> dict:
        d = asdict(self)
        d["clients"] = {c: asdict(s) for c, s in self.clients.items()}
        return d


def by_client(records: Sequence[RequestRecord]) -> dict[str, list[RequestRecord]]:
    out: dict[str, list[RequestRecord]] = {}
    for r in records:
        out.setdefault(r.client, []).append(r)
    return out


def time_grid(end_s: float, step_s: float = 1.0) -> np.ndarray:
    return np.arange(0.0, end_s + step_s / 2, step_s)


def service_curves(records: Sequence[RequestRecord], times: np.ndarray, w_p: float = 1.0,
                   w_q: float = 2.0, cost: CostFunction | None = None) -> dict[str, np.ndarray]:
    """Accumulated service of each client at each time in `times` (sorted). `cost` (any h(x, y)) replaces the
    linear w_p/w_q; output tokens are taken to appear evenly in time, so a request's service at time t is
    h(x, y(t)), which for a non-linear h is not a straight line."""
    h = cost or LinearCost(w_p, w_q)
    out = {}
    for client, rs in by_client(records).items():
        served = [r for r in rs if r.first_token_s is not None and r.output_tokens > 0]
        first = np.array([r.first_token_s for r in served], dtype=float)
        last = np.array([r.last_token_s if r.last_token_s is not None else r.first_token_s for r in served])
        steps = np.array([h.total(r.prompt_tokens, 1) for r in served], dtype=float)   # prompt + first token
        if isinstance(h, LinearCost):
            ramp = np.array([h.w_q * (r.output_tokens - 1) for r in served], dtype=float)
            out[client] = _steps_at(first, steps, times) + _ramps_at(first, last, ramp, times)
        else:
            out[client] = _steps_at(first, steps, times) + _curved_ramps_at(served, first, last, h, times)
    return out


def _curved_ramps_at(served: list[RequestRecord], first: np.ndarray, last: np.ndarray, h: CostFunction,
                     times: np.ndarray) -> np.ndarray:
    """Sum over requests of h(x, y(t)) - h(x, 1), with y rising evenly from 1 to its output over [first, last]."""
    total = np.zeros(len(times))
    lo = np.searchsorted(times, first, side="right")
    hi = np.searchsorted(times, last, side="right")
    for r, f, l_, a, b in zip(served, first, last, lo, hi):
        x, n = r.prompt_tokens, r.output_tokens
        base = h.total(x, 1)
        if b > a:   # grid points inside its decode
            y = 1 + (n - 1) * (times[a:b] - f) / (l_ - f)
            total[a:b] += np.array([h.total(x, v) for v in y]) - base
        total[b:] += h.total(x, n) - base
    return total


def _steps_at(at: np.ndarray, amount: np.ndarray, times: np.ndarray) -> np.ndarray:
    order = np.argsort(at, kind="stable")
    cum = np.concatenate(([0.0], np.cumsum(amount[order])))
    return cum[np.searchsorted(at[order], times, side="right")]


def _ramps_at(start: np.ndarray, end: np.ndarray, amount: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Sum over ramps of amount * clip((t - start) / (end - start), 0, 1); zero-length ramps are steps."""
    length = end - start
    flat = length <= 0
    result = _steps_at(start[flat], amount[flat], times)
    s, e, a = start[~flat], end[~flat], amount[~flat]
    slope = a / (e - s)
    # sum_{s<=t} slope*(t-s) - sum_{e<=t} slope*(t-e)
    for edge, sign in ((s, 1.0), (e, -1.0)):
        order = np.argsort(edge, kind="stable")
        k = np.searchsorted(edge[order], times, side="right")
        cs = np.concatenate(([0.0], np.cumsum(slope[order])))
        cse = np.concatenate(([0.0], np.cumsum((slope * edge)[order])))
        result = result + sign * (times * cs[k] - cse[k])
    return result


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


def backlogged(records: Sequence[RequestRecord], times: np.ndarray) -> dict[str, np.ndarray]:
    """Whether each client had a request waiting for admission at each time."""
    out = {}
    for client, rs in by_client(records).items():
        waiting = [r for r in rs if r.status != "rejected"]
        arrived = np.sort([r.arrival_s for r in waiting])
        admitted = np.sort([r.admit_s for r in waiting if r.admit_s is not None])
        out[client] = (np.searchsorted(arrived, times, side="right")
                       - np.searchsorted(admitted, times, side="right")) > 0
    return out


def backlogged_difference(curves: dict[str, np.ndarray], busy: dict[str, np.ndarray],
                          weights: dict[str, float] | None = None) -> tuple[np.ndarray, float, tuple[str, str] | None]:
    """For every pair of clients and every stretch of time in which both were backlogged, the service difference
    accumulated since the stretch began (weights applied). Returns the per-time maximum over pairs, the overall
    maximum range (the quantity Theorem 4.4 bounds by 2U), and the pair that reached it. O(clients² × times)."""
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


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one client gets everything."""
    x = np.asarray(values, dtype=float)
    sq = float(np.sum(x * x))
    return 1.0 if sq == 0 else float(np.sum(x) ** 2 / (len(x) * sq))


def windowed_jain(curves: dict[str, np.ndarray], busy: dict[str, np.ndarray], times: np.ndarray,
                  window_s: float = 60.0, weights: dict[str, float] | None = None) -> np.ndarray:
    """Jain's index over the weighted service in consecutive windows, among clients backlogged for at least 90% of
    the window; NaN for windows with fewer than two such clients."""
    weights = weights or {}
    step = times[1] - times[0] if len(times) > 1 else window_s
    k = max(1, int(round(window_s / step)))
    out = []
    for a in range(0, len(times) - k, k):
        xs = [(curves[c][a + k] - curves[c][a]) / weights.get(c, 1.0)
              for c in curves if busy[c][a:a + k + 1].mean() >= 0.9]
        out.append(jain(xs) if len(xs) >= 2 else np.nan)
    return np.array(out)


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
              cost: CostFunction | None = None) -> Summary:
    stats = client_stats(records, duration_s, w_p, w_q, cost)
    times = time_grid(duration_s, step_s)
    curves = service_curves(records, times, w_p, w_q, cost)
    busy = backlogged(records, times)
    _, diff, pair = backlogged_difference(curves, busy, weights)
    jains = windowed_jain(curves, busy, times, window_s, weights)
    jains = jains[~np.isnan(jains)]
    total_out = sum(s.output_tokens for s in stats.values())
    total_service = sum(s.service for s in stats.values())
    per_s = (lambda v: v / duration_s) if duration_s > 0 else (lambda v: 0.0)
    return Summary(duration_s=duration_s, clients=stats, output_tokens_per_s=per_s(total_out),
                   service_per_s=per_s(total_service), max_backlogged_diff=diff, max_backlogged_diff_pair=pair,
                   jain_index=float(jains.mean()) if len(jains) else None, w_p=w_p, w_q=w_q)
