"""`flood`: one tenant floods a fleet while seven light ones keep their pace (beyond the paper: the shape that shuffle
sharding, `--dispatch shard:K` in docs/fleet.md, is for). Seven light tenants (`light-0` … `light-6`) each send a
request a second (200-token prompts, 100 output tokens, uniform after a random phase) for the whole run, 30 s;
tenant `flood` sends 300 requests (300 + 300 tokens) at 1 s, a millisecond apart: more than eight engines of the
default preset (A10G, 10,000-token pools) serve in the run's 30 s. No weights: every tenant the same share."""

from __future__ import annotations

import math

import numpy as np

from .base import Arrival, Workload, WorkloadError

FLOOD = "flood"
LIGHT = tuple(f"light-{i}" for i in range(7))
LIGHT_RATE, LIGHT_PROMPT, LIGHT_OUTPUT = 1.0, 200, 100
BURST, BURST_AT_S, BURST_GAP_S, BURST_PROMPT, BURST_OUTPUT = 300, 1.0, 1e-3, 300, 300
DURATION_S = 30.0


def flood_workload(seed: int = 0, duration_s: float | None = None) -> Workload:
    """The `flood` workload; `duration_s` shortens or lengthens the light tenants' stream (the burst stays at 1 s,
    and only its requests before the end are kept)."""
    duration = DURATION_S if duration_s is None else duration_s
    if not (isinstance(duration, int | float) and math.isfinite(duration) and duration > 0):
        raise WorkloadError(f"workload {FLOOD!r}: duration_s must be a positive number")
    rng = np.random.default_rng(seed)
    arrivals = []
    for client in LIGHT:
        t = float(rng.uniform(0.0, 1.0 / LIGHT_RATE))
        while t < duration:
            arrivals.append(Arrival(t, client, LIGHT_PROMPT, LIGHT_OUTPUT))
            t += 1.0 / LIGHT_RATE
    burst = (BURST_AT_S + i * BURST_GAP_S for i in range(BURST))
    arrivals += [Arrival(t, FLOOD, BURST_PROMPT, BURST_OUTPUT) for t in burst if t < duration]
    return Workload(FLOOD, sorted(arrivals, key=lambda a: a.arrival_s), float(duration))
