"""The emulator's /v1/embeddings, /v1/responses, /tokenize and /detokenize (the rest of what vLLM serves).

An embedding request runs in the engine as a prefill of all its inputs (it is answered when the prefill ends, at
its first token); a response generates `max_output_tokens` tokens (default 256) as completions do. The fault draw
applies to completions and chat only. /tokenize and /detokenize never reach the engine.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from ..api.embeddings import DEFAULT_DIMENSIONS, embeddings_body, parse_embeddings
from ..api.errors import error_response
from ..api.handlers import unknown_model
from ..api.protocol import BadRequest, parse_json
from ..api.responses import DEFAULT_MAX_OUTPUT_TOKENS, ResponseReply, parse_responses, sse_event
from ..api.streaming import EventStream
from ..api.tokenize import detokenize_ids, text_of, token_ids, tokenize_text
from ..core import DEFAULT_TENANT, RequestState
from .driver import CLIENT_HEADER, Emulator, Job, TooLarge, wait_tokens


def not_served(em: Emulator, model: Any) -> Response | None:
    """The 404 for a model the emulator was not told to serve (None: it serves it, or it serves any)."""
    if em.config.serves(model):
        return None
    return unknown_model(model, list(em.config.served))


def install(app: FastAPI, em: Emulator) -> None:
    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        call = parse_embeddings(parse_json(await request.body()), strict=True)
        if (missing := not_served(em, call.model)) is not None:
            return missing
        job = _submit(em, request, "embd-" + uuid.uuid4().hex, max(1, call.prompt_tokens), 1)
        if isinstance(job, Response):
            return job
        try:
            if not await wait_tokens(job, request, 1):
                return Response(status_code=499)
            em.close(job, "finished")
            model = call.model or em.config.model
            return JSONResponse(embeddings_body(model, call, call.dimensions or DEFAULT_DIMENSIONS))
        finally:
            em.close(job, "cancelled")  # a no-op after finished

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        call = parse_responses(parse_json(await request.body()), strict=True)
        if (missing := not_served(em, call.model)) is not None:
            return missing
        limit = call.max_output_tokens or DEFAULT_MAX_OUTPUT_TOKENS
        reply = ResponseReply(call.model or em.config.model, max(1, call.prompt_tokens), limit, call.instructions)
        job = _submit(em, request, reply.id, reply.prompt_tokens, limit)
        if isinstance(job, Response):
            return job
        if call.stream:
            return EventStream(_events(em, job, reply))
        try:
            if not await wait_tokens(job, request, limit):
                return Response(status_code=499)
            em.close(job, "finished")
            return JSONResponse(reply.response(job.delivered))
        finally:
            em.close(job, "cancelled")

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        body = parse_json(await request.body())
        if (missing := not_served(em, body.get("model") if isinstance(body, dict) else None)) is not None:
            return missing
        ids = token_ids(tokenize_text(body))
        return JSONResponse(
            {"count": len(ids), "max_model_len": em.config.kv_tokens, "tokens": ids, "token_strs": None}
        )

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        body = parse_json(await request.body())
        if (missing := not_served(em, body.get("model") if isinstance(body, dict) else None)) is not None:
            return missing
        return JSONResponse({"prompt": text_of(detokenize_ids(body))})


def _submit(em: Emulator, request: Request, id: str, prompt_tokens: int, max_tokens: int) -> Job | Response:
    """The request's job in the engine, or the error answer (400 too large, 429 rejected by the engine's policy)."""
    try:
        em.check_fits(prompt_tokens, max_tokens)
    except TooLarge as e:
        raise BadRequest(str(e), "max_output_tokens" if max_tokens > 1 else "input") from None
    client = request.headers.get(CLIENT_HEADER) or DEFAULT_TENANT
    job = em.submit(id, client, prompt_tokens, max_tokens)
    if job.req.state is RequestState.REJECTED:
        em.close(job, "rejected")
        return error_response(429, f"Rejected by the engine's policy {em.config.policy!r}.", code="rate_limited")
    return job


async def _events(em: Emulator, job: Job, reply: ResponseReply) -> AsyncIterator[bytes | None]:
    """The Responses event sequence, one delta per token as the driver delivers them."""
    try:
        for event in reply.head_events():
            yield sse_event(event)
        sent, limit = 0, reply.max_output_tokens
        while sent < limit:
            job.changed.clear()
            while sent < min(job.delivered, limit):
                sent += 1
                yield sse_event(reply.delta_event())
            if sent >= limit or (job.engine_done and sent >= job.delivered):
                break
            await job.changed.wait()
        em.close(job, "finished")
        for event in reply.tail_events(sent):
            yield sse_event(event)
    finally:
        em.close(job, "cancelled")
