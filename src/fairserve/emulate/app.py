"""The emulator's FastAPI app: completions and chat served by the real-time driver, /v1/models, /healthz, /metrics
(embeddings, responses and tokenize: `more_api`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from ..api.errors import error_response
from ..api.handlers import install as install_error_handlers
from ..api.protocol import DONE, BadRequest, Call, Reply, models_list, parse_call, parse_json, sse
from ..api.streaming import EventStream
from ..api.tokens import messages_text
from ..core import DEFAULT_TENANT, RequestState
from .config import EmulatorConfig, Fault
from .driver import CLIENT_HEADER, POLL_S, Emulator, Job, TooLarge, wait_tokens
from .more_api import install as install_more
from .more_api import not_served
from .prometheus import make_registry


def create_app(config: EmulatorConfig | None = None) -> FastAPI:
    config = config or EmulatorConfig()
    emulator = Emulator(config)
    registry = make_registry(emulator)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await emulator.start()
        try:
            yield
        finally:
            await emulator.stop()

    app = FastAPI(title="fairserve emulate", lifespan=lifespan)
    app.state.emulator = emulator
    install_error_handlers(app, "the emulator")
    install_more(app, emulator)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _serve(request, emulator, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _serve(request, emulator, chat=True)

    @app.get("/v1/models")
    async def models() -> dict:
        return models_list(*(config.models or (config.model,)), loras=config.loras)

    @app.get("/healthz")
    @app.get("/health")
    @app.get("/livez")
    async def healthz() -> dict:
        return {
            "status": "ok",
            "model": config.model,
            "running": len(emulator.engine.running),
            "waiting": emulator.engine.ledger.num_queued,
        }

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


async def _serve(request: Request, em: Emulator, chat: bool) -> Response:
    call = parse_call(parse_json(await request.body()), chat)
    if (missing := not_served(em, call.model)) is not None:
        return missing
    try:
        em.check_fits(call.prompt_tokens, call.max_tokens)
    except TooLarge as e:
        raise BadRequest(str(e), "max_tokens") from None
    fault = em.draw_fault()
    if fault is Fault.ERROR:
        em.count("error")
        return error_response(
            500, "The emulated server had an error processing your request (injected fault).", code="emulated_error"
        )
    if em.config.extra_latency_s:
        await asyncio.sleep(em.config.extra_latency_s)
    reply = Reply(
        chat=chat,
        model=call.model or em.config.model,
        prompt_tokens=call.prompt_tokens,
        include_usage=call.include_usage,
    )
    client = request.headers.get(CLIENT_HEADER) or DEFAULT_TENANT
    text = messages_text(list(call.messages)) if chat else call.prompt
    job = em.submit(reply.id, client, call.prompt_tokens, call.max_tokens, text)
    if job.req.state is RequestState.REJECTED:
        em.close(job, "rejected")
        return error_response(429, f"Rejected by the engine's policy {em.config.policy!r}.", code="rate_limited")
    if fault is Fault.HANG:
        try:
            while not await request.is_disconnected():
                await asyncio.sleep(POLL_S)
        finally:
            em.close(job, "hung")
        return Response(status_code=499)  # nobody reads it
    drop_after = call.max_tokens // 2 if fault is Fault.DROP else None
    if call.stream:
        return EventStream(_events(em, job, reply, call, drop_after))
    try:
        if not await wait_tokens(job, request, call.max_tokens if drop_after is None else drop_after):
            em.close(job, "cancelled")
            return Response(status_code=499)
        if drop_after is not None:
            em.close(job, "dropped")
            return DroppedResponse(bytes(JSONResponse(reply.body(job.delivered)).body))
        em.close(job, "finished")
        return JSONResponse(reply.body(job.delivered))
    finally:
        em.close(job, "cancelled")  # a no-op unless the handler itself was cancelled


async def _events(
    em: Emulator, job: Job, reply: Reply, call: Call, drop_after: int | None
) -> AsyncIterator[bytes | None]:
    """One SSE chunk per token as the driver delivers them; None asks EventStream to drop the connection."""
    try:
        if reply.chat:
            yield sse(reply.role_chunk())
        sent, limit = 0, call.max_tokens if drop_after is None else drop_after
        while sent < limit:
            job.changed.clear()
            while sent < min(job.delivered, limit):
                sent += 1
                yield sse(reply.token_chunk(last=sent == call.max_tokens))
            if sent >= limit or (job.engine_done and sent >= job.delivered):
                break
            await job.changed.wait()
        if drop_after is not None:
            em.close(job, "dropped")
            yield None
            return
        em.close(job, "finished")
        if call.include_usage:
            yield sse(reply.usage_chunk(sent))
        yield DONE
    finally:
        em.close(job, "cancelled")  # the client went away (a no-op after finished / dropped)


class DroppedResponse(Response):
    """A 200 whose Content-Length promises the whole JSON body, of which only the first half is sent before the
    connection is closed: the client sees an incomplete response (httpx: RemoteProtocolError)."""

    def __init__(self, body: bytes) -> None:
        super().__init__(body, media_type="application/json")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body[: len(self.body) // 2], "more_body": True})
