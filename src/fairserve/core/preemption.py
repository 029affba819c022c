"""Preemption's rules, engine-agnostic (docs/preemption.md): which running requests to preempt so that the policy's
next request is admitted. The simulator (sim/preempt.py) and the vLLM plugin (engines/vllm_preempt.py) both call
`fair_victims` (fairness-triggered preemption, `preempt=DELTA`); the plugin takes its victims for priority that
preempts (`priority_victims`) and for memory (`victim_order`) from here too. Each engine says what "fits" means."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol, TypeVar

from .account import Account


class Preemptible(Protocol):
    """A running request as the rule sees it: its tenant and how often it was preempted for fairness."""

    @property
    def tenant(self) -> str: ...

    @property
    def fair_preemptions(self) -> int: ...


R = TypeVar("R", bound=Preemptible)


def fair_victims(
    head: R,
    running: Iterable[R],
    accounts: Mapping[str, Account],
    delta: float,
    preempt_max: int,
    fits: Callable[[R, list[R]], bool],
) -> list[R]:
    """The running requests to preempt so that `head` (the policy's next request, which did not fit) is admitted:
    requests of tenants whose counter exceeds head's tenant's by more than `delta`, not yet preempted `preempt_max`
    times, the highest counter first and the newest first within one counter, as few as make `fits(head, victims)`
    true. Empty if even all of them would not make it fit (removing running requests never makes a fit fail).
    `running` is in admission order."""
    floor = accounts[head.tenant].counter + delta
    candidates = [
        r
        for r in reversed(list(running))  # admission order: the newest first
        if r.tenant != head.tenant and accounts[r.tenant].counter > floor and r.fair_preemptions < preempt_max
    ]
    if not candidates or not fits(head, candidates):
        return []
    candidates.sort(key=lambda r: -accounts[r.tenant].counter)  # NOTE: stable: the newest first within a counter
    for n in range(1, len(candidates)):
        if fits(head, candidates[:n]):
            return candidates[:n]
    return candidates


class Leveled(Preemptible, Protocol):
    """A running request with the priority level it runs at (0 the best) and its place in admission order."""

    @property
    def level(self) -> int: ...


L = TypeVar("L", bound=Leveled)


def victim_order(running: Iterable[L], accounts: Mapping[str, Account]) -> list[L]:
    """`running` (in admission order) as victims are taken: the worst level first, within a level the tenant with
    the highest counter first, within a tenant the newest request first."""
    newest_first = list(reversed(list(running)))
    # NOTE: stable: the newest first within one (level, counter)
    return sorted(newest_first, key=lambda r: (-r.level, -accounts[r.tenant].counter))


def priority_victims(
    head: L,
    running: Iterable[L],
    accounts: Mapping[str, Account],
    preempt_max: int,
    fits: Callable[[L, list[L]], bool],
) -> list[L]:
    """Priority that preempts (`preempt-priority=1`): the running requests to preempt so that `head` (the policy's
    next request, which did not fit) is admitted: requests of a level worse than head's (never an equal one: no
    ping-pong), not yet preempted `preempt_max` times, in `victim_order`, as few as make `fits(head, victims)`
    true. Empty if even all of them would not make it fit."""
    candidates = victim_order(
        (r for r in running if r.level > head.level and r.fair_preemptions < preempt_max), accounts
    )
    if not candidates or not fits(head, candidates):
        return []
    for n in range(1, len(candidates)):
        if fits(head, candidates[:n]):
            return candidates[:n]
    return candidates
