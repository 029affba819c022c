"""A request as the scheduling core sees it: which tenant sent it, how big it is, and what has been charged for it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .account import Account
from .cost import CostFunction


class RequestState(StrEnum):
    QUEUED = "queued"  # waiting for admission (this is what makes a tenant "backlogged")
    RUNNING = "running"  # admitted, being served by the engine
    FINISHED = "finished"
    ABORTED = "aborted"  # cancelled by the client or the driver
    REJECTED = "rejected"  # refused at arrival (e.g. an RPM limit)


@dataclass(slots=True, eq=False, kw_only=True)
class Request:
    """One request. The driver fills the first block; the ledger owns the accounting block.

    `eq=False`: requests are compared and hashed by identity, so they can key dicts and sets.
    """

    id: Any
    tenant: str
    prompt_tokens: int
    max_tokens: int | None = None
    predicted_output: int | None = None  # the driver's hint (the simulator passes the true length: the oracle)
    arrival_s: float = 0.0
    priority: int | None = None  # named by the driver (vLLM's `priority`); the ledger sets the one it runs at
    item: Any = field(default=None, repr=False)  # the driver's own object (a gateway ticket, an engine's request)
    cost: CostFunction | None = field(default=None, repr=False)  # its own price (a model's); None: the policy's
    cached_tokens: int = 0  # prompt tokens a prefix cache served at its first admission (set before pop: priced)

    # accounting, written only by the ledger
    account: Account = field(default=None, repr=False)  # type: ignore[assignment]  # the tenant's, set at arrival
    state: RequestState = RequestState.QUEUED
    admitted: bool = False  # admitted at least once (a preempted, re-queued request keeps this)
    output_done: int = 0  # output tokens reported so far
    predicted: int = 0  # output tokens charged ahead at admission (vtc-predict)
    charged: float = 0.0  # total cost charged to the tenant for this request so far
    admission: float = 0.0  # what its latest pop() charged (0 when it was re-admitted after a preemption)
    seq: int = 0  # arrival order, for deterministic ties

    @property
    def done(self) -> bool:
        return self.state in (RequestState.FINISHED, RequestState.ABORTED, RequestState.REJECTED)
