"""Model fallbacks: `fallbacks = { "big" = ["small"] }` serves a request for `big` as `small`'s while every backend
of `big`'s pool is down, through the official `openai` client; with the pool up again, `big` is served by its own.
A request queued for `big` moves to `small` past `fallback_after_s`, or when `big`'s pool goes down; without either
it waits for `big` (the negative control)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import time

import httpx
import openai
import pytest
from fastapi.responses import JSONResponse
from support.gateway import KEYS, FakeBackend, config

from fairserve.api.server import running_server
from fairserve.gateway.http.app import create_app

pytestmark = pytest.mark.integration


def healthy(base: str) -> dict[str, bool]:
    """Each backend's health as the gateway's /healthz reports it, by the models it serves."""
    rows = httpx.get(base + "/healthz", timeout=5).json()["backends"]
    return {row["models"][0]: row["healthy"] for row in rows}


def wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true"
        time.sleep(0.05)


def with_health(fake: FakeBackend) -> FakeBackend:
    """`fake` answering the gateway's health checks (`/health`): 200, or its `fail_status` while it has one."""

    async def health():
        return JSONResponse({}, status_code=fake.fail_status or 200)

    fake.app.get("/health")(health)
    return fake


def test_a_model_whose_backends_are_down_is_served_by_its_fallback():
    big, small = with_health(FakeBackend()), with_health(FakeBackend())
    with contextlib.ExitStack() as stack:
        big_url, small_url = (stack.enter_context(running_server(f.app)) for f in (big, small))
        backends = [{"url": big_url, "models": ["big"]}, {"url": small_url, "models": ["small"]}]
        cfg = config(backends, fallbacks={"big": ["small"]}, health_interval_s=0.1)
        base = stack.enter_context(running_server(create_app(cfg)))
        client = openai.OpenAI(base_url=base + "/v1", api_key=KEYS["alice"], max_retries=0)
        wait_for(lambda: healthy(base) == {"big": True, "small": True})
        client.completions.create(model="big", prompt="hello", max_tokens=2)
        assert [b["model"] for b in big.bodies] == ["big"] and not small.bodies  # up: its own backend
        big.fail_status = 503  # its health checks fail from now on
        wait_for(lambda: healthy(base)["big"] is False)
        done = client.completions.create(model="big", prompt="hello", max_tokens=2)
        assert done.usage is not None and done.usage.completion_tokens == 2
        assert [b["model"] for b in small.bodies] == ["small"]  # the fallback, named as its own model
        big.fail_status = None
        wait_for(lambda: healthy(base)["big"] is True)
        client.completions.create(model="big", prompt="hello", max_tokens=2)
        assert [b["model"] for b in big.bodies] == ["big", "big"] and len(small.bodies) == 1


def stream(client: openai.OpenAI) -> int:
    """A streamed request for `big` (a paused fake holds it); the tokens it got."""
    chunks = client.completions.create(model="big", prompt="x", max_tokens=2, stream=True)
    return sum(1 for c in chunks if c.choices and c.choices[0].text)


def queued_big_then_move(fallback_after_s: float, tmp_path, down: bool = False) -> tuple[FakeBackend, list, list]:
    """`big`'s one slot held by a paused request, a second request for `big` queued behind it; past
    `fallback_after_s`, or when `big`'s pool goes down (`down`), it may move to `small`. Returns `small`, the models
    the usage log names for the served requests, and when the second one was answered (s after it was sent)."""
    big, small = with_health(FakeBackend()), with_health(FakeBackend())
    log = tmp_path / "usage.jsonl"
    with contextlib.ExitStack() as stack:
        big_url, small_url = (stack.enter_context(running_server(f.app)) for f in (big, small))
        backends = [{"url": big_url, "models": ["big"], "max_requests": 1}, {"url": small_url, "models": ["small"]}]
        cfg = config(
            backends,
            fallbacks={"big": ["small"]},
            fallback_after_s=fallback_after_s,
            health_interval_s=0.1,
            usage_log=str(log),
        )
        base = stack.enter_context(running_server(create_app(cfg)))
        client = openai.OpenAI(base_url=base + "/v1", api_key=KEYS["alice"], max_retries=0, timeout=20)
        wait_for(lambda: healthy(base) == {"big": True, "small": True})
        big.paused = True  # the first request holds big's one slot
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            first = pool.submit(stream, client)
            wait_for(lambda: big.calls == 1)
            sent = time.monotonic()
            second = pool.submit(client.completions.create, model="big", prompt="hello", max_tokens=2)
            if down:
                wait_for(lambda: httpx.get(base + "/healthz", timeout=5).json()["queued"] == 1)
                big.fail_status = 503  # its health checks fail: the pool goes down with the second request queued
            assert second.result().usage.completion_tokens == 2
            took = time.monotonic() - sent
            big.paused = False
            if not down:
                assert first.result() == 2
    served = [json.loads(line) for line in log.read_text().splitlines()]
    return small, [r["model"] for r in served if r["outcome"] == "ok"], [took]


def test_a_request_queued_past_fallback_after_s_moves_to_a_fallback_with_a_shorter_queue(tmp_path):
    small, models, (took,) = queued_big_then_move(0.3, tmp_path)
    assert [b["model"] for b in small.bodies] == ["small"]  # sent to small, naming small
    assert sorted(models) == ["big", "small"]  # the usage log names the model each was served as
    assert took >= 0.3  # it waited its fallback_after_s first (no upper bound: a loaded machine is slower)


def test_queued_requests_move_when_their_pool_goes_down(tmp_path):
    small, models, (took,) = queued_big_then_move(0, tmp_path, down=True)
    assert [b["model"] for b in small.bodies] == ["small"] and "small" in models
    # NOTE: served (not the 503 of fail_fast_s), by small, while big stayed down


def test_without_fallback_after_s_a_queued_request_waits_for_its_own_pool(tmp_path):
    """The negative control: with big up and no `fallback_after_s`, the queued request is big's."""
    big, small = with_health(FakeBackend()), with_health(FakeBackend())
    with contextlib.ExitStack() as stack:
        big_url, small_url = (stack.enter_context(running_server(f.app)) for f in (big, small))
        backends = [{"url": big_url, "models": ["big"], "max_requests": 1}, {"url": small_url, "models": ["small"]}]
        base = stack.enter_context(running_server(create_app(config(backends, fallbacks={"big": ["small"]}))))
        client = openai.OpenAI(base_url=base + "/v1", api_key=KEYS["alice"], max_retries=0, timeout=20)
        big.paused = True
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            first = pool.submit(stream, client)
            wait_for(lambda: big.calls == 1)
            second = pool.submit(client.completions.create, model="big", prompt="hello", max_tokens=2)
            wait_for(lambda: httpx.get(base + "/healthz", timeout=5).json()["queued"] == 1)
            assert not second.done() and not small.bodies  # queued behind the first, not moved
            big.paused = False
            assert first.result() == 2 and second.result().usage.completion_tokens == 2
        assert not small.bodies and big.calls == 2
