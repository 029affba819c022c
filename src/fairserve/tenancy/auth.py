"""Who a request is: its Bearer key, compared in constant time, wrong keys throttled per address and per key, and who
may read `/metrics`."""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import time
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Scope

from ..api.errors import error_response


def bearer(request: Request) -> str | None:
    return _bearer(request.headers.get("authorization", ""))


def scope_bearer(scope: Scope) -> str | None:
    """`bearer` from a raw ASGI scope (the hot path builds no Request): its first Authorization header's."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            return _bearer(value.decode("latin-1"))
    return None


def _bearer(authorization: str) -> str | None:
    scheme, _, key = authorization.partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and key else None


def same_key(given: str | None, secret: str | None) -> bool:
    """Whether `given` is `secret`, in time independent of where they differ (no key guessed byte by byte)."""
    if given is None or secret is None:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), secret.encode("utf-8", "surrogateescape"))


class _Failures:
    """Failed authentications by who failed (an address, a key's digest): each one's window start and count. At most
    `bound` are remembered, the one whose last failure is oldest forgotten first."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.entries: dict[Any, tuple[float, int]] = {}  # who -> (window start, failures in it)

    def wait(self, who: Any, limit: int, window_s: float, now: float) -> float:
        """Seconds until `who`'s window ends if it failed `limit` times in it, else 0."""
        entry = self.entries.get(who)
        if entry is None or entry[1] < limit:
            return 0.0
        left = entry[0] + window_s - now
        if left <= 0:
            del self.entries[who]
            return 0.0
        return left

    def add(self, who: Any, window_s: float, now: float) -> None:
        start, count = self.entries.pop(who, (now, 0))
        if now - start >= window_s:
            start, count = now, 0
        self.entries[who] = (start, count + 1)  # NOTE: re-inserted last: the dict's order is by last failure
        if len(self.entries) > self.bound:
            del self.entries[next(iter(self.entries))]


class AuthSettings(Protocol):
    """The keys the throttle reads (a gateway's configuration)."""

    auth_failure_limit: int
    auth_failure_window_s: float


class AuthThrottle:
    """Failed authentications (401s), counted per client address and per key presented: after `limit` of them
    within `window_s` from one address, or with one key from any address, a request from that address or with that
    key is refused (429 with Retry-After) until the window ends, unless its key is valid. The caller checks the key
    (`blocked` first, the key only when it is non-zero), so a valid key is served whatever others sent from its
    address, while wrong keys are refused before any work. `limit` 0: no throttling. At most `max_addresses` addresses
    and `max_keys` keys are remembered (the oldest failure forgotten first); a key is remembered by a digest keyed
    with a secret of this process, never in clear. Behind a reverse proxy the address is the one it forwards
    (uvicorn's proxy headers, `forwarded_allow_ips`)."""

    def __init__(
        self,
        limit: int,
        window_s: float,
        max_addresses: int = 100_000,
        max_keys: int = 100_000,
        clock: Any = time.monotonic,
    ) -> None:
        self.limit, self.window_s, self.clock = limit, window_s, clock
        self.addresses, self.keys = _Failures(max_addresses), _Failures(max_keys)
        self._secret = os.urandom(16)

    def check(self, old: AuthSettings, new: AuthSettings) -> None:
        """Any limit and window apply live."""

    def configure(self, cfg: AuthSettings) -> None:
        """From the next failure on (the failures counted so far are kept)."""
        self.limit, self.window_s = cfg.auth_failure_limit, cfg.auth_failure_window_s

    async def start(self) -> None:
        """Nothing runs of its own: failures are counted as requests come."""

    async def stop(self) -> None:
        """Nothing to end."""

    def blocked(self, address: str | None, key: str | None = None) -> float:
        """Seconds until a request from `address` with `key` is no longer refused (unless its key is valid); 0: not
        refused."""
        if not self.limit:
            return 0.0
        now = self.clock()
        wait = self.addresses.wait(address or "", self.limit, self.window_s, now)
        if key is not None and self.keys.entries:  # NOTE: no digest on the way of requests while no key failed
            wait = max(wait, self.keys.wait(self._digest(key), self.limit, self.window_s, now))
        return wait

    def failed(self, address: str | None, key: str | None = None) -> None:
        """A 401 for a request from `address` with `key` (None: it carried none, counted by its address alone)."""
        if not self.limit:
            return
        now = self.clock()
        self.addresses.add(address or "", self.window_s, now)
        if key is not None:
            self.keys.add(self._digest(key), self.window_s, now)

    def _digest(self, key: str) -> bytes:
        return hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=16, key=self._secret).digest()

    def refusal(self, seconds: float) -> Response:
        return error_response(
            429,
            f"too many failed authentications from this address or with this key; try again in {math.ceil(seconds)} s",
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
