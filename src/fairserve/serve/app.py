"""`fairserve serve`: an OpenAI-compatible server whose engine (transformers continuous batching) schedules by a
fairserve policy. Tenants come from API keys exactly as in the gateway; admission order, counters and charges live
inside the engine (`engines.hf_scheduler.FairScheduler`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..api.body import DISCONNECTED, ClientGone, read_body
from ..api.errors import error_body, error_response
from ..api.handlers import install as install_error_handlers
from ..api.handlers import unknown_model
from ..api.protocol import DONE, BadRequest, Call, Reply, models_list, parse_call, parse_json, sse
from ..api.streaming import EventStream
from ..core import DEFAULT_TENANT, make_policy
from ..engines.hf_engine import EngineError, EngineSizing, EngineStopped, HFEngine
from ..tenancy import (
    TenantCollector,
    admin_router,
    bearer,
    metrics_denied,
    model_refused,
    priority_message,
    refused_priority,
)
from .config import ServeConfig

log = logging.getLogger("fairserve.serve")
POLL_S = 0.1  # how often a non-streaming request checks that its client is still there


def build_engine(cfg: ServeConfig) -> HFEngine:
    from ..engines.hf_models import load_model

    model, tokenizer = load_model(cfg.model, seed=cfg.seed)
    policy = None if cfg.policy == "fifo" else make_policy(cfg.policy, w_p=cfg.w_p, w_q=cfg.w_q)
    sizing = EngineSizing(
        num_blocks=cfg.num_blocks,
        page_size=cfg.page_size,
        max_batch_tokens=cfg.max_batch_tokens,
        max_requests_per_batch=cfg.max_requests_per_batch,
    )
    return HFEngine(
        model,
        tokenizer,
        policy,
        sizing,
        tenants=tuple(tenant_names(cfg)),
        weights=cfg.weights(),
        priorities=cfg.priorities(),
        allowed=cfg.allowed(),
    )


def tenant_names(cfg: ServeConfig) -> list[str]:
    return [t.name for t in cfg.tenants] or [DEFAULT_TENANT]


class Detokenizer:
    """Text deltas of a growing token list, decoding only a short window (not the whole list each step); holds back
    an incomplete UTF-8 character until the next token completes it."""

    def __init__(self, tokenizer) -> None:  # noqa: ANN001
        self.tokenizer = tokenizer
        self.prefix = self.read = 0  # tokens[prefix:read] were already turned into text

    def delta(self, tokens: list[int], final: bool) -> str:
        decode = self.tokenizer.decode
        done = decode(tokens[self.prefix : self.read], skip_special_tokens=True)
        text = decode(tokens[self.prefix :], skip_special_tokens=True)
        if len(text) <= len(done) or (text.endswith("\ufffd") and not final):
            return ""
        self.prefix, self.read = self.read, len(tokens)
        return text[len(done) :]


def create_app(cfg: ServeConfig, engine: HFEngine | None = None) -> FastAPI:
    engine = engine if engine is not None else build_engine(cfg)
    tokenizer = engine.tokenizer
    owners = cfg.key_owners()
    allowed_models = cfg.allowed_models()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(engine.start)
        try:
            yield
        finally:
            await asyncio.to_thread(engine.stop)  # NOTE: the generation thread would keep the process alive

    app = FastAPI(title="fairserve serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine = engine
    registry = CollectorRegistry()
    if engine.queue is not None:
        tenants = tenant_names(cfg)
        registry.register(TenantCollector(engine.queue, tenants, "fairserve_serve_"))
        app.include_router(admin_router(engine.queue, tenants, cfg.admin_key, owners))

    def tenant_of(request: Request) -> str | None:
        return DEFAULT_TENANT if cfg.open else owners.get(bearer(request) or "")

    def encode(call: Call) -> list[int]:
        if call.chat:
            try:
                text = tokenizer.apply_chat_template(list(call.messages), add_generation_prompt=True, tokenize=False)
            except Exception as e:  # NOTE: a model's template raises its own errors (e.g. roles must alternate)
                raise BadRequest(f"The model's chat template rejected these messages: {e}", "messages") from None
            return list(tokenizer(text, add_special_tokens=False).input_ids)
        return list(tokenizer(call.prompt).input_ids)

    async def serve(request: Request, chat: bool) -> Response:
        tenant = tenant_of(request)
        if tenant is None:
            return error_response(
                401, "missing or unknown API key: send 'Authorization: Bearer KEY'", code="invalid_api_key"
            )
        try:
            raw = await read_body(request.scope, request.receive, cfg.max_body_bytes, cfg.client_timeout_s)
        except ClientGone:
            return Response(status_code=DISCONNECTED)
        if isinstance(raw, Response):  # 408 (a stalled upload) or 413
            return raw
        call = parse_call(parse_json(raw), chat, cfg.default_max_tokens)
        if (missing := unknown_model(call.model, [cfg.model_name])) is not None:
            return missing
        if (refused := model_refused(allowed_models, tenant, cfg.model_name)) is not None:
            return error_response(403, refused, code="model_not_allowed", param="model")
        if engine.queue is not None:
            with engine.queue.lock:
                allowed = refused_priority(engine.queue.ledger, tenant, call.priority)
            if allowed is not None:
                assert call.priority is not None
                return error_response(
                    400, priority_message(tenant, call.priority, allowed), code="invalid_priority", param="priority"
                )
        input_ids = encode(call)
        if not input_ids:
            raise BadRequest("The prompt is empty.", "messages" if chat else "prompt")
        need, pool = len(input_ids) + call.max_tokens, engine.sizing.kv_tokens
        if need > pool:
            raise BadRequest(
                f"This request needs {need} tokens of KV cache ({len(input_ids)} in the prompt + "
                f"{call.max_tokens} max_tokens), but the engine's pool holds {pool}.",
                "max_tokens",
            )
        if (why := engine.failure()) is not None:
            return error_response(503, f"the engine is not serving: {why}", code="engine_unavailable")
        reply = Reply(chat=chat, model=cfg.model_name, prompt_tokens=len(input_ids), include_usage=call.include_usage)
        outputs = engine.generate(
            tenant, input_ids, call.max_tokens, call.ignore_eos, stream=call.stream, priority=call.priority
        )
        if call.stream:
            return EventStream(events(outputs, reply, call))
        return await complete(request, outputs, reply, call)

    async def events(outputs: AsyncIterator, reply: Reply, call: Call) -> AsyncIterator[bytes]:
        detok, produced = Detokenizer(tokenizer), 0
        try:
            if reply.chat:
                yield sse(reply.role_chunk())
            async for out in outputs:
                produced, last = len(out.generated_tokens), out.is_finished()
                text = detok.delta(out.generated_tokens, last)
                if text or last:
                    reason = finish_reason(out.generated_tokens, call, engine.eos_token_id)
                    yield sse(reply.token_chunk(last, text, reason))
            if call.include_usage:
                yield sse(reply.usage_chunk(produced))
            yield DONE
        except EngineError as e:
            log.error("request %s failed: %s", reply.id, e)
            yield sse(error_body(500, str(e), code="engine_error"))
        finally:
            await outputs.aclose()  # type: ignore[attr-defined]

    async def complete(request: Request, outputs: AsyncIterator, reply: Reply, call: Call) -> Response:
        async def collect() -> list[int]:
            tokens: list[int] = []
            async for out in outputs:
                tokens = out.generated_tokens
            return tokens

        task = asyncio.ensure_future(collect())
        try:
            while not (await asyncio.wait({task}, timeout=POLL_S))[0]:
                if await request.is_disconnected():
                    task.cancel()  # NOTE: cancels the request in the engine (the generator's finally)
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                    return Response(status_code=499)  # nobody reads it
            tokens = task.result()
        except asyncio.CancelledError:
            # NOTE: not the client: the server's drain ran out (SIGTERM + drain_timeout_s)
            if (me := asyncio.current_task()) is not None:
                me.uncancel()
            return error_response(503, "the server is shutting down", code="shutdown", headers={"Retry-After": "1"})
        except EngineStopped as e:
            return error_response(503, f"the engine is not serving: {e}", code="engine_unavailable")
        except EngineError as e:
            log.error("request %s failed: %s", reply.id, e)
            return error_response(500, str(e), code="engine_error")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # NOTE: the generator must stop before aclose
            await outputs.aclose()  # type: ignore[attr-defined]
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        return JSONResponse(reply.body(len(tokens), text, finish_reason(tokens, call, engine.eos_token_id)))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await serve(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await serve(request, chat=True)

    @app.get("/v1/models")
    async def models() -> dict:
        return models_list(cfg.model_name)

    @app.get("/healthz")
    @app.get("/health")
    async def healthz() -> Response:
        why = engine.failure()
        body = {
            "status": "ok" if why is None else "failed",
            "engine": cfg.engine,
            "model": cfg.model_name,
            "policy": cfg.policy,
            "kv_tokens": engine.sizing.kv_tokens,
            "error": why,
        }
        return JSONResponse(body, status_code=200 if why is None else 503)

    # NOTE: a stopped generation loop never restarts itself, so here liveness and readiness agree (minus the detail)
    @app.get("/livez")
    async def livez() -> Response:
        why = engine.failure()
        return JSONResponse({"status": "ok" if why is None else "failed"}, status_code=200 if why is None else 503)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        if (denied := metrics_denied(request, cfg.metrics_key)) is not None:
            return denied
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    install_error_handlers(app, "fairserve serve")
    return app


def finish_reason(tokens: list[int], call: Call, eos: int | None = None) -> str:
    """ "stop" when the model ended (its last token is EOS) or stopped early, "length" when max_tokens cut it."""
    if eos is not None and not call.ignore_eos and tokens and tokens[-1] == eos:
        return "stop"
    return "length" if len(tokens) >= call.max_tokens else "stop"
