"""Forwarding one completion request: read and check it, queue it, wait for the policy, send it to a backend,
retry elsewhere if that backend fails before any output, and relay the answer while charging it.

This is the hot path, so it speaks ASGI directly (no Request/Response objects on the way of a streamed answer)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ...api.body import DISCONNECTED, ClientGone, read_body
from ...api.errors import error_response
from ...api.protocol import parse_json
from ...api.streaming import shutting_down
from ...tenancy import model_refused, priority_message
from ..admission.scheduler import Scheduler
from ..admission.ticket import Ending, Ticket
from ..component import Part
from ..dispatch.fallback import fallback
from ..dispatch.locality import prompt_digests
from ..dispatch.pools import Backend, UnknownModel
from ..dispatch.unavailable import PoolDown
from ..http.body import (
    CHAT,
    PATHS,
    BodyError,
    Parsed,
    parse_body,
    response_output_tokens,
    served_as,
    upstream_body,
    usage_of,
)
from ..quota.book import Exhausted
from ..quota.gate import insufficient_quota
from ..rate.gate import RateGate
from ..settings.config import GatewayConfig
from .client import Client
from .failures import Failed, retry_after
from .pipe import Buffers
from .stalls import StallWatch
from .stream import Relay
from .upstream import UpstreamError, UpstreamFailed, UpstreamResponse, passthrough

log = logging.getLogger("fairserve.gateway")

RETRYABLE = {408, 429}  # and every 5xx: another backend may do better
WATCH_AFTER_S = 0.02  # when a request starts watching for its client's disconnect
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


class Proxy(Part):
    def __init__(
        self, sched: Scheduler, upstream: Any, stalls: StallWatch | None = None, rates: RateGate | None = None
    ) -> None:
        self.sched, self.rates = sched, rates  # NOTE: the rate caps count a request once it has a ticket
        self.upstream = upstream
        self.stalls = stalls
        self.buffers = Buffers()  # what the streams hold read from their backends, not yet sent (gateway/relay/pipe.py)
        self.configure(sched.cfg)

    def check(self, old: GatewayConfig, new: GatewayConfig) -> None:
        """Any limit and model access apply live."""

    def configure(self, cfg: GatewayConfig) -> None:
        """The limits and model access of the requests from now on."""
        self.cfg = cfg
        self.allowed_models = cfg.index().allowed_models  # tenants limited to some models

    async def stop(self) -> None:
        """The requests cut off at the end of the server's drain are still sending their last event and settling:
        at most 2 s more for them."""
        deadline = time.monotonic() + 2.0
        while sum(map(len, self.sched.pools.ledgers)) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def _error(
        self,
        t: Ticket | str,
        status: int,
        message: str,
        code: str,
        headers: dict[str, str] | None = None,
        param: str | None = None,
    ) -> Response:
        rid = t if isinstance(t, str) else t.request_id
        return error_response(status, message, code=code, headers={**(headers or {}), "X-Request-Id": rid}, param=param)

    async def handle(
        self, scope: Scope, receive: Receive, send: Send, kind: str, tenant: str, request_id: str = ""
    ) -> None:
        sched, metrics = self.sched, self.sched.metrics
        try:
            raw = await read_body(scope, receive, self.cfg.max_body_bytes, self.cfg.client_timeout_s)
        except ClientGone:
            return await Response(status_code=DISCONNECTED)(scope, receive, send)
        if isinstance(raw, Response):  # 408 (a stalled upload) or 413
            metrics.refused(tenant, "client_timeout" if raw.status_code == 408 else "invalid")
            raw.headers["X-Request-Id"] = request_id
            return await raw(scope, receive, send)
        try:
            parsed = parse_body(raw, kind, self.sched.count_tokens, self.cfg.default_max_tokens, self.cfg.aliases)
        except BodyError as e:
            metrics.refused(tenant, "invalid")
            sched.usage.refused(request_id, tenant, None, kind, "invalid")
            return await self._error(request_id, 400, str(e), "invalid_request", param=e.param)(scope, receive, send)
        if self.cfg.fallbacks and (model := fallback(sched.pools, parsed.model, self.cfg.fallbacks)) is not None:
            parsed = served_as(parsed, model)  # NOTE: its own pool is down: served, checked and charged as `model`
        refusal = self.refusal(tenant, parsed, kind, request_id)
        if refusal is not None:
            return await refusal(scope, receive, send)
        budget = scope.get("fairserve.budget")  # NOTE: its key's budget, where it has one (gateway/instance.py)
        if sched.quotas is not None and (out := await sched.quotas.check(tenant, budget)) is not None:
            metrics.refused(tenant, "insufficient_quota")
            sched.usage.refused(request_id, tenant, parsed.model, kind, "insufficient_quota")
            return await insufficient_quota(out, request_id)(scope, receive, send)
        try:
            ticket = sched.new_ticket(tenant, parsed.footprint, request_id, parsed.model, kind)
            ticket.budget = budget
        except UnknownModel as e:
            metrics.refused(tenant, "model_not_found")
            sched.usage.refused(request_id, tenant, parsed.model, kind, "model_not_found")
            return await self._error(request_id, 404, str(e), "model_not_found", param="model")(scope, receive, send)
        if sched.pools.placement.prefix_delta is not None:  # NOTE: prefix dispatch places by the prompt's blocks
            ticket.prefix = prompt_digests(parsed.body, kind == CHAT, parsed.footprint.prompt_tokens)
        if self.rates is not None and self.rates.on and (limited := await self.rates.admit(ticket)) is not None:
            return await limited(scope, receive, send)
        refused = sched.submit(ticket, parsed.priority)
        if refused == "queue_full":
            return await self._error(
                ticket,
                429,
                f"tenant {tenant!r} has {self.cfg.queue_limit} requests queued already",
                "queue_full",
                headers={"Retry-After": "1"},
            )(scope, receive, send)
        if refused is not None:
            window = round(sched.ledger.policy.retry_after_s)
            return await self._error(
                ticket,
                429,
                f"tenant {tenant!r} is over its request rate ({sched.ledger.policy.name})",
                "rate_limited",
                headers={"Retry-After": str(window)},
            )(scope, receive, send)

        # NOTE: one watcher for the whole request: when the client goes away it closes the upstream request and
        # cancels this task, whether the request is queued, waiting for the backend, or streaming; the cancellation
        # is then absorbed here. It starts WATCH_AFTER_S in: most short requests are over by then. Nothing depends
        # on the cancellation landing (Python 3.11 can lose one): `client.left()` is asked before anything goes
        # upstream and after every piece sent to the client
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        client = Client(send)
        watcher: asyncio.Task[None] | None = None

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            client.gone = True
            if ticket.upstream is not None:
                ticket.upstream.close()
            task.cancel()

        def start_watching() -> None:
            nonlocal watcher
            watcher = loop.create_task(watch())

        timer = loop.call_later(WATCH_AFTER_S, start_watching)
        default = "internal_error"
        try:
            await self._serve(ticket, parsed, kind, scope, receive, send, client)
        except asyncio.CancelledError:
            timer.cancel()
            if watcher is not None:
                watcher.cancel()
            task.uncancel()
            if client.left():
                default = "client_disconnected"
            else:
                # NOTE: not the client: the server's drain ran out (SIGTERM + drain_timeout_s); the request ends
                # with an error the client can read, charged what it produced
                default = "shutdown"
                await shutting_down(bool(scope.get("fairserve.streaming")), scope, receive, send, "gateway")
        finally:
            timer.cancel()
            if watcher is not None:
                watcher.cancel()
            # NOTE: the one place an accepted request ends: the ending its path recorded (a stream records "ok"
            # before its last bytes, as the client may hang up the moment it reads them), else how it was cut off
            ending = ticket.ending
            if ticket.stalled:
                ending = Ending("client_stalled")
            elif client.left() and (ending is None or ending.outcome != "ok"):
                # NOTE: nothing went upstream (queued, or admitted as it left): nothing is charged
                ending = Ending("client_disconnected", refund=not ticket.sent or (ending is not None and ending.refund))
            sched.close(ticket, ending or Ending(default))
            log.debug("request %s: tenant %s, %s", ticket.request_id, tenant, ticket.outcome)

    def refusal(self, tenant: str, parsed: Parsed, kind: str, request_id: str) -> Response | None:
        """The 400 or 403 of a request its tenant may not send (a priority it may not name, a model it may not
        use); None if it may."""
        allowed = self.sched.refused_priority(tenant, parsed.priority)
        if allowed is not None and parsed.priority is not None:
            outcome, response = (
                "invalid",
                self._error(
                    request_id,
                    400,
                    priority_message(tenant, parsed.priority, allowed),
                    "invalid_priority",
                    param="priority",
                ),
            )
        elif (message := model_refused(self.allowed_models, tenant, parsed.model)) is not None:
            outcome = "model_not_allowed"
            response = self._error(request_id, 403, message, outcome, param="model")
        else:
            return None
        self.sched.metrics.refused(tenant, outcome)
        self.sched.usage.refused(request_id, tenant, parsed.model, kind, outcome)
        return response

    async def _serve(
        self, t: Ticket, parsed: Parsed, kind: str, scope: Scope, receive: Receive, send: Send, client: Client
    ) -> None:
        """Serve `t` and record its ending on it (`t.ending`); `handle` settles it."""
        body = upstream_body(parsed)
        while True:
            try:
                backend = await self.sched.wait(t)
            except UnknownModel as e:  # NOTE: a reload removed the last backend that served its model
                t.ending = Ending("model_not_found", refund=True)
                return await self._error(t, 404, str(e), "model_not_found", param="model")(scope, receive, send)
            except PoolDown as e:  # NOTE: no backend of its pool has been up for fail_fast_s
                t.ending = Ending("backend_unavailable", refund=True)
                retry = {"Retry-After": str(e.retry_after_s)}
                return await self._error(t, 503, str(e), "backend_unavailable", headers=retry)(scope, receive, send)
            if backend is None:
                t.ending = Ending("timeout", refund=True)
                response = self._error(
                    t,
                    503,
                    f"the request waited {self.cfg.queue_ttl_s:g} s in the queue without a free backend",
                    "queue_timeout",
                    headers={"Retry-After": "1"},
                )
                return await response(scope, receive, send)
            if client.left():
                return  # NOTE: admitted as its client left: nothing goes upstream
            if t.model is not None and t.model != parsed.model:  # NOTE: it moved to a fallback while queued
                parsed = served_as(parsed, t.model)
                body = upstream_body(parsed)
            if self.sched.quotas is not None and t.holding is None:
                # NOTE: a task, so that a hold taken as the client leaves is still settled (`Scheduler.close`)
                t.holding = asyncio.get_running_loop().create_task(self.sched.quotas.hold(t))
                held = await asyncio.shield(t.holding)
                if isinstance(held, Exhausted):  # NOTE: it ran out while this request was queued
                    t.ending = Ending("insufficient_quota", refund=True)
                    return await insufficient_quota(held, t.request_id)(scope, receive, send)
                if client.left():
                    return
            try:
                assert t.req is not None
                sent = upstream_body(parsed, t.tenant, t.req.priority or 0) if backend.cfg.engine_tenant else body
                return await self._attempt(t, backend, parsed, kind, sent, scope, receive, send, client)
            except Failed as e:
                if client.left():
                    return
                if not self.sched.backend_failed(t, e.unreachable, e.lost, str(e)):
                    t.ending = Ending("backend_error", refund=True)
                    if e.busy is not None:
                        response = self._error(
                            t,
                            503,
                            f"the backend is busy; last answer: {e}",
                            "backend_busy",
                            headers={"Retry-After": str(max(1, math.ceil(e.busy)))},
                        )
                    elif e.timeout:
                        response = self._error(
                            t, 504, f"no backend answered in time; last error: {e}", "backend_timeout"
                        )
                    else:
                        response = self._error(
                            t, 502, f"no backend could serve the request; last error: {e}", "backend_error"
                        )
                    return await response(scope, receive, send)
                log.info("request %s: retried after %s", t.request_id, e)

    def _headers(self, backend: Backend, stream: bool, request_id: str) -> list[tuple[str, str]]:
        h = [
            ("content-type", "application/json"),
            ("accept", "text/event-stream" if stream else "application/json"),
            ("accept-encoding", "identity"),
            ("user-agent", "fairserve-gateway"),
            ("x-request-id", request_id),
        ]
        if backend.cfg.api_key:
            h.append(("authorization", f"Bearer {backend.cfg.api_key}"))
        return h

    async def _attempt(
        self,
        t: Ticket,
        backend: Backend,
        parsed: Parsed,
        kind: str,
        body: bytes,
        scope: Scope,
        receive: Receive,
        send: Send,
        client: Client,
    ) -> None:
        t.sent = True
        try:
            resp = await self.upstream.post(
                backend.url, PATHS[kind], body, self._headers(backend, parsed.stream, t.request_id)
            )
        except UpstreamError as e:
            raise Failed.of(backend, e.kind) from None
        t.upstream = resp
        relay = None
        try:
            if client.left():
                return
            if resp.status_code != 200:
                content = await resp.read()
                status = resp.status_code
                after = retry_after(resp.header(b"retry-after")) if status in (429, 503) else None
                if after is not None:
                    wait = self.sched.backend_busy(backend, after)
                    raise Failed(f"{backend.name}: HTTP {status} (Retry-After: {after:g} s)", busy=wait)
                if status >= 500 or status in RETRYABLE:
                    raise Failed(f"{backend.name}: HTTP {status}")
                self.sched.backend_ok(backend)
                t.ending = Ending("backend_rejected", refund=True)
                return await passthrough(resp, content, t.request_id)(scope, receive, send)
            if not parsed.stream:
                content = await resp.read()
                try:
                    doc = parse_json(content, surrogates=True)
                except ValueError:
                    doc = None
                if not isinstance(doc, dict):  # NOTE: relayed as a success, it would be charged and break clients
                    raise Failed(f"{backend.name}: HTTP 200 with a body that is not a JSON object")
                self.sched.backend_ok(backend)
                return await self._answer(t, resp, content, doc, kind)(scope, receive, send)
            relay = Relay(self.sched, t, resp, kind, parsed.wants_usage, self.buffers)
            await relay.prefetch()
        except UpstreamFailed as e:
            resp.close()
            raise Failed.of(backend, e.kind, str(e)) from None
        except UpstreamError as e:
            resp.close()
            raise Failed.of(backend, e.kind) from None
        except BaseException:
            resp.close()
            raise
        finally:
            if relay is None:
                resp.close()
                t.upstream = None
        self.sched.backend_ok(backend)
        if client.left():
            relay.close()
            return
        scope["fairserve.streaming"] = True
        conn = client.conn
        if self.stalls is not None and conn is not None:
            relay.watched = self.stalls.watch(conn.transport, t)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self._sse_headers(t)})
            await relay.send_body(send, client.left)
        finally:
            if relay.watched is not None and self.stalls is not None:
                self.stalls.unwatch(relay.watched)
            relay.close()
            t.upstream = None

    @staticmethod
    def _sse_headers(t: Ticket) -> list[tuple[bytes, bytes]]:
        return [*SSE_HEADERS, (b"x-request-id", t.request_id.encode("latin-1"))]

    def _answer(self, t: Ticket, resp: UpstreamResponse, content: bytes, doc: dict[str, Any], kind: str) -> Response:
        prompt, output = usage_of(doc, kind)
        if output is None:
            output = response_output_tokens(doc, kind, self.sched.count_tokens)
        t.ending = Ending("ok", prompt, output)
        if t.first_token_at is None:  # NOTE: not streamed: its first output is its whole answer
            t.first_token_at = self.sched.clock()
        return passthrough(resp, content, t.request_id)
