"""A request on its way through the gateway (`Ticket`, the ledger entry's `item`) and how it ended (`Ending`)."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...core import CostFunction, Request
from .footprint import Footprint

if TYPE_CHECKING:
    from ..dispatch.pools import Backend, Pool


@dataclass(frozen=True)
class Ending:
    """How an accepted request ended, as the proxy learned it; `Scheduler.close` books it."""

    outcome: str  # ok, timeout, client_disconnected, client_stalled, backend_error, backend_rejected, ...
    prompt: int | None = None  # the backend's `usage`, when it reported one
    output: int | None = None
    refund: bool = False  # charge nothing: the backends failed it before it produced anything


@dataclass(eq=False)
class Ticket:
    """One request on its way through the gateway; its ledger entry is `req` (`req.item` is the ticket)."""

    tenant: str
    footprint: Footprint  # the most it may use: its prompt and output bound
    queued_at: float
    admitted: asyncio.Future[Backend]
    pool: Pool = field(default=None, repr=False)  # type: ignore[assignment]  # NOTE: set by `new_ticket`
    model: str | None = None
    cost: CostFunction | None = None  # its model's price (None: w_p, w_q)
    arrived_at: float = 0.0  # first queued (queued_at moves on a requeue)
    dispatched_at: float | None = None  # first admitted to a backend
    first_token_at: float | None = None  # its first output reached the client (or its whole answer came)
    kind: str = ""  # the endpoint (chat, completions, embeddings, responses)
    backend_name: str = ""  # the backend it was last sent to (the usage log)
    req: Request | None = None  # set when the ledger accepts it
    backend: Backend | None = None
    tried: set[str] = field(default_factory=set)  # backends that failed it
    deadline: float = math.inf  # it leaves the queue (503) if still queued then
    lost: int = 0  # connections lost before any output (MAX_LOST)
    ending: Ending | None = None  # recorded by the proxy, booked once by `Scheduler.close`
    outcome: str | None = None  # the outcome booked
    request_id: str = ""  # X-Request-Id: the client's or made here; logged, sent upstream, returned
    sent: bool = False  # a request went upstream for it (a client that leaves before is charged nothing)
    stalled: str = ""  # why its stream was cut for a client that does not read (gateway/relay/stalls.py)
    upstream: Any = None  # the upstream response open for it (closed at once when its client leaves)
    holding: asyncio.Task[Any] | None = None  # its quota hold, taken at its first dispatch (gateway/quota/gate.py)
    prefix: tuple[str, ...] = ()  # prefix dispatch: its prompt's block digests (gateway/dispatch/locality.py)
    budget: str | None = None  # the node of its key's budget (a key made through the API with one: `key:ID`)
    fell_back_from: str | None = None  # the model it asked for, once queued it moved to a fallback (`model`)

    @property
    def tokens(self) -> int:
        """The capacity it reserves on a backend: its prompt and output bound."""
        return self.footprint.tokens


def entry(t: Ticket, request_id: str, priority: int | None, cost: CostFunction | None) -> Request:
    """`t`'s ledger entry: its tenant, footprint and arrival, priced by `cost` (None: the ledger's)."""
    fp = t.footprint
    return Request(
        id=request_id,
        tenant=t.tenant,
        prompt_tokens=fp.prompt_tokens,
        max_tokens=fp.max_output,
        arrival_s=t.queued_at,
        priority=priority,
        item=t,
        cost=cost,
    )


async def admitted_within(t: Ticket, timeout_s: float) -> Backend | None:
    """The backend `t` is admitted to within `timeout_s`, else None."""
    # NOTE: asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancellation (the client left) that
    # lands as the admission does, and the request would go upstream for nobody
    try:
        async with asyncio.timeout(timeout_s):
            return await asyncio.shield(t.admitted)
    except TimeoutError:
        return t.admitted.result() if t.admitted.done() else None
