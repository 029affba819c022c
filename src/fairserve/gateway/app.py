"""The gateway's HTTP app: OpenAI-compatible routes, identity, health, metrics, admin, and error bodies."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from ..api.errors import error_response
from ..api.protocol import models_list
from ..tenancy import AuthThrottle, admin_denied, admin_router, bearer, metrics_denied, same_key
from .body import PATHS
from .capacity import CapacityMonitor
from .config import GatewayConfig
from .fleet import connections
from .health import HealthMonitor
from .openapi import openapi
from .prometheus import GatewayMetrics
from .proxy import Proxy
from .quota_gate import QuotaView
from .reload import ReloadError
from .reload import reload as reload_config
from .scheduler import Scheduler
from .snapshot import Snapshots
from .stalls import StallWatch
from .tokenize import TOKENIZE_PATHS, Tokenize
from .upstream import Upstream

log = logging.getLogger("fairserve.gateway")


class Gateway:
    """What one app instance holds: config, scheduler (policy + backends), metrics, the upstream client."""

    def __init__(self, cfg: GatewayConfig) -> None:
        self.cfg = cfg
        self.metrics = GatewayMetrics(cfg.metrics_window_s)
        self.sched = Scheduler(cfg, self.metrics)
        self.metrics.bind(self.sched)
        # NOTE: restored now, so that a bad file stops the gateway before it serves
        self.snapshots = (
            Snapshots(cfg.snapshot, self.sched.ledger, cfg.weights(), cfg.snapshot_interval_s)
            if cfg.snapshot is not None
            else None
        )
        self.throttle = AuthThrottle(cfg.auth_failure_limit, cfg.auth_failure_window_s)
        self.stalls = StallWatch(cfg.client_write_timeout_s, cfg.client_min_rate)
        self.owners = cfg.key_owners()
        self.tenant_names = frozenset(self.sched.tenants)
        limit = connections(cfg.backends, [])
        # NOTE: the gateway's own requests (health checks, model lists, metrics scrapes) are a few per backend at a
        # time: no cap, so backends a reload adds need no new client
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(cfg.chunk_timeout_s, connect=cfg.connect_timeout_s),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=limit),
        )
        self.upstream = Upstream(
            connect_timeout=cfg.connect_timeout_s,
            read_timeout=cfg.chunk_timeout_s,
            max_connections=limit,
            first_byte_timeout=cfg.request_timeout_s,
        )
        self.proxy = Proxy(self.sched, self.upstream, self.stalls)
        self.tokenize = Tokenize(self.sched, self.upstream, self.proxy.allowed_models)
        self.capacity = CapacityMonitor(self.sched, self.client, cfg.metrics_interval_s)  # adaptive backends only
        self.health = HealthMonitor(self.sched, self.client)
        self.load: Callable[[], GatewayConfig] | None = None  # re-reads the configuration (live reload)
        self.reloading = asyncio.Lock()  # one reload at a time

    async def reload(self) -> str:
        """Re-read and apply the configuration (gateway/reload.py); ReloadError (one line) when it is refused."""
        assert self.load is not None
        try:
            line = await reload_config(self, self.load)
        except ReloadError as e:
            log.error("reload refused, the running configuration is kept: %s", e)
            raise
        log.warning(line)
        return line

    def backend_rows(self) -> list[dict[str, Any]]:
        """Each backend's state, its URL without credentials (`/healthz`, the dashboard)."""
        draining = self.sched.draining
        return [
            {
                "url": b.name,
                **({"draining": True} if b in draining else {}),
                "healthy": b.healthy,
                "in_flight_requests": b.requests,
                "in_flight_tokens": b.tokens,
                "limit_requests": b.limit,
                "adaptive": b.cfg.adaptive,
                **({"models": sorted(b.models)} if b.models is not None else {}),
                **({"reason": b.reason} if b.reason else {}),
                **({"busy_for_s": round(left, 3)} if (left := b.busy_until - time.monotonic()) > 0 else {}),
            }
            for b in [*self.sched.backends, *draining]
        ]

    def health_report(self) -> tuple[int, dict[str, Any]]:
        """`/healthz`: 200 while some backend is up, else 503 with the reason."""
        backends = self.backend_rows()
        up = bool(self.sched.healthy)
        doc: dict[str, Any] = {
            "status": "ok" if up else "unavailable",
            "policy": self.sched.ledger.policy.name,
            "queued": self.sched.pools.num_queued,
            "backends": backends,
        }
        if self.sched.shared is not None:  # NOTE: degraded shared state still serves: 200, said in the body
            doc["shared_state"] = self.sched.shared.status()
        if not up:
            doc["reason"] = "no backend is healthy: " + "; ".join(
                f"{b.name}: {b.reason or 'down'}" for b in self.sched.backends
            )
        return (200 if up else 503), doc

    def tenant(self, request: Request) -> str | None:
        """The tenant a request is from: its key's owner; with `trusted_proxy`, `X-Tenant-Id` (the key must still
        be a valid tenant or admin key). None: unauthenticated."""
        return self._tenant(bearer(request), request.headers.get("x-tenant-id"))

    def identify(self, scope: Scope) -> tuple[str | None, str]:
        """(`tenant()`, the request's id) from a raw ASGI scope (the hot path builds no Request). The id is the
        client's `X-Request-Id` when it is 1-128 characters of letters, digits and `-_.:@/+=`, else a new one."""
        auth = claimed = rid = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                if auth is None:
                    auth = value.decode("latin-1")
            elif name == b"x-tenant-id":
                if claimed is None:
                    claimed = value.decode("latin-1")
            elif name == b"x-request-id" and rid is None:
                rid = value.decode("latin-1")
        scheme, _, key = (auth or "").partition(" ")
        key = key.strip()
        tenant = self._tenant(key if scheme.lower() == "bearer" and key else None, claimed)
        return tenant, rid if rid is not None and _REQUEST_ID.match(rid) else uuid.uuid4().hex

    def _tenant(self, key: str | None, claimed: str | None) -> str | None:
        if key is None:
            return None
        owner = self.owners.get(key)
        if self.cfg.trusted_proxy and claimed is not None:
            valid = owner is not None or same_key(key, self.cfg.admin_key)
            return claimed if valid and claimed in self.tenant_names else None
        return owner

    async def models(self) -> Response:
        """The union of the models the backends serve (their /v1/models entries, adapters' `parent` kept); while no
        backend's list is known, the first healthy backend's answer, else the configured `models`."""
        seen: dict[str, dict[str, Any]] = {}
        for b in self.sched.backends:
            for m in b.listing:
                seen.setdefault(m["id"], m)
        if seen:
            return JSONResponse({"object": "list", "data": list(seen.values())})
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
        return JSONResponse(models_list(*self.cfg.models))


