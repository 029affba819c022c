"""Longest prefix match (SGLang's `lpm`): the waiting request with the most prompt tokens in the prefix cache goes
first (ties: arrival order). The locality-only baseline: it maximises cache hits and starves requests that miss.

A policy that orders by cached prefix reads `Policy.cached`, which its driver installs: how many prompt tokens of a
waiting request the driver's prefix cache holds now. It is asked at every `peek` for every candidate, so the driver
should answer cheaply (the simulator remembers the answer while its cache's contents stay the same). A driver with
no prefix cache refuses these policies (`Capabilities.uses_prefix_cache`, `registry.check_policy`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .cost import CostFunction
from .policy import Capabilities, Policy, PolicyError
from .registry import register
from .request import Request


def longest_cached(candidates: Iterable[Request], cached: Callable[[Request], int]) -> Request | None:
    """The candidate with the most cached prompt tokens; among equals the one that arrived first."""
    best: Request | None = None
    most = -1
    for req in candidates:
        n = cached(req)
        if n > most or (n == most and best is not None and req.seq < best.seq):
            best, most = req, n
    return best


def cached_of(policy: Policy) -> Callable[[Request], int]:
    if policy.cached is None:
        raise PolicyError(f"policy {policy.name!r} needs a driver with a prefix cache (Policy.cached is not set)")
    return policy.cached


class LPM(Policy):
    name = "lpm"
    capabilities = Capabilities(uses_prefix_cache=True)

    def __init__(self, cost: CostFunction | None = None) -> None:
        super().__init__(cost)
        self._waiting: dict[Request, None] = {}

    def enqueue(self, req: Request, front: bool) -> None:
        self._waiting[req] = None  # NOTE: a request put back keeps its arrival order (`seq`) for ties

    def peek(self) -> Request | None:
        return longest_cached(self._waiting, cached_of(self))

    def dequeue(self, req: Request) -> None:
        del self._waiting[req]

    def remove(self, req: Request) -> None:
        del self._waiting[req]


register("lpm", LPM, "longest cached prefix first (SGLang's lpm: the most cache hits, no fairness; prefix cache only)")
