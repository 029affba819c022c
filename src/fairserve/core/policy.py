"""The one policy interface: a policy decides admission *order*, and nothing else.

The ledger (`core.ledger`) owns the tenants' accounts, the request life cycle and the charges; it calls a policy's
queue hooks (`open`, `accept`, `enqueue`, `peek`, `dequeue`, `remove`) and, for policies that order by counters,
`on_charge` after every charge. What a policy supports is declared once per class, in `capabilities`: drivers and
the ledger read it, never the class.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar

from .account import Account, Unsupported
from .cost import CostFunction, LinearCost
from .predictor import Predictor
from .request import Request


class PolicyError(RuntimeError):
    """The driver broke the protocol (e.g. finished a request that was never admitted)."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a policy class supports; every flag defaults to False."""

    orders_by_counter: bool = False  # the order depends on charges: the ledger calls `on_charge`, drivers report early
    uses_weights: bool = False  # weights change the order; else a weight change is `Unsupported` (admin API: 409)
    keeps_counters: bool = False  # counters that `reset_counters` zeroes; else a reset is `Unsupported`
    shares_counters: bool = False  # admits the smallest `Account.counter` first, and takes counters set from elsewhere
    lifts: bool = False  # the paper's counter lift when a tenant goes from nothing queued to something queued
    rejects_at_arrival: bool = False  # may refuse a request at arrival (rate limits): an engine cannot
    tree: bool = False  # orders by the tenant tree (each group's share) and by priority levels
    uses_prefix_cache: bool = False  # orders by waiting requests' cached prefixes: needs a driver with a prefix cache


class Policy(ABC):
    """Base class. `cost` and `predictor` are the policy's plug-ins, which the ledger charges with."""

    name: str = "policy"
    capabilities: ClassVar[Capabilities] = Capabilities()
    retry_after_s: float = 1.0  # what a tenant refused by `accept()` is told to wait (rate limits: their window)
    # NOTE: installed by a driver with a prefix cache: how many prompt tokens of a waiting request its cache holds now
    cached: Callable[[Request], int] | None = None

    def __init__(self, cost: CostFunction | None = None, predictor: Predictor | None = None) -> None:
        self.cost = cost if cost is not None else LinearCost()
        self.predictor = predictor

    # ---- queue hooks (the ledger calls them; the counts are the ledger's) ----------------------------------------
    def open(self, acct: Account) -> None:  # noqa: B027  # an optional hook: most policies need nothing here
        """A tenant seen for the first time."""

    def close(self, acct: Account) -> None:  # noqa: B027  # an optional hook, like `open`
        """A tenant that never had a request turned out to be a group (a tenant below it appeared)."""

    def accept(self, req: Request, now: float) -> bool:
        """Whether `req` is accepted at arrival (only rate-limiting policies refuse)."""
        return True

    @abstractmethod
    def enqueue(self, req: Request, front: bool) -> None:
        """`req` is queued: a new arrival at the back of its tenant's queue, or put back at its front."""

    @abstractmethod
    def peek(self) -> Request | None:
        """The request to admit next, or None if nothing is queued."""

    @abstractmethod
    def dequeue(self, req: Request) -> None:
        """Remove `req`, which `peek()` just returned: it is admitted."""

    @abstractmethod
    def remove(self, req: Request) -> None:
        """Remove a queued request from anywhere in the queue (it was cancelled)."""

    def on_charge(self, acct: Account, amount: float) -> None:  # noqa: B027  # optional: counter policies only
        """`amount` was charged to `acct` (negative: refunded). Called only where `orders_by_counter`."""

    # ---- counters -------------------------------------------------------------------------------------------------
    def counter_of(self, acct: Account) -> float:
        """The counter shown for `acct`; for policies without counters, the service it received."""
        return acct.service

    def min_counter(self, parent: Account | None = None) -> float | None:
        """The smallest counter among the children of `parent` (a group; None: the top of the tree) with something
        queued: what the lift lifts to. None if none."""
        return None

    def set_counter(self, acct: Account, counter: float) -> None:
        """`acct.counter` becomes `counter`, computed elsewhere (shared state across replicas)."""
        raise Unsupported(f"policy {self.name!r} keeps no counters that can be set")

    def reset_counters(self, accounts: Iterable[Account]) -> None:
        """Every counter back to 0 (service received stays)."""
        raise Unsupported(f"policy {self.name!r} keeps no counters: there is nothing to reset")
