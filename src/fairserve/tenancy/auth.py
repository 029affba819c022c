"""Who a request is: its Bearer key, compared in constant time, wrong keys throttled per address, and who may read
`/metrics`."""

from __future__ import annotations

import hmac
import math
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..api.errors import error_response


def bearer(request: Request) -> str | None:
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and key else None


def same_key(given: str | None, secret: str | None) -> bool:
    """Whether `given` is `secret`, in time independent of where they differ (no key guessed byte by byte)."""
    if given is None or secret is None:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), secret.encode("utf-8", "surrogateescape"))


class AuthThrottle:
    """Repeated failed authentications (401) from one client address: after `limit` of them within `window_s`, every
    request from that address is refused (429 with Retry-After) until the window ends, whatever key it carries, so
    keys cannot be guessed at speed. `limit` 0: no throttling. At most `max_addresses` addresses are remembered (the
    oldest forgotten first). Behind a reverse proxy the address is the one it forwards (uvicorn's proxy headers)."""

    def __init__(self, limit: int, window_s: float, max_addresses: int = 100_000, clock: Any = time.monotonic) -> None:
        self.limit, self.window_s, self.max_addresses, self.clock = limit, window_s, max_addresses, clock
        self._failures: dict[str, tuple[float, int]] = {}  # address -> (window start, failures in it)

    def blocked(self, address: str | None) -> float:
        """Seconds until `address` may try again; 0 if it may now."""
        entry = self._failures.get(address or "") if self.limit else None
        if entry is None or entry[1] < self.limit:
            return 0.0
        left = entry[0] + self.window_s - self.clock()
        if left <= 0:
            del self._failures[address or ""]
            return 0.0
        return left

    def failed(self, address: str | None) -> None:
        if not self.limit:
            return
        key, now = address or "", self.clock()
        start, count = self._failures.pop(key, (now, 0))
        if now - start >= self.window_s:
            start, count = now, 0
        self._failures[key] = (start, count + 1)  # NOTE: re-inserted last: the dict's order is by last failure
        if len(self._failures) > self.max_addresses:
            del self._failures[next(iter(self._failures))]

    def refusal(self, seconds: float) -> Response:
        return error_response(
            429,
            f"too many failed authentications from this address; try again in {math.ceil(seconds)} s",
            code="auth_throttled",
            headers={"Retry-After": str(math.ceil(seconds))},
        )


def metrics_denied(request: Request, metrics_key: str | None) -> Response | None:
    """The 401 for `/metrics` when `metrics_key` is set and the request does not carry it as Bearer, else None."""
    if metrics_key is None or same_key(bearer(request), metrics_key):
        return None
    return error_response(
        401,
        "/metrics needs 'Authorization: Bearer METRICS_KEY'",
        code="invalid_key",
        headers={"WWW-Authenticate": "Bearer"},
    )
