"""Clients that leave, all at once: nothing goes upstream for a client that has gone, an open upstream request is
closed within 0.5 s, and what is charged after the close is at most one chunk per stream, round after round.

`scripts/py312_tests.sh` runs this file under Python 3.12 too (dev.sh test): the gateway must not depend on how a
Python version delivers cancellations (3.11's `asyncio.wait_for` can swallow one)."""

from __future__ import annotations

import time

import pytest
from support.gateway import FakeBackend, config, stream_request, wait_until

from fairserve.api.server import running_server
from fairserve.api.tokens import MESSAGE_TOKENS, estimate_tokens
from fairserve.gateway import create_app

pytestmark = pytest.mark.integration

ROUNDS, STREAMS, SLOTS = 20, 100, 32
PROMPT = estimate_tokens("hello there, gateway") + MESSAGE_TOKENS  # chat_body: one message, its role markers
CHUNK = 2.0  # the cost of one streamed token (w_q): what one chunk of the fake backend is charged


def test_a_mass_disconnect_charges_at_most_one_chunk_per_stream_and_sends_nothing_upstream():
    fake = FakeBackend(delay_s=0.01)
    with running_server(fake.app) as url:
        app = create_app(config([{"url": url, "max_inflight_requests": SLOTS}], queue_limit=STREAMS))
        gw = app.state.gateway
        alice = gw.sched.ledger.accounts["alice"]
        with running_server(app) as base:
            for _ in range(ROUNDS):
                fake.reset(delay_s=0.01)
                start = alice.service
                socks = [stream_request(base, "alice", 400) for _ in range(STREAMS)]
                # SLOTS streaming (each past its first token), the rest queued
                assert wait_until(
                    lambda: (
                        len(fake.produced) == SLOTS
                        and min(fake.produced.values()) >= 1
                        and gw.sched.ledger.num_queued == STREAMS - SLOTS
                    ),
                    20,
                )
                fake.paused = True  # nothing more is produced: what is charged now is what was sent before the close
                sent = start + SLOTS * PROMPT
                assert wait_until(lambda: alice.service == sent + CHUNK * sum(fake.produced.values()))  # noqa: B023
                before, calls = alice.service, fake.calls
                closed = time.monotonic()
                # NOTE: the queued first: a slot freed by a running stream may go to a queued request whose client
                # has not closed yet (and rightly goes upstream); this way every client has gone by then
                for s in reversed(socks):
                    s.close()
                # NOTE: each stream's next token comes at once, the one after 0.2 s later: a stream that goes on after
                # its client left is charged for them
                fake.delay_s, fake.paused = 0.2, False
                ended = wait_until(lambda: len(gw.sched.ledger) == 0 and len(fake.cancelled_at) == SLOTS, 10)
                assert ended, f"{len(gw.sched.ledger)} requests still served 10 s after their clients left"
                assert fake.calls == calls, "a request went upstream after its client had left"
                late = max(fake.cancelled_at.values()) - closed
                assert late <= 0.5, f"an upstream request was still open {late:.2f} s after its client left"
                assert alice.service - before <= CHUNK * SLOTS, (alice.service - before, "charged after the close")
                assert gw.metrics.outcome_count("alice", "ok") == 0
