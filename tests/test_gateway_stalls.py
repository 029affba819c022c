"""A tenant whose clients do not read (or read a trickle) must not hold the backend's slots: the stall watch cuts
such streams after `client_write_timeout_s`, charged what was written, and the other tenant's requests run."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from support.gateway import FakeBackend, auth, chat_body, config, stream_request, wait_until

from fairserve.api.server import running_server
from fairserve.gateway import create_app
from fairserve.gateway.relay.stalls import StallWatch, Watched

pytestmark = pytest.mark.integration

SLOTS, HEAVY, LIGHT = 32, 50, 8
TIMEOUT_S = 1.0  # client_write_timeout_s in these tests (60 by default)
MIN_RATE = 16 * 1024  # client_min_rate here: bytes/s; the trickle reader below reads ~5 KiB/s


def light_request(base: str) -> float:
    """One short stream of bob's, read to its end; returns when it ended (time.monotonic)."""
    with httpx.Client(timeout=30) as c:
        r = c.post(base + "/v1/chat/completions", json=chat_body(5, stream=True), headers=auth("bob"))
        assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text[-300:]
    return time.monotonic()


def trickle(socks: list[socket.socket], stop: threading.Event) -> None:
    """Read 1 KiB from each connection every 0.2 s: never idle for a whole timeout, far below MIN_RATE."""
    for s in socks:
        s.setblocking(False)
    while not stop.wait(0.2):
        for s in socks:
            with contextlib.suppress(OSError):
                s.recv(1024)


@pytest.mark.parametrize("reader", ["none", "trickle"])
def test_a_tenant_that_does_not_read_cannot_hold_the_backend(reader):
    # 400 tokens of 1 kB, 40 ms apart: 16 s per stream, far more than a small receive buffer holds
    fake = FakeBackend(delay_s=0.04, piece="x" * 1000)
    with running_server(fake.app) as url:
        cfg = config(
            [{"url": url, "max_inflight_requests": SLOTS}],
            queue_limit=HEAVY,
            client_write_timeout_s=TIMEOUT_S,
            client_min_rate=MIN_RATE,
        )
        app = create_app(cfg)
        gw = app.state.gateway
        stop = threading.Event()
        with running_server(app) as base:
            socks = [stream_request(base, "alice", 400, rcvbuf=4096) for _ in range(HEAVY)]
            try:
                assert wait_until(lambda: gw.sched.ledger.num_queued == HEAVY - SLOTS, 10)
                if reader == "trickle":
                    threading.Thread(target=trickle, args=(socks, stop), daemon=True).start()
                start = time.monotonic()
                with ThreadPoolExecutor(LIGHT) as pool:
                    ended = list(pool.map(lambda _: light_request(base), range(LIGHT), timeout=TIMEOUT_S + 30))
                took = max(ended) - start
                assert took <= TIMEOUT_S + 10, f"bob's {LIGHT} requests took {took:.1f} s"
                assert gw.metrics.outcome_count("bob", "ok") == LIGHT
                cut = gw.metrics.outcome_count("alice", "client_stalled")
                assert cut >= LIGHT, cut  # alice's streams were cut (and counted so) to make room
                assert gw.sched.ledger.accounts["alice"].service > 0  # charged what was written for them
            finally:
                stop.set()
                for s in socks:
                    s.close()
            assert wait_until(lambda: len(gw.sched.ledger) == 0, 10)
            assert all(b.requests == 0 for b in gw.sched.backends)  # every slot given back


def test_with_the_defaults_unread_streams_free_their_slots_at_generation_speed():
    """The gateway reads a backend as fast as it generates, into the stream's buffer (gateway/relay/pipe.py): streams
    that read nothing hold the backend's slots only while they generate (2 s each here), not until the write
    timeout (60 s by default) cuts them, so the other tenant is served within seconds and no stream is cut."""
    slots, heavy, light = 8, 12, 4
    # NOTE: 400 tokens of 10 kB, 5 ms apart: 2 s and 4 MB per stream, more than the kernel's and uvicorn's buffers
    # take for a client that reads nothing (without the gateway's buffer, these hold their slots until cut)
    fake = FakeBackend(delay_s=0.005, piece="x" * 10_000)
    with running_server(fake.app) as url:
        app = create_app(config([{"url": url, "max_inflight_requests": slots}], queue_limit=heavy))
        gw = app.state.gateway
        assert gw.cfg.client_write_timeout_s == 60 and gw.cfg.client_buffer_bytes == 4 << 20  # the defaults
        with running_server(app) as base:
            socks = [stream_request(base, "alice", 400, rcvbuf=4096) for _ in range(heavy)]
            try:
                assert wait_until(lambda: gw.sched.ledger.num_queued == heavy - slots, 10)
                start = time.monotonic()
                with ThreadPoolExecutor(light) as pool:
                    ended = list(pool.map(lambda _: light_request(base), range(light), timeout=90))
                took = max(ended) - start
                # NOTE: a line the configuration gives, not the machine's speed: without the buffers the slots free
                # only when the write timeout cuts the heavy streams (2.2 s measured with them, idle)
                assert took < gw.cfg.client_write_timeout_s, f"bob's {light} requests took {took:.1f} s"
                # NOTE: the heavy streams are open and unread: their slots were freed, not their streams cut
                assert gw.metrics.outcome_count("alice", "client_stalled") == 0
                assert wait_until(lambda: all(b.requests == 0 for b in gw.sched.backends), 20)
                assert gw.sched.ledger.accounts["alice"].running > 0 and gw.proxy.buffers.used > 0
            finally:
                for s in socks:
                    s.close()
            assert wait_until(lambda: len(gw.sched.ledger) == 0 and gw.proxy.buffers.used == 0, 10)


class FakeTransport:
    """What the stall watch reads of a connection: the transport's buffer (the kernel's queue reads 0 here)."""

    def __init__(self) -> None:
        self.buffered, self.aborted = 0, False

    def is_closing(self) -> bool:
        return self.aborted

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def get_extra_info(self, name: str) -> None:
        return None

    def abort(self) -> None:
        self.aborted = True


class FakeTicket:
    request_id, tenant, stalled = "r1", "alice", ""


@pytest.mark.parametrize(
    "per_sweep, cut",
    [(0, "accepted nothing"), (1000, "below client_min_rate"), (5000, "")],  # bytes accepted per 0.25 s
)
def test_the_stall_rules(per_sweep, cut):
    watch = StallWatch(timeout_s=1.0, min_rate=16 * 1024)
    w = Watched(FakeTransport(), FakeTicket(), progress_at=0.0)
    w.written = w.transport.buffered = 10**6  # everything written waits for the client
    why = ""
    for step in range(1, 20):  # 4.75 s of sweeps, 0.25 s apart
        w.transport.buffered -= per_sweep
        why = why or watch._check(w, step * 0.25)
    assert (cut in why) if cut else why == "", why
    w2 = Watched(FakeTransport(), FakeTicket(), progress_at=0.0, written=100)  # a client that keeps up
    assert all(watch._check(w2, step * 0.25) == "" for step in range(1, 20))
