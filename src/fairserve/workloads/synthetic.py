"""The synthetic workloads of "Fairness in Serving Large Language Models" (Sheng et al., 2024).

See docs/workloads.md for the table and the definitions of "uniform", "on/off",
"poisson" and "increase".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .base import Arrival, Workload, WorkloadError

Length = int | tuple[int, int]  # a fixed length, or [lo, hi) drawn uniformly per request
ON_OFF_PERIOD_S = 60.0
_S4_PROFILE = "llama-2-13b@a100-80gb"


@dataclass(frozen=True)
class _Spec:
    phases: tuple[tuple[float, tuple[float, ...]], ...]  # (start_s, per-client rates); last runs to the end
    duration_s: float
    prompt: tuple[Length, ...]  # per client
    output: tuple[Length, ...]
    arrivals: Literal["uniform", "poisson", "increase"] = "uniform"
    on_off_until_s: float = 0.0  # client 0 is on/off (odd 60 s periods dropped) before this time
    weights: tuple[float, ...] | None = None
    kv_tokens: int | None = None
    latency_profile: str | None = None
    names: tuple[str, ...] | None = None  # the clients' names (tenant paths); default client-0, client-1, ...
    groups: tuple[tuple[str, float], ...] = ()  # (group path, weight)
    priorities: tuple[tuple[str, int], ...] = ()  # (tenant or group path, priority: lower is served first)


def _same(n: int, length: Length) -> tuple[Length, ...]:
    return (length,) * n


def _simple(rates: tuple[float, ...], duration_s: float, length: Length = 256, **kw) -> _Spec:
    return _Spec(((0.0, rates),), duration_s, _same(len(rates), length), _same(len(rates), length), **kw)


_INF = math.inf
_SPECS: dict[str, _Spec] = {
    "overload": _simple((1.5, 3.0), 360),
    "overload-multi": _simple((0.4,) * 3 + (0.6,) * 5, 360),
    "overload-weighted": _simple((0.8, 0.8, 1.2, 1.6), 360, weights=(1.0, 2.0, 3.0, 4.0)),
    "proportional": _simple((0.25, 0.5, 1.5), 600),
    "on-off-less": _simple((0.5, 2.0), 600, on_off_until_s=_INF),
    "on-off-overload": _simple((2.0, 3.0), 600, on_off_until_s=_INF),
    "poisson-on-off-overload": _simple((0.5, 2.0), 600, (16, 512), arrivals="poisson", on_off_until_s=_INF),
    "poisson-short-long": _Spec(((0.0, (8.0, 1.5)),), 600, (64, 256), (64, 256), "poisson"),
    "poisson-short-long-2": _Spec(((0.0, (8.0, 1.5)),), 600, (512, 32), (32, 512), "poisson"),
    # Client 1's rate rises linearly from phases[0] to phases[1] over the nominal duration.
    "increase": _Spec(((0.0, (0.5, 0.2)), (600.0, (0.5, 2.0))), 600, (256, 256), (256, 256), "increase"),
    "dist-shift": _Spec(
        ((0.0, (0.5, 2.0)), (300.0, (1.0, 1.0)), (600.0, (0.5, 1.5))),
        900,
        (256, 256),
        (256, 256),
        on_off_until_s=300.0,
    ),
    **{
        f"overload-s4-{n}": _simple(rates, 600, n, kv_tokens=35_000, latency_profile=_S4_PROFILE)
        for n, rates in ((256, (3.0, 6.0)), (512, (1.5, 3.0)), (768, (1.0, 2.0)))
    },
    "overload-s4-long": _simple((2.0, 4.0), 600, 512, kv_tokens=65_000, latency_profile=_S4_PROFILE),
}


def _tree(members: dict[str, tuple[int, float]], duration_s: float, length: int = 256, **kw) -> _Spec:
    """Overloaded groups: per group, (tenants, each tenant's rate in requests/s), `length`-token prompts and outputs."""
    names = tuple(f"{g}/user-{i}" if n > 1 else f"{g}/solo" for g, (n, _) in members.items() for i in range(n))
    rates = tuple(r for _, (n, r) in members.items() for _ in range(n))
    return _Spec(((0.0, rates),), duration_s, _same(len(rates), length), _same(len(rates), length), names=names, **kw)


_CLASSES = (("class-a", 6.0), ("class-b", 3.0), ("class-c", 1.0))


# Beyond the paper: tenant trees and priority classes (docs/workloads.md). The engine serves about 1.7 requests of
# 256/256 tokens a second (about 14 of 64/64): each group below is overloaded on its own
_SPECS |= {
    "two-orgs": _tree({"org-a": (10, 0.6), "org-b": (1, 3.0)}, 360),
    "two-orgs-weighted": _tree({"org-a": (10, 0.6), "org-b": (1, 3.0)}, 360, groups=(("org-a", 3.0), ("org-b", 1.0))),
    "tiers": _tree({"premium": (2, 1.5), "free": (2, 1.7)}, 360, priorities=(("premium", 0), ("free", 1))),
    "tiers-10x": _tree({"premium": (2, 1.5), "free": (2, 8.5)}, 360, priorities=(("premium", 0), ("free", 1))),
    "classes-6-3-1": _tree({c: (2, 6.0) for c, _ in _CLASSES}, 360, 64, groups=_CLASSES),
    "classes-6-3-1-long": _tree({c: (2, 1.5) for c, _ in _CLASSES}, 360, groups=_CLASSES),
}
WORKLOADS: tuple[str, ...] = tuple(_SPECS)


def _count(rate: float, span_s: float) -> int:
    # int(rate * span), tolerant of float error such as 0.7 * 300 = 209.99999999999997.
    return max(0, int(math.floor(rate * span_s + 1e-9)))


def _uniform(rng: np.random.Generator, rate: float, start_s: float, span_s: float) -> np.ndarray:
    """int(rate * span) requests spaced exactly 1/rate apart after a random phase in [0, 1/rate)."""
    if rate <= 0:
        return np.empty(0)
    phase = rng.uniform(0.0, 1.0 / rate)
    return start_s + phase + np.arange(_count(rate, span_s)) / rate


def _poisson(rng: np.random.Generator, total_rate: float, duration_s: float) -> np.ndarray:
    """Arrival times of a Poisson process of total_rate on [0, duration_s)."""
    expected = total_rate * duration_s
    chunk = int(expected + 6 * math.sqrt(expected) + 16)
    times = np.cumsum(rng.exponential(1.0 / total_rate, size=chunk))
    while times[-1] < duration_s:  # practically never taken
        more = times[-1] + np.cumsum(rng.exponential(1.0 / total_rate, size=chunk))
        times = np.concatenate([times, more])
    return times[times < duration_s]


def _increase(rng: np.random.Generator, r0: float, r1: float, ramp_s: float, duration_s: float) -> np.ndarray:
    """Gap 1/r(t), r rising linearly from r0 at t=0 to r1 at t=ramp_s (held at r1 afterwards)."""
    times: list[float] = []
    t = rng.uniform(0.0, 1.0 / r0)
    while t < duration_s:
        times.append(t)
        t += 1.0 / (r0 + (r1 - r0) * min(t / ramp_s, 1.0))
    return np.asarray(times)


def _client_times(spec: _Spec, rng: np.random.Generator, duration_s: float) -> list[np.ndarray]:
    """Per-client arrival times before the on/off rule, in generation order."""
    n = len(spec.prompt)
    if spec.arrivals == "poisson":
        rates = np.asarray(spec.phases[0][1])
        times = _poisson(rng, float(rates.sum()), duration_s)
        cdf = np.cumsum(rates / rates.sum())
        who = np.minimum(np.searchsorted(cdf, rng.random(times.size), side="right"), n - 1)
        return [times[who == i] for i in range(n)]
    if spec.arrivals == "increase":
        (_, (rate0, r0)), (ramp_s, (_, r1)) = spec.phases
        return [_uniform(rng, rate0, 0.0, duration_s), _increase(rng, r0, r1, ramp_s, duration_s)]
    out: list[list[np.ndarray]] = [[] for _ in range(n)]
    for k, (start, phase_rates) in enumerate(spec.phases):
        if start >= duration_s:
            break
        end = spec.phases[k + 1][0] if k + 1 < len(spec.phases) else duration_s
        span = min(end, duration_s) - start
        for i, rate in enumerate(phase_rates):
            out[i].append(_uniform(rng, rate, start, span))
    return [np.concatenate(parts) for parts in out]


def _lengths(rng: np.random.Generator, length: Length, n: int) -> np.ndarray:
    if isinstance(length, tuple):
        return rng.integers(length[0], length[1], size=n)
    return np.full(n, length, dtype=np.int64)


def make_workload(name: str, seed: int = 0, duration_s: float | None = None) -> Workload:
    """Build the named workload of the paper.

    duration_s overrides the paper's duration (shorter runs for tests or --quick);
    phases and on/off periods keep their absolute times, and a longer duration
    continues the last phase (for "increase": holds the final rate).
    """
    spec = _SPECS.get(name)
    if spec is None:
        raise WorkloadError(f"unknown workload {name!r}; valid names: {', '.join(WORKLOADS)}")
    try:
        duration_s = float(spec.duration_s if duration_s is None else duration_s)
    except (TypeError, ValueError):
        duration_s = math.nan
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise WorkloadError(f"workload {name!r}: duration_s must be a positive number")
    rng = np.random.default_rng(seed)

    times, clients, prompts, outputs = [], [], [], []
    for i, t in enumerate(_client_times(spec, rng, duration_s)):
        if i == 0 and spec.on_off_until_s > 0:
            odd = (np.floor(t / ON_OFF_PERIOD_S) % 2 == 1) & (t < spec.on_off_until_s)
            t = t[~odd]
        times.append(t)
        clients.append(np.full(t.size, i))
        prompts.append(_lengths(rng, spec.prompt[i], t.size))
        outputs.append(_lengths(rng, spec.output[i], t.size))

    t_all = np.concatenate(times)
    order = np.argsort(t_all, kind="stable")  # ties keep generation order
    names = list(spec.names) if spec.names else [f"client-{i}" for i in range(len(spec.prompt))]
    arrivals = [
        Arrival(t, names[c], p, o)
        for t, c, p, o in zip(
            t_all[order].tolist(),
            np.concatenate(clients)[order].tolist(),
            np.concatenate(prompts)[order].tolist(),
            np.concatenate(outputs)[order].tolist(),
            strict=False,
        )
    ]
    weights = dict(zip(names, spec.weights, strict=True)) if spec.weights else {}
    weights |= dict(spec.groups)
    priorities = dict(spec.priorities) or None
    return Workload(name, arrivals, duration_s, weights or None, spec.kv_tokens, spec.latency_profile, priorities)
