"""The gateway's HTTP app: OpenAI-compatible routes, identity, health, metrics, admin, and error bodies."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from ...api.errors import error_response
from ...tenancy import AuthThrottle, admin_denied, admin_router, bearer, metrics_denied, same_key, scope_bearer
from ..instance import Gateway
from ..keys.routes import keys_router
from ..quota.gate import QuotaView
from ..settings import pauses
from ..settings.config import GatewayConfig
from ..settings.reload import ReloadError
from .body import PATHS
from .openapi import openapi
from .tokenize import TOKENIZE_PATHS

log = logging.getLogger("fairserve.gateway")


_FAST = {path: kind for kind, path in PATHS.items()}
_OPEN = frozenset({"/healthz", "/health", "/livez"})  # what load balancers and probes read: never throttled


class _GatewayApp(FastAPI):
    """FastAPI, except that the two completion POSTs go straight to the proxy (no middleware, routing or
    Request on the hot path); everything else is routed as usual. A request from an address, or with a key, that
    failed to authenticate too often is refused before either unless its key is valid (`tenancy.AuthThrottle`)."""

    completion: Any = None
    tokenize: Any = None
    throttle: AuthThrottle | None = None
    valid_key: Any = None  # a tenant's, the admin's or the /metrics key (`create_app`)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await super().__call__(scope, receive, send)
        throttle = self.throttle
        if throttle is not None and (not throttle.limit or scope["path"] in _OPEN):
            throttle = None
        address, key = _address(scope), scope_bearer(scope) if throttle is not None else None
        # NOTE: the key is checked only for an address or key already throttled (rare, and the check costs a hash):
        # a valid key is served whatever others sent from its address; a wrong one gets the 429 before any work
        if throttle is not None and (wait := throttle.blocked(address, key)) > 0 and not self.valid_key(key):
            return await throttle.refusal(wait)(scope, receive, send)
        if scope["method"] == "POST" and self.completion is not None:
            kind = _FAST.get(scope["path"])
            if kind is not None:
                return await self.completion(scope, receive, send, kind)
            if scope["path"] in TOKENIZE_PATHS:
                return await self.tokenize(scope, receive, send)
        if throttle is None:
            return await super().__call__(scope, receive, send)

        async def counting(message: Any) -> None:
            if message["type"] == "http.response.start" and message["status"] == 401:
                throttle.failed(address, key)
            await send(message)

        await super().__call__(scope, receive, counting)


def _address(scope: Scope) -> str:
    return (scope.get("client") or ("",))[0]


def _on_hangup(gw: Gateway) -> bool:
    """SIGHUP reloads (where the loop may take signals: the main thread); whether it was installed."""

    tasks: set[asyncio.Task[None]] = set()

    async def reload() -> None:
        try:
            await gw.reload()
        except ReloadError:
            pass  # NOTE: logged in one line by `Gateway.reload`
        except Exception:  # NOTE: no one awaits this task: said here, not as "Task exception was never retrieved"
            log.exception("reload failed")

    def hangup() -> None:
        task = asyncio.get_running_loop().create_task(reload())
        tasks.add(task)  # NOTE: held until done: the loop keeps only a weak reference
        task.add_done_callback(tasks.discard)

    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, hangup)
    except (ValueError, RuntimeError, NotImplementedError):  # NOTE: not the main thread (tests), or no SIGHUP
        return False
    return True


def _started(scope: Scope) -> bool:
    return bool(scope.get("fairserve.streaming"))  # set by the proxy before it starts a stream


class _Asgi(Response):
    """A response that is an ASGI callable."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def _unauthorized(request_id: str | None = None, why: str | None = None) -> Response:
    return error_response(
        401,
        why or "missing or unknown API key: send 'Authorization: Bearer KEY'",
        code="invalid_api_key",
        headers={"X-Request-Id": request_id} if request_id else None,
    )


