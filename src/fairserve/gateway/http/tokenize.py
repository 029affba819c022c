"""/tokenize and /detokenize (vLLM's): authenticated and sent to a backend that serves the request's model, but not
queued and not charged (they cost the backend a tokenizer call, no GPU time); each tenant may have at most
`tokenize_concurrency` of them in flight (429 `too_many_requests` over it). The body goes upstream as the client sent
it and the backend's answer comes back as it is."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ...api.body import DISCONNECTED, ClientGone, read_body
from ...api.errors import error_response
from ...api.protocol import parse_json
from ...tenancy.access import model_refused
from ..admission.scheduler import Scheduler
from ..component import Part
from ..dispatch.pools import UnknownModel
from ..relay.upstream import UpstreamError, passthrough
from ..settings.config import GatewayConfig

TOKENIZE_PATHS = ("/tokenize", "/detokenize")


class Tokenize(Part):
    def __init__(
        self, sched: Scheduler, upstream: Any, allowed_models: Callable[[], dict[str, frozenset[str]]]
    ) -> None:
        self.sched, self.upstream = sched, upstream
        self.allowed_models = allowed_models  # NOTE: the proxy's, read at each request: one per configuration
        self.configure(sched.cfg)
        self.in_flight: dict[str, int] = {}  # by tenant

    def check(self, old: GatewayConfig, new: GatewayConfig) -> None:
        """Any limit applies live."""

    def configure(self, cfg: GatewayConfig) -> None:
        """The limits of the requests from now on (their model access is the proxy's)."""
        self.cfg = cfg

    def _error(self, status: int, message: str, code: str, rid: str, param: str | None = None) -> Response:
        headers = {"X-Request-Id": rid, **({"Retry-After": "1"} if status == 429 else {})}
        return error_response(status, message, code=code, headers=headers, param=param)

    async def handle(self, scope: Scope, receive: Receive, send: Send, tenant: str, rid: str) -> None:
        path = scope["path"]
        try:
            raw = await read_body(scope, receive, self.cfg.max_body_bytes, self.cfg.client_timeout_s)
        except ClientGone:
            return await Response(status_code=DISCONNECTED)(scope, receive, send)
        if isinstance(raw, Response):  # 408 or 413
            raw.headers["X-Request-Id"] = rid
            return await raw(scope, receive, send)
        response = await self._forward(path, raw, tenant, rid)
        await response(scope, receive, send)

    async def _forward(self, path: str, raw: bytes, tenant: str, rid: str) -> Response:
        try:
            body = parse_json(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return self._error(400, "The request body must be a JSON object.", "invalid_request", rid)
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            return self._error(400, "'model' must be a string.", "invalid_request", rid, "model")
        if (message := model_refused(self.allowed_models(), tenant, model)) is not None:
            return self._error(403, message, "model_not_allowed", rid, "model")
        try:
            pool = self.sched.pools.route(model)
        except UnknownModel as e:
            return self._error(404, str(e), "model_not_found", rid, "model")
        now = time.monotonic()
        up = [b for b in pool.backends if b.up(now)]
        if not up:
            return self._error(503, "no backend serving this model is up", "backend_unavailable", rid)
        if self.in_flight.get(tenant, 0) >= self.cfg.tokenize_concurrency:
            message = f"tenant {tenant!r} has {self.cfg.tokenize_concurrency} {path} requests in flight already"
            return self._error(429, message, "too_many_requests", rid)
        backend = min(up, key=lambda b: b.load())
        headers = [("content-type", "application/json"), ("user-agent", "fairserve-gateway"), ("x-request-id", rid)]
        if backend.cfg.api_key:
            headers.append(("authorization", f"Bearer {backend.cfg.api_key}"))
        self.in_flight[tenant] = self.in_flight.get(tenant, 0) + 1
        try:
            resp = await self.upstream.post(backend.url, path, raw, headers)
            try:
                content = await resp.read()
            finally:
                resp.close()
        except UpstreamError as e:
            return self._error(502, f"{backend.name}: {e.kind}", "backend_error", rid)
        finally:
            self.in_flight[tenant] -= 1
            if not self.in_flight[tenant]:
                del self.in_flight[tenant]
        return passthrough(resp, content, rid)
