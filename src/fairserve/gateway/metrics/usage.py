"""The usage log: one JSON line per request, for billing and debugging (`usage_log = "PATH"`, or `"-"`: stdout).

A line is written when a request ends (or is refused): its id, tenant, model, endpoint, outcome, the prompt and
output tokens it was charged for (the backend's usage where it reported one), the service charged (w_p·prompt +
w_q·output at its model's price), its wait in the queue and its time to first token (seconds, null where there was
none). The file is opened for appending and each line is written whole, so a log rotated by renaming it is reopened
at the next start; lines go out as the requests end (line-buffered), on the event loop: a line is a few hundred
bytes.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..admission.ticket import Ticket

log = logging.getLogger("fairserve.gateway")


class UsageLogError(ValueError):
    """The usage log cannot be opened (one line)."""


class UsageLog:
    """`clock`: the one the tickets' times are on (the scheduler's), for a request's duration at its end."""

    def __init__(self, target: str | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.target = target
        self.clock = clock
        self._out: IO[str] | None = None
        if target == "-":
            self._out = sys.stdout
        elif target is not None:
            try:
                self._out = open(target, "a", buffering=1, encoding="utf-8")  # noqa: SIM115  NOTE: kept open
            except OSError as e:
                raise UsageLogError(f"usage_log: cannot open {target!r} for appending: {e.strerror}") from None

    @property
    def on(self) -> bool:
        return self._out is not None

    def write(self, record: dict[str, Any]) -> None:
        if self._out is None:
            return
        line = json.dumps({"time": datetime.now(UTC).isoformat(timespec="milliseconds"), **record})
        try:
            self._out.write(line + "\n")
        except (OSError, ValueError) as e:  # NOTE: a full disk must not fail the requests: said once per failure
            log.error("usage log: cannot write to %s: %s", self.target, e)

    def ticket(self, t: Ticket) -> None:
        """The line of a request that entered the queue (or was refused there), after it ended."""
        if self._out is None:
            return
        req = t.req
        admitted = req is not None and req.admitted
        self.write(
            {
                "request_id": t.request_id,
                "tenant": t.tenant,
                "model": t.model,
                "endpoint": t.kind,
                "outcome": t.outcome,
                "prompt_tokens": req.prompt_tokens if req is not None and admitted else 0,
                "output_tokens": req.output_done if req is not None else 0,
                "service": round(req.charged, 6) if req is not None else 0.0,
                "queue_wait_s": _since(t.arrived_at, t.dispatched_at),
                "ttft_s": _since(t.arrived_at, t.first_token_at),
                "backend": t.backend_name or None,
                "duration_s": _since(t.arrived_at, self.clock()),
            }
        )

    def refused(self, request_id: str, tenant: str, model: str | None, kind: str, outcome: str) -> None:
        """The line of a request refused before it was queued (a bad body, a model it may not use, ...)."""
        if self._out is None:
            return
        self.write(
            {
                "request_id": request_id,
                "tenant": tenant,
                "model": model,
                "endpoint": kind,
                "outcome": outcome,
                "prompt_tokens": 0,
                "output_tokens": 0,
                "service": 0.0,
                "queue_wait_s": None,
                "ttft_s": None,
                "backend": None,
                "duration_s": None,
            }
        )

    def close(self) -> None:
        if self._out is not None and self._out is not sys.stdout:
            self._out.close()
        self._out = None


def _since(start: float, end: float | None) -> float | None:
    return round(end - start, 6) if end is not None else None
