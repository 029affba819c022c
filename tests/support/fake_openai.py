"""A tiny fake OpenAI-compatible streaming server on loopback, for `fairserve bench`'s tests: it answers by API key
(see `Fake`) and records what each request carried."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from collections.abc import Iterator

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from fairserve.api.server import running_server
from fairserve.api.tokens import estimate_tokens
from fairserve.bench.cli import add_parser
from fairserve.workloads import Arrival

DELAY_S = 0.02  # per output chunk
DELAYS = {"fast": 0.0, "slow": 30.0}  # by API key
FIELDS = {"client", "arrival_s", "first_token_s", "finish_s", "prompt_tokens", "output_tokens", "status"}


class Fake:
    """Keys: "reject" → 429; "queued" → 503 queue_timeout; "cut" → the connection drops after 2 chunks; "short" →
    ends after 2 chunks without [DONE]; "nousage" → no usage chunk; "slow"/"fast" → other chunk delays. Usage
    reports prompt + 1000 so the tests can tell usage from the requested length."""

    def __init__(self) -> None:
        self.seen: list[dict] = []
        self.open = 0
        self.max_open = 0
        self.app = FastAPI()
        self.app.post("/v1/completions")(self.handle)
        self.app.post("/v1/chat/completions")(self.handle)
        self.app.get("/v1/models")(self.models)

    async def models(self, request: Request):
        if request.headers.get("authorization") == "Bearer badkey":
            return JSONResponse({"error": {"message": "bad key", "type": "invalid_request_error"}}, status_code=401)
        return {"object": "list", "data": [{"id": "m", "object": "model"}]}

    async def handle(self, request: Request):
        body = await request.json()
        key = request.headers.get("authorization", "").removeprefix("Bearer ")
        self.seen.append(
            {
                "t": time.monotonic(),
                "key": key,
                "path": request.url.path,
                "body": body,
                "client": request.headers.get("x-fairserve-client"),
            }
        )
        if key == "reject":
            return JSONResponse({"error": {"message": "slow down", "type": "rate_limit_error"}}, status_code=429)
        if key == "queued":  # the gateway's answer to a request that waited queue_ttl_s without a backend
            err = {"message": "the request waited 300 s in the queue", "type": "server_error", "code": "queue_timeout"}
            return JSONResponse({"error": err}, status_code=503)
        chat = "messages" in body
        prompt = body["messages"][0]["content"] if chat else body["prompt"]
        n, delay = body["max_tokens"], DELAYS.get(key, DELAY_S)

        def sse(obj: object) -> str:
            return f"data: {json.dumps(obj)}\n\n"

        async def stream():
            self.open += 1
            self.max_open = max(self.max_open, self.open)
            try:
                if chat:
                    yield sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
                for i in range(n):
                    if i == 2 and key in ("cut", "short"):
                        if key == "cut":
                            raise RuntimeError("connection cut on purpose")
                        return
                    await asyncio.sleep(delay)
                    last = "length" if i == n - 1 else None
                    piece = {"delta": {"content": " tok"}} if chat else {"text": " tok"}
                    yield sse({"choices": [{"index": 0, **piece, "finish_reason": last}]})
                if key != "nousage":
                    yield sse(
                        {
                            "choices": [],
                            "usage": {"prompt_tokens": estimate_tokens(prompt) + 1000, "completion_tokens": n},
                        }
                    )
                yield "data: [DONE]\n\n"
            finally:
                self.open -= 1

        return StreamingResponse(stream(), media_type="text/event-stream")


class _QuietCut(logging.Filter):
    """Drops uvicorn's traceback for the deliberately cut stream, nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and "connection cut on purpose" in str(record.exc_info[1]))


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[Fake, str]]:
    f = Fake()
    log, quiet = logging.getLogger("uvicorn.error"), _QuietCut()
    log.addFilter(quiet)
    try:
        with running_server(f.app) as url:
            yield f, url
    finally:
        log.removeFilter(quiet)


def arrivals(n: int, gap_s: float, client: str = "a", output: int = 4, prompt: int = 10) -> list[Arrival]:
    return [Arrival(i * gap_s, client, prompt, output) for i in range(n)]


def parse_bench(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fairserve")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["bench", *argv])
