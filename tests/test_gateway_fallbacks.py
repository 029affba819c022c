"""Model fallbacks: `fallbacks = { "big" = ["small"] }` serves a request for `big` as `small`'s while every backend
of `big`'s pool is down, through the official `openai` client; with the pool up again, `big` is served by its own."""

from __future__ import annotations

import contextlib
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
