"""A request's footprint (gateway/admission/footprint.py) is what it holds on its quota: at least what the backend then
reports for every shape of request, and a tenant firing many such requests at once ends at most one footprint
past its quota.

The backend here accounts as vLLM does: it generates up to the `max_tokens` it receives (to its own limit when it
receives none) for every prompt of a list times `n`, and counts the prompt its chat template renders: role markers,
messages, tool calls, and the `tools` and `response_format` as JSON. It generates each output to its bound (as with
`ignore_eos`): the worst case for a quota."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi import FastAPI, Request
from support.gateway import ADMIN, HTTP, KEYS, auth, config, wait_until

from fairserve.api.server import running_server
from fairserve.api.tokens import IMAGE_TOKENS, estimate_tokens
from fairserve.gateway import create_app

pytestmark = pytest.mark.integration

OWN_LIMIT = 4000  # what the backend generates when a request sets no bound
DEFAULT = 64  # the gateway's default_max_tokens here
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": "Looks something up in a large catalogue of things, by name or by number. " * 3,
            "parameters": {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}}},
        },
    }
    for i in range(20)
]


class Engine:
    """An OpenAI backend that accounts like vLLM (see the module's docstring); it answers only when `release` is
    set, so that a test sees the quota's holds of the requests in flight."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.bodies: list[dict[str, Any]] = []
        self.app = FastAPI()
        for path, answer in (
            ("/v1/chat/completions", self.chat),
            ("/v1/completions", self.completions),
            ("/v1/embeddings", self.embeddings),
            ("/v1/responses", self.responses),
        ):
            self.app.post(path)(self._endpoint(answer))
        self.app.get("/v1/models")(lambda: {"object": "list", "data": [{"id": "m", "object": "model"}]})

    def _endpoint(self, answer):
        async def endpoint(request: Request) -> dict[str, Any]:
            body = json.loads(await request.body())
            self.bodies.append(body)
            while not self.release.is_set():
                await asyncio.sleep(0.005)
            return answer(body)

        return endpoint

    @staticmethod
    def _prompt(items: list[dict[str, Any]], *rendered: Any) -> int:
        text, images = "", 0
        for m in items:
            content = m.get("content")
            parts = content if isinstance(content, list) else [{"text": content or ""}]
            images += sum(1 for p in parts if p.get("type") in ("image_url", "input_image"))
            body = "".join(p.get("text", "") for p in parts) + json.dumps(m.get("tool_calls") or "")
            text += f"<|{m.get('role', 'user')}|>\n{body}\n"
        text += "".join(json.dumps(r) for r in rendered if r)
        return estimate_tokens(text) + IMAGE_TOKENS * images

    @staticmethod
    def _usage(prompt: int, output: int) -> dict[str, int]:
        return {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output}

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = self._prompt(body["messages"], body.get("tools"), body.get("response_format"))
        each, n = body.get("max_tokens") or OWN_LIMIT, body.get("n") or 1
        choices = [{"index": i, "message": {"role": "assistant", "content": " tok" * each}} for i in range(n)]
        return {"object": "chat.completion", "choices": choices, "usage": self._usage(prompt, each * n)}

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        each, n = body.get("max_tokens") or OWN_LIMIT, body.get("n") or 1
        prompt = sum(estimate_tokens(p) for p in prompts)
        choices = [{"index": i, "text": " tok" * each} for i in range(len(prompts) * n)]
        return {"object": "text_completion", "choices": choices, "usage": self._usage(prompt, each * len(choices))}

    def embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [{"object": "embedding", "index": i, "embedding": [0.0]} for i in range(len(inputs))]
        return {"object": "list", "data": data, "usage": self._usage(sum(map(estimate_tokens, inputs)), 0)}

    def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        items = body["input"] if isinstance(body["input"], list) else [{"content": body["input"]}]
        prompt = self._prompt(items, body.get("tools")) + estimate_tokens(body.get("instructions") or "")
        out = body.get("max_output_tokens") or OWN_LIMIT
        part = {"type": "output_text", "text": " tok" * out}
        return {
            "object": "response",
            "status": "completed",
            "output": [{"type": "message", "role": "assistant", "content": [part]}],
            "usage": {"input_tokens": prompt, "output_tokens": out, "total_tokens": prompt + out},
        }


FUNCTION = TOOLS[1]["function"]
QUESTION = [{"role": "user", "content": "What is in the catalogue under the letter q, and how many are there?"}]
SHAPES = {
    "chat with tools": ("/v1/chat/completions", {"messages": QUESTION, "tools": TOOLS, "max_tokens": 20}),
    "chat with response_format": (
        "/v1/chat/completions",
        {
            "messages": QUESTION,
            "max_tokens": 20,
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": TOOLS[0]}},
        },
    ),
    "chat with n": ("/v1/chat/completions", {"messages": QUESTION, "n": 3, "max_tokens": 20}),
    "chat without max_tokens": ("/v1/chat/completions", {"messages": QUESTION}),
    "chat with a tool result and an image": (
        "/v1/chat/completions",
        {
            "max_tokens": 5,
            "messages": [
                *QUESTION,
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "1", "type": "function", "function": TOOLS[1]["function"]}],
                },
                {"role": "tool", "tool_call_id": "1", "content": "q: quinces, quartz, quills " * 20},
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
            ],
        },
    ),
    "completions with a prompt list": ("/v1/completions", {"prompt": ["one prompt", "two", "three"], "max_tokens": 30}),
    "completions with a prompt list and n, no max_tokens": ("/v1/completions", {"prompt": ["a", "bb"], "n": 2}),
    "embeddings with an input list": ("/v1/embeddings", {"input": ["first text to embed", "second", "third"] * 5}),
    "responses with input items": (
        "/v1/responses",
        {
            "instructions": "Answer briefly.",
            "input": [*QUESTION, {"role": "user", "content": [{"type": "input_text", "text": "and r?"}]}],
            "tools": TOOLS[:3],
        },
    ),
}


