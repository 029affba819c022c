"""How one attempt at a backend failed before any output reached the client (`Failed`), and a backend's
`Retry-After` read (`retry_after`): what the proxy needs to try the next backend or answer the client."""

from __future__ import annotations

import email.utils
import time

from ..dispatch.pools import Backend
from ..settings.urls import redact_text


class Failed(Exception):
    """The backend failed this attempt before any output reached the client: `unreachable` (no connection),
    `lost` (the connection broke before an answer), `timeout` (no answer in time: a 504 if no backend is left) or
    `busy` (429/503 with Retry-After: a 503 with it if no backend is left)."""

    def __init__(
        self,
        detail: str,
        unreachable: bool = False,
        lost: bool = False,
        timeout: bool = False,
        busy: float | None = None,
    ) -> None:
        super().__init__(detail)
        self.unreachable, self.lost, self.timeout = unreachable, lost, timeout
        self.busy = busy  # it answered 429/503 with Retry-After: skipped for this long

    @classmethod
    def of(cls, backend: Backend, kind: str, detail: str = "") -> Failed:
        """The failure of an upstream hop that broke (`UpstreamError.kind`)."""
        return cls(
            redact_text(f"{backend.name}: {detail or kind}"),
            unreachable=kind in ("ConnectError", "ConnectTimeout"),
            lost=kind in ("ReadError", "RemoteProtocolError"),
            timeout=kind == "ReadTimeout",
        )


def retry_after(value: bytes | None) -> float | None:
    """A `Retry-After` header's seconds (delta-seconds or an HTTP date); None if absent or unreadable."""
    if value is None:
        return None
    text = value.decode("latin-1").strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - time.time())