def create_app(config: GatewayConfig, load: Callable[[], GatewayConfig] | None = None, freeze: bool = False) -> FastAPI:
    """The app; `load` re-reads the configuration (the file with the same flags) for SIGHUP and POST /admin/reload;
    `freeze` (a gateway in its own process): once started, and after each reload, what it holds is left out of the
    collector's passes (gateway/settings/pauses.py)."""
    gw = Gateway(config)
    gw.load = load

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await gw.serve()  # NOTE: every part in start order (Gateway.parts), stopped in reverse
        if freeze:
            pauses.settle()
            gw.frozen = True
        hangup = load is not None and _on_hangup(gw)
        yield
        if hangup:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        await gw.close()

    # NOTE: no redirect_slashes: Starlette builds the redirect's Location from the client's Host header (an open
    # redirect), and the OpenAI SDK follows a 307 with the prompt; a path with a trailing slash is a 404
    app = _GatewayApp(
        title="fairserve gateway",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        redirect_slashes=False,
    )
    app.state.gateway = gw
    app.throttle = gw.throttle

    def valid_key(key: str | None) -> bool:
        """A tenant's, the admin's or the /metrics key: never throttled."""
        cfg = gw.cfg
        return key is not None and (key in gw.owners or same_key(key, cfg.admin_key) or same_key(key, cfg.metrics_key))

    app.valid_key = valid_key

    async def identify(scope: Scope) -> tuple[str | None, str]:
        """`gw.identify`, and a key unknown here asked of the store of the API's keys before its 401."""
        tenant, request_id = gw.identify(scope)
        if tenant is None and await gw.keys.recheck(scope_bearer(scope)):
            tenant = gw.identify(scope)[0]
        return tenant, request_id

    async def completion_asgi(scope: Scope, receive: Receive, send: Send, kind: str) -> None:
        tenant, request_id = await identify(scope)
        if tenant is None:
            key = scope_bearer(scope)
            gw.throttle.failed(_address(scope), key)
            return await _unauthorized(request_id, gw.keys.refusal(key))(scope, receive, send)
        try:
            await gw.proxy.handle(scope, receive, send, kind, tenant, request_id)
        except Exception as exc:  # what the app's handler of unexpected errors would do
            log.error("request %s: unexpected error on %s %s: %r", request_id, scope["method"], scope["path"], exc)
            if not _started(scope):
                await error_response(500, "internal gateway error", code="internal_error")(scope, receive, send)
            else:
                raise

    app.completion = completion_asgi

    async def tokenize_asgi(scope: Scope, receive: Receive, send: Send) -> None:
        tenant, request_id = await identify(scope)
        if tenant is None:
            key = scope_bearer(scope)
            gw.throttle.failed(_address(scope), key)
            return await _unauthorized(request_id, gw.keys.refusal(key))(scope, receive, send)
        await gw.tokenize.handle(scope, receive, send, tenant, request_id)

    app.tokenize = tokenize_asgi

    def completion(kind: str) -> Callable[[], Awaitable[Response]]:
        # NOTE: POSTs to these paths are served by `_GatewayApp.__call__` before routing; this is a fallback
        async def route() -> Response:
            return _Asgi(lambda scope, receive, send: completion_asgi(scope, receive, send, kind))

        return route

    for kind, path in PATHS.items():
        app.add_api_route(path, completion(kind), methods=["POST"], name=kind)

    @app.post("/tokenize")
    @app.post("/detokenize")
    async def tokenize(request: Request) -> Response:
        # NOTE: POSTs to these paths are served by `_GatewayApp.__call__` before routing; this is a fallback
        return _Asgi(tokenize_asgi)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        tenant, key = gw.tenant(request), bearer(request)
        if tenant is None and not same_key(key, config.admin_key):
            if await gw.keys.recheck(key):
                tenant = gw.tenant(request)
            if tenant is None:
                return _unauthorized(why=gw.keys.refusal(key))
        return await gw.models(tenant)

    @app.get("/healthz")
    @app.get("/health")
    async def healthz() -> Response:
        status, doc = gw.health_report()
        return JSONResponse(doc, status_code=status)

    # NOTE: liveness is the process alone: /healthz is 503 through a backend outage, which the gateway queues through
    @app.get("/livez")
    async def livez() -> dict:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        if (denied := metrics_denied(request, gw.cfg.metrics_key)) is not None:
            return denied
        body = gw.metrics.exposition()
        if gw.sched.quotas is not None:
            body += (await gw.sched.quotas.exposition(gw.metrics.active_tenants)).encode()
        if gw.rates.on:
            body += (await gw.rates.exposition(gw.metrics.active_tenants)).encode()
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    spec = openapi(config)

    @app.get("/openapi.json")
    async def openapi_json() -> Response:
        return JSONResponse(spec)

    app.include_router(
        admin_router(
            gw.sched,
            gw.sched.tenants,
            config.admin_key,
            gw.owners,
            gw.backend_rows,
            QuotaView(gw.sched),
            gw.keys.all_rows,
            gw.rates.dashboard,
        )
    )

    app.include_router(keys_router(gw.keys, lambda request: admin_denied(request, gw.cfg.admin_key, gw.owners)))

    @app.get("/admin/rates")
    async def rates(request: Request) -> Response:
        if (denied := admin_denied(request, gw.cfg.admin_key, gw.owners)) is not None:
            return denied
        return JSONResponse(await gw.rates.all_status())

    @app.post("/admin/reload")
    async def reload_config(request: Request) -> Response:
        if (denied := admin_denied(request, gw.cfg.admin_key, gw.owners)) is not None:
            return denied
        if gw.load is None:
            return error_response(409, "this gateway was started without a configuration to re-read", code="no_config")
        try:
            line = await gw.reload()
        except ReloadError as e:
            return error_response(400, f"reload refused, the running configuration is kept: {e}", code="invalid_config")
        return JSONResponse({"reloaded": True, "message": line})

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