def gateway_config(url: str, quota: int) -> Any:
    tenants = [{"name": "alice", "api_keys": [KEYS["alice"]], "quota": {"tokens": quota, "per": "day"}}]
    return config([{"url": url, "max_requests": 64}], default_max_tokens=DEFAULT, tenants=tenants)


def quota_of(base: str) -> dict[str, float]:
    doc = HTTP.get(base + "/admin/quotas", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    return doc["quotas"]["alice"]["tokens"]


def total_of(doc: dict[str, Any]) -> int:
    return doc["usage"]["total_tokens"]


@pytest.mark.parametrize("shape", SHAPES)
def test_what_a_request_holds_is_at_least_what_the_backend_reports(shape):
    path, body = SHAPES[shape]
    engine = Engine()
    with running_server(engine.app) as url, running_server(create_app(gateway_config(url, 10**9))) as gw:
        with ThreadPoolExecutor(1) as pool:
            sent = pool.submit(HTTP.post, gw + path, json={"model": "m", **body}, headers=auth("alice"))
            assert wait_until(lambda: quota_of(gw)["held"] > 0)
            held = quota_of(gw)["held"]
            engine.release.set()
            r = sent.result()
    assert r.status_code == 200, r.text
    assert total_of(r.json()) <= held, f"{shape}: held {held}, the backend reported {r.json()['usage']}"
    # NOTE: the bound the gateway assumed is the one the backend received
    bound = {"/v1/responses": "max_output_tokens", "/v1/embeddings": None}.get(path, "max_tokens")
    if bound is not None:
        assert engine.bodies[0][bound] == body.get(bound, DEFAULT)


@pytest.mark.parametrize(
    "shape, limit",
    [("completions with a prompt list", 600), ("chat without max_tokens", 600), ("chat with tools", 6000)],
)
def test_a_tenant_firing_at_once_ends_at_most_one_footprint_past_its_quota(shape, limit):
    """20 requests at once against a quota that fits a few: the quota is overshot by at most the footprint of the
    one let through last (gateway/quota/book.py), not by a multiple of the limit."""
    path, body = SHAPES[shape]
    engine = Engine()
    with running_server(engine.app) as url, running_server(create_app(gateway_config(url, limit))) as gw:
        with ThreadPoolExecutor(20) as pool:
            sent = [
                pool.submit(HTTP.post, gw + path, json={"model": "m", **body}, headers=auth("alice")) for _ in range(20)
            ]
            # NOTE: every request either reached the backend (holding its footprint) or was refused
            assert wait_until(lambda: len(engine.bodies) + sum(f.done() for f in sent) == len(sent))
            engine.release.set()
            answers = [f.result() for f in sent]
        served = [r.json() for r in answers if r.status_code == 200]
        assert {r.status_code for r in answers} <= {200, 429} and served
        used = sum(map(total_of, served))
        largest = max(map(total_of, served))
        assert quota_of(gw)["used"] == used
    assert used < limit + largest, f"{shape}: {used} tokens served against a quota of {limit} ({used / limit:.1f}x)"