_FAST = {path: kind for kind, path in PATHS.items()}
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,128}$")
_OPEN = frozenset({"/healthz", "/health", "/livez"})  # what load balancers and probes read: never throttled


class _GatewayApp(FastAPI):
    """FastAPI, except that the two completion POSTs go straight to the proxy (no middleware, routing or
    Request on the hot path); everything else is routed as usual. An address that failed to authenticate too often
    is refused before either (`tenancy.AuthThrottle`)."""

    completion: Any = None
    tokenize: Any = None
    throttle: AuthThrottle | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await super().__call__(scope, receive, send)
        throttle = self.throttle
        address = (scope.get("client") or ("",))[0]
        if throttle is not None and throttle.limit and scope["path"] not in _OPEN:
            if (wait := throttle.blocked(address)) > 0:
                return await throttle.refusal(wait)(scope, receive, send)
        if scope["method"] == "POST" and self.completion is not None:
            kind = _FAST.get(scope["path"])
            if kind is not None:
                return await self.completion(scope, receive, send, kind)
            if scope["path"] in TOKENIZE_PATHS:
                return await self.tokenize(scope, receive, send)
        if throttle is None or not throttle.limit:
            return await super().__call__(scope, receive, send)

        async def counting(message: Any) -> None:
            if message["type"] == "http.response.start" and message["status"] == 401:
                throttle.failed(address)
            await send(message)

        await super().__call__(scope, receive, counting)


def _on_hangup(gw: Gateway) -> bool:
    """SIGHUP reloads (where the loop may take signals: the main thread); whether it was installed."""

    tasks: set[asyncio.Task[None]] = set()

    async def reload() -> None:
        with contextlib.suppress(ReloadError):  # NOTE: logged in one line by `Gateway.reload`
            await gw.reload()

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


def _unauthorized(request_id: str | None = None) -> Response:
    return error_response(
        401,
        "missing or unknown API key: send 'Authorization: Bearer KEY'",
        code="invalid_api_key",
        headers={"X-Request-Id": request_id} if request_id else None,
    )


def create_app(config: GatewayConfig, load: Callable[[], GatewayConfig] | None = None) -> FastAPI:
    """The app; `load` re-reads the configuration (the file with the same flags) for SIGHUP and POST /admin/reload."""
    gw = Gateway(config)
    gw.load = load

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if gw.sched.shared is not None:
            await gw.sched.shared.start()  # NOTE: syncs in a task of its own; the request path never waits on Redis
            if gw.sched.quotas is not None:
                gw.sched.quotas.use_redis(gw.sched.shared)
        await gw.health.discover_all()  # NOTE: the models each backend serves, before the first request
        gw.capacity.start()  # NOTE: a task of its own, nothing on the request path
        gw.health.start()
        if gw.snapshots is not None:
            gw.snapshots.start()
        hangup = load is not None and _on_hangup(gw)
        yield
        if hangup:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        # NOTE: requests cut off at the end of the drain are still sending their last event and settling
        deadline = time.monotonic() + 2.0
        while sum(map(len, gw.sched.pools.ledgers)) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        gw.stalls.stop()
        if gw.sched.quotas is not None:
            await gw.sched.quotas.drain()
        if gw.snapshots is not None:
            await gw.snapshots.stop()
            gw.snapshots.save()
        await gw.health.stop()
        await gw.capacity.stop()
        if gw.sched.shared is not None:
            await gw.sched.shared.stop()
        await gw.client.aclose()
        await gw.upstream.aclose()
        gw.sched.usage.close()

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

    async def completion_asgi(scope: Scope, receive: Receive, send: Send, kind: str) -> None:
        tenant, request_id = gw.identify(scope)
        if tenant is None:
            gw.throttle.failed((scope.get("client") or ("",))[0])
            return await _unauthorized(request_id)(scope, receive, send)
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
        tenant, request_id = gw.identify(scope)
        if tenant is None:
            gw.throttle.failed((scope.get("client") or ("",))[0])
            return await _unauthorized(request_id)(scope, receive, send)
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
        if gw.tenant(request) is None and not same_key(bearer(request), config.admin_key):
            return _unauthorized()
        return await gw.models()

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
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    spec = openapi(config)

    @app.get("/openapi.json")
    async def openapi_json() -> Response:
        return JSONResponse(spec)

    app.include_router(
        admin_router(gw.sched, gw.sched.tenants, config.admin_key, gw.owners, gw.backend_rows, QuotaView(gw.sched))
    )

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
