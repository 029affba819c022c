"""Clients that do not read their stream. Without a bound, a tenant whose clients read nothing (or a byte now and then)
keeps its streams, and so its backend slots, forever: the policy never gets a slot to give to anyone else.

Every streamed answer is watched from when its first bytes go out: one sweep every `min(1, timeout / 4)` s reads, for
each stream, how much of what was written has left the gateway (what the kernel still holds for the client,
`TIOCOUTQ`, plus the transport's buffer, subtracted from what was written). A stream is cut when its client

- has accepted nothing for `client_write_timeout_s` while data waited for it (nginx's `send_timeout`), or
- has accepted less than `client_min_rate` bytes per second over a stretch of `client_write_timeout_s` during which
  data waited for it all along (a trickle reader; a client that keeps up never has data waiting that long).

A cut stream's connection is closed at once (its unsent data dropped); it is charged what was written for it, its
backend slot is freed, and it counts under the outcome `client_stalled`. Where the kernel's queue cannot be read
(not Linux), what the kernel holds counts as accepted: the stream is cut only once that is full.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import struct
import termios
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..component import Part

if TYPE_CHECKING:
    from ..settings.config import GatewayConfig

log = logging.getLogger("fairserve.gateway")


def unsent(sock: Any) -> int:
    """Bytes the kernel holds for the peer (not yet acknowledged); 0 where that cannot be read."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0])
    except (OSError, AttributeError, ValueError):
        return 0


@dataclass(eq=False, slots=True)
class Watched:
    """One stream being delivered. The relay adds to `written` as it hands bytes to the server."""

    transport: Any  # the client's connection (asyncio.Transport)
    ticket: Any  # gateway.scheduler.Ticket: `stalled` is set on it when cut
    written: int = 0
    accepted: int = 0  # the most the client was seen to have accepted
    progress_at: float = 0.0  # when `accepted` last grew, or nothing waited for the client
    behind_since: float | None = None  # data has waited for the client at every sweep since then
    behind_from: int = 0  # `accepted` then


class StallWatch(Part):
    def __init__(self, timeout_s: float, min_rate: float) -> None:
        self._set(timeout_s, min_rate)
        self._streams: set[Watched] = set()
        self._timer: asyncio.TimerHandle | None = None

    def _set(self, timeout_s: float, min_rate: float) -> None:
        self.timeout_s, self.min_rate = timeout_s, min_rate
        self.period_s = min(1.0, timeout_s / 4)

    def check(self, old: GatewayConfig, new: GatewayConfig) -> None:
        """Any timeout and rate apply live."""

    def configure(self, cfg: GatewayConfig) -> None:
        """From the next sweep on."""
        self._set(cfg.client_write_timeout_s, cfg.client_min_rate)

    def watch(self, transport: Any, ticket: Any) -> Watched:
        w = Watched(transport, ticket, progress_at=time.monotonic())
        self._streams.add(w)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.period_s, self._sweep)
        return w

    def unwatch(self, w: Watched) -> None:
        self._streams.discard(w)

    def _sweep(self) -> None:
        self._timer = None
        now = time.monotonic()
        for w in list(self._streams):
            why = self._check(w, now)
            if why:
                self.cut(w, why)
        if self._streams:
            self._timer = asyncio.get_running_loop().call_later(self.period_s, self._sweep)

    def _check(self, w: Watched, now: float) -> str:
        t = w.transport
        if t.is_closing():
            return ""
        waiting = t.get_write_buffer_size() + unsent(t.get_extra_info("socket"))
        accepted = w.written - waiting
        if accepted > w.accepted:
            w.accepted, w.progress_at = accepted, now
        if waiting <= 0:
            w.progress_at, w.behind_since = now, None
            return ""
        if now - w.progress_at >= self.timeout_s:
            return f"its client accepted nothing for {self.timeout_s:g} s"
        if w.behind_since is None:
            w.behind_since, w.behind_from = now, w.accepted
        elif now - w.behind_since >= self.timeout_s:
            rate = (w.accepted - w.behind_from) / (now - w.behind_since)
            if rate < self.min_rate:
                return f"its client read {rate:.0f} bytes/s, below client_min_rate ({self.min_rate:g})"
            w.behind_since, w.behind_from = now, w.accepted
        return ""

    def cut(self, w: Watched, why: str) -> None:
        """Close the client's connection now: its stream ends (`Proxy.handle` books it as `client_stalled`)."""
        self._streams.discard(w)
        w.ticket.stalled = why
        log.warning("request %s (tenant %s) cut: %s", w.ticket.request_id, w.ticket.tenant, why)
        # NOTE: abort, not close: close waits for the unread data to go out, which is what never happens
        with contextlib.suppress(Exception):
            w.transport.abort()

    async def stop(self) -> None:
        """No more sweeps (the streams have ended)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
