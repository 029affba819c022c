"""The gateway's HTTP app: OpenAI-compatible routes, identity, health, metrics, admin, and error bodies."""
from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..api.errors import error_response
from .admin import admin_router
from .body import CHAT, COMPLETIONS
from .config import GatewayConfig
from .metrics import GatewayMetrics
from .proxy import Proxy
from .scheduler import Scheduler

log = logging.getLogger("fairserve.gateway")


def bearer(request: Request) -> str | None:
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and key else None


class Gateway:
    """What one app instance holds: config, scheduler (policy + backends), metrics, the upstream client."""

    def __init__(self, cfg: GatewayConfig) -> None:
        self.cfg = cfg
        self.metrics = GatewayMetrics()
        self.sched = Scheduler(cfg, self.metrics)
        self.metrics.bind(self.sched)
        self.owners = cfg.key_owners()
        limit = sum(b.max_inflight_requests for b in cfg.backends) + 16
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(cfg.request_timeout_s, connect=5.0),
            limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit))
        self.proxy = Proxy(self.sched, self.client)

    def tenant(self, request: Request) -> str | None:
        """The tenant a request is from: its key's owner; with `trusted_proxy`, `X-Tenant-Id` (the key must still
        be a valid tenant or admin key). None: unauthenticated."""
        key = bearer(request)
        if key is None:
            return None
        owner = self.owners.get(key)
        claimed = request.headers.get("x-tenant-id")
        if self.cfg.trusted_proxy and claimed is not None:
            valid = owner is not None or key == self.cfg.admin_key
            return claimed if valid and claimed in self.sched.queued else None
        return owner

    async def models(self) -> Response:
        for b in self.sched.backends:
            if not b.healthy:
                continue
            headers = {"authorization": f"Bearer {b.cfg.api_key}"} if b.cfg.api_key else {}
            try:
                resp = await self.client.get(b.url + "/v1/models", headers=headers, timeout=5.0)
                if resp.status_code == 200 and isinstance(resp.json(), dict):
                    return Response(resp.content, media_type="application/json")
            except (httpx.HTTPError, ValueError):
                continue
        return JSONResponse({"object": "list", "data": [{"id": m, "object": "model", "owned_by": "fairserve"}
                                                        for m in self.cfg.models]})


def _unauthorized() -> Response:
    return error_response(401, "missing or unknown API key: send 'Authorization: Bearer KEY'", code="invalid_api_key")


def create_app(config: GatewayConfig) -> FastAPI:
    gw = Gateway(config)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await gw.client.aclose()

    app = FastAPI(title="fairserve gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gateway = gw

    async def completion(request: Request, kind: str) -> Response:
        tenant = gw.tenant(request)
        if tenant is None:
            return _unauthorized()
        return await gw.proxy.handle(request, kind, tenant)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await completion(request, CHAT)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await completion(request, COMPLETIONS)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        if gw.tenant(request) is None and bearer(request) != config.admin_key:
            return _unauthorized()
        return await gw.models()

    @app.get("/healthz")
    async def healthz() -> Response:
        backends = [{"url": b.url, "healthy": b.healthy, "in_flight_requests": b.requests,
                     "in_flight_tokens": b.tokens} for b in gw.sched.backends]
        return JSONResponse({"status": "ok", "policy": gw.sched.policy.name, "queued": gw.sched.policy.num_queued,
                             "backends": backends})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(gw.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    app.include_router(admin_router(gw.sched, bearer))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> Response:
        return error_response(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> Response:
        return error_response(400, "invalid request", code="invalid_request")

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> Response:
        log.error("unexpected error on %s %s: %r", request.method, request.url.path, exc)
        return error_response(500, "internal gateway error", code="internal_error")

    return app
