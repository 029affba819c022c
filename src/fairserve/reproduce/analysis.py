"""Numbers the verdicts are computed from: shares while backlogged, demands, fair shares, phases."""
from __future__ import annotations

import numpy as np

from .runs import RunOutput


def joint_span(out: RunOutput, clients: list[str]) -> tuple[int, int] | None:
    """First and last time index at which all `clients` were backlogged together."""
    both = np.logical_and.reduce([out.busy[c] for c in clients])
    idx = both.nonzero()[0]
    return (int(idx[0]), int(idx[-1])) if len(idx) > 1 else None


def served(out: RunOutput, client: str, start_s: float, end_s: float) -> float:
    """Service `client` received in [start_s, end_s]."""
    curve = out.curves[client]
    return float(np.interp(end_s, out.times, curve) - np.interp(start_s, out.times, curve))


def share_ratio(out: RunOutput, a: str, b: str) -> float | None:
    """Service of `a` over service of `b` while both were backlogged (weights applied)."""
    span = joint_span(out, [a, b])
    if span is None:
        return None
    t0, t1 = out.times[span[0]], out.times[span[1]]
    wa = (out.weights or {}).get(a, 1.0)
    wb = (out.weights or {}).get(b, 1.0)
    sb = served(out, b, t0, t1) / wb
    return served(out, a, t0, t1) / wa / sb if sb > 0 else None


def demand_rate(out: RunOutput, client: str, start_s: float = 0.0, end_s: float | None = None) -> float:
    """Service per second the client asked for: the cost of the requests it sent in [start_s, end_s)."""
    end_s = out.duration_s if end_s is None else end_s
    h = out.cost
    asked = sum(h.total(r.prompt_tokens, r.max_tokens) for r in out.records
                if r.client == client and start_s <= r.arrival_s < end_s)
    return asked / max(end_s - start_s, 1e-9)


def fair_level(demands: dict[str, float], capacity: float) -> float:
    """Max-min fair share (water filling): clients asking less than the level get what they ask."""
    left, rest = capacity, sorted(demands.values())
    while rest:
        level = left / len(rest)
        if rest[0] > level:
            return level
        left -= rest.pop(0)
    return float("inf")


def mean_response(out: RunOutput, client: str, start_s: float = 0.0, end_s: float | None = None) -> float | None:
    end_s = out.duration_s if end_s is None else end_s
    rts = [r.first_token_s - r.arrival_s for r in out.records
           if r.client == client and r.first_token_s is not None and start_s <= r.arrival_s < end_s]
    return float(np.mean(rts)) if rts else None


def difference_series(out: RunOutput) -> np.ndarray:
    from ..metrics import backlogged_difference
    return backlogged_difference(out.curves, out.busy, out.weights)[0]
