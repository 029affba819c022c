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
    asked = sum(
        h.total(r.prompt_tokens, r.max_tokens)
        for r in out.records
        if r.client == client and start_s <= r.arrival_s < end_s
    )
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
    rts = [
        r.first_token_s - r.arrival_s
        for r in out.records
        if r.client == client and r.first_token_s is not None and start_s <= r.arrival_s < end_s
    ]
    return float(np.mean(rts)) if rts else None


def difference_series(out: RunOutput) -> np.ndarray:
    from ..metrics import backlogged_difference

    return backlogged_difference(out.curves, out.busy, out.weights)[0]


def client_windows(out: RunOutput, window_s: float = 60.0) -> list[tuple[str, float, float, float, float]]:
    """Per client and per window of arrivals [t0, t0 + window_s): (client, t0, mean response of those requests,
    the client's demand rate over that window and the one before it, the max-min fair level of all clients'
    demands over the same span, on the service the run delivered). The window before counts because a burst's
    requests wait behind the same client's earlier ones."""
    clients = sorted(out.summary.clients)
    capacity = out.summary.service_per_s
    rows = []
    for t0 in np.arange(0.0, out.duration_s, window_s):
        span = (max(0.0, t0 - window_s), t0 + window_s)
        demands = {c: demand_rate(out, c, *span) for c in clients}
        level = fair_level(demands, capacity)
        for c in clients:
            rt = mean_response(out, c, t0, t0 + window_s)
            if rt is not None:
                rows.append((c, float(t0), rt, demands[c], level))
    return rows


def profile_decode_to_prefill(tokens: int, kv_tokens: int = 10_000, prompt: int = 8) -> float:
    """The profile's comparison (§B.2): per-request decode time of `tokens` output tokens (after a `prompt`-token
    prompt) over per-request prefill time of `tokens` input tokens, each in the largest batch the pool holds, on
    the A10G preset's forward model (what the profile timed)."""
    from ..sim.latency import A10G_FORWARD

    b_pre = kv_tokens // tokens
    prefill = A10G_FORWARD.prefill_s([tokens] * b_pre) / b_pre
    b_dec = kv_tokens // (prompt + tokens)
    decode = sum(A10G_FORWARD.decode_step_s(b_dec, b_dec * (prompt + k)) for k in range(tokens)) / b_dec
    return decode / prefill
