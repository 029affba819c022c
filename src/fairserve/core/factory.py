"""Policies by name: `make_policy("vtc")`, `make_policy("rpm:5")`, `make_policy("vtc-predict:oracle±50")`."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from .cost import CostFunction, make_cost
from .drr import DRR
from .fcfs import FCFS, RPM
from .ledger import MAX_WEIGHT, MIN_WEIGHT, check_weight
from .policy import Policy
from .predictor import make_predictor
from .vtc import VTC


class SchedulingPolicy(str, Enum):
    FCFS = "fcfs"
    VTC = "vtc"
    WEIGHTED_VTC = "weighted-vtc"  # vtc with weights; accepted for readability
    VTC_PREDICT = "vtc-predict"  # argument: predictor (oracle, oracle±X, moving-average); default moving-average
    LCF = "lcf"
    RPM = "rpm"  # argument: requests per minute per client; default 20
    DRR = "drr"  # argument: quantum in cost units; default 500 (the artifact: KV pool / 20)


POLICIES = tuple(p.value for p in SchedulingPolicy)


def make_policy(
    spec: str,
    *,
    weights: dict[str, float] | None = None,
    cost: str | CostFunction | Callable[[int, int], float] | None = None,
    w_p: float = 1.0,
    w_q: float = 2.0,
    seed: int = 0,
) -> Policy:
    """Build a policy from `name[:argument]`. Raises ValueError with the valid names on a bad spec."""
    name, _, arg = spec.strip().partition(":")
    try:
        kind = SchedulingPolicy(name.lower())
    except ValueError:
        raise ValueError(
            f"unknown policy {spec!r}; choose one of: {', '.join(POLICIES)} "
            "(with an argument: rpm:N, drr:QUANTUM, vtc-predict:PREDICTOR)"
        ) from None
    common = dict(cost=make_cost(cost, w_p, w_q), weights=weights)
    if arg and kind not in (SchedulingPolicy.RPM, SchedulingPolicy.DRR, SchedulingPolicy.VTC_PREDICT):
        raise ValueError(f"policy {name!r} takes no argument (got {spec!r})")
    if kind is SchedulingPolicy.FCFS:
        return FCFS(**common)
    if kind in (SchedulingPolicy.VTC, SchedulingPolicy.WEIGHTED_VTC):
        return VTC(**common)
    if kind is SchedulingPolicy.LCF:
        return VTC(lift=False, **common)
    if kind is SchedulingPolicy.VTC_PREDICT:
        return VTC(predictor=make_predictor(arg or "moving-average", seed), **common)
    if kind is SchedulingPolicy.RPM:
        return RPM(_number(arg or "20", spec, int), **common)
    return DRR(_number(arg or "500", spec, float), **common)


def parse_weights(text: str | None, source: str = "--weights") -> dict[str, float] | None:
    """`client=weight,...` (from a flag or an environment variable named by `source`); None for no text. Raises
    ValueError with one line for a malformed entry or a weight out of range."""
    if not text:
        return None
    out = {}
    for part in text.split(","):
        client, _, value = (x.strip() for x in part.partition("="))
        try:
            out[client] = check_weight(client, float(value))
        except ValueError:
            raise ValueError(
                f"bad {source} entry {part!r}: expected CLIENT=WEIGHT with WEIGHT from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}"
            ) from None
        if not client:
            raise ValueError(f"bad {source} entry {part!r}: expected CLIENT=WEIGHT")
    return out


def _number(text: str, spec: str, kind: type):
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"bad argument in policy {spec!r}: {text!r} is not a number") from None
