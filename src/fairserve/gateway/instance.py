"""What one gateway instance holds (`Gateway`): config, scheduler (policy + backends), metrics, the upstream client,
the monitors; who a request is from (`identify`), `/healthz`'s report and the union of the backends' models. The
routes over it are in gateway/http/app.py."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
from collections.abc import Callable
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Scope

from ..api.protocol import models_list
from ..core import DEFAULT_TENANT
from ..tenancy import AuthThrottle, bearer, same_key
from .admission.scheduler import Scheduler
from .component import Component, Part, ReloadError
from .dispatch.capacity import CapacityMonitor
from .dispatch.fleet import connections
from .dispatch.health import HealthMonitor
from .http.tokenize import Tokenize
from .keys.gate import ApiKeys
from .keys.store import FileKeys, keys_path
from .keys.tenants import at_start, merged
from .metrics.prometheus import GatewayMetrics
from .rate.gate import RateGate
from .relay.proxy import Proxy
from .relay.stalls import StallWatch
from .relay.upstream import Upstream
from .settings.config import GatewayConfig
from .settings.reload import reload as reload_config
from .shared.snapshot import Snapshots

log = logging.getLogger("fairserve.gateway")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,128}$")


class Gateway(Part):
    """What one app instance holds: config, scheduler (policy + backends), metrics, the upstream client."""

    def __init__(self, cfg: GatewayConfig) -> None:
        self.base = cfg  # the config file's (with the flags), as last read: `cfg` is it with the API's tenants
        # NOTE: without `state`, the keys API's tenants are beside the snapshot: read now (a bad file stops the
        # gateway before it serves), so that the ledger, the snapshot's restore and every part start with them
        store = FileKeys(keys_path(cfg.snapshot)) if cfg.snapshot is not None else None
        self.cfg = cfg = at_start(cfg, list(store.tenants.values())) if store is not None else cfg
        self.metrics = GatewayMetrics(cfg.metrics_window_s)
        self.sched = Scheduler(cfg, self.metrics)
        self.metrics.bind(self.sched)
        # NOTE: restored now, so that a bad file stops the gateway before it serves
        self.snapshots = (
            Snapshots(cfg.snapshot, self.sched.ledger, cfg, cfg.snapshot_interval_s)
            if cfg.snapshot is not None
            else None
        )
        self.throttle = AuthThrottle(cfg.auth_failure_limit, cfg.auth_failure_window_s)
        self.stalls = StallWatch(cfg.client_write_timeout_s, cfg.client_min_rate)
        self.owners = cfg.key_owners()
        self.keys = ApiKeys(cfg, self.sched, self.owners, self, store)  # made through the admin API, after the file's
        self.tenant_names = cfg.index().name_set
        self.keyless = cfg.keyless
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
        self.rates = RateGate(self.sched)  # per-minute caps, counted at arrival (gateway/rate/gate.py)
        self.proxy = Proxy(self.sched, self.upstream, self.stalls, self.rates)
        self.tokenize = Tokenize(self.sched, self.upstream, lambda: self.proxy.allowed_models)
        self.capacity = CapacityMonitor(self.sched, self.client, cfg.metrics_interval_s)  # adaptive backends only
        self.health = HealthMonitor(self.sched, self.client)
        self.load: Callable[[], GatewayConfig] | None = None  # re-reads the configuration (live reload)
        self.reloading = asyncio.Lock()  # one reload at a time
        self.frozen = False  # what it holds is left out of the collector's passes (gateway/settings/pauses.py)

    def parts(self) -> list[Component]:
        """Every part, in start order, which is also the order they apply a new configuration: the scheduler first
        (the shared state is joined before anything is served; the pools a backend change makes take its new tenant
        tree; the rate caps and the API's keys after it, in the Redis it joined), the proxy last (stopped first, it
        lets the requests cut at the end of the drain settle)."""
        snapshots: list[Component] = [self.snapshots] if self.snapshots is not None else []
        parts: list[Component] = [
            self.sched,
            self.rates,
            self.keys,
            self,
            self.health,
            self.capacity,
            *snapshots,
            self.metrics,
            self.stalls,
        ]
        return [*parts, self.throttle, self.tokenize, self.proxy]

    async def start(self) -> None:
        """Its own part: the clients are opened as they are used."""

    async def stop(self) -> None:
        """The clients to the backends are closed (after the parts that use them have stopped)."""
        await self.client.aclose()
        await self.upstream.aclose()

    async def serve(self) -> None:
        """Start every part, in order."""
        for part in self.parts():
            await part.start()

    async def close(self) -> None:
        """Stop every part, in reverse order."""
        for part in reversed(self.parts()):
            await part.stop()

    def configure(self, cfg: GatewayConfig) -> None:
        """The keys and tenants of the requests from now on, and the upstream hop's timeouts and connections."""
        index = cfg.index()  # NOTE: made off the event loop by a reload
        self.owners.replace(index.owners)
        self.tenant_names = index.name_set
        self.keyless = cfg.keyless
        self.upstream.configure(
            cfg.connect_timeout_s,
            cfg.chunk_timeout_s,
            cfg.request_timeout_s,
            connections(cfg.backends, self.sched.draining),
        )
        self.cfg = cfg

    async def reload(self) -> str:
        """Re-read and apply the configuration (gateway/settings/reload.py), with the tenants the keys API made;
        ReloadError (one line) when it is refused."""
        assert self.load is not None
        read, bases = self.load, []

        def load() -> GatewayConfig:
            bases.append(read())
            return merged(bases[-1], list(self.keys.tenants.values()))

        try:
            line = await reload_config(self, load)
        except ReloadError as e:
            log.error("reload refused, the running configuration is kept: %s", e)
            raise
        old, self.base = self.base, bases[-1]  # NOTE: before any await: the lock is free, the next reload reads this
        if sys.getrefcount(old) == 2:  # NOTE: `old` and the call's argument: nothing else holds the file's last one
            await asyncio.to_thread(old.release)  # NOTE: freed a tenant at a time, off the event loop
        log.info(line)
        return line

    async def use_tenants(self) -> None:
        """The tenants the keys API made, as they are now, put in place beside the config file's (as last read):
        a reload (ReloadError when refused)."""
        line = await reload_config(self, lambda: merged(self.base, list(self.keys.tenants.values())))
        log.info("tenants of the keys API applied: %s", line.removeprefix("config reloaded: "))

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
                **({"busy_for_s": round(left, 3)} if (left := b.busy_until - self.sched.clock()) > 0 else {}),
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
        if self.keys.book.budgets and tenant is not None and (budget := self.keys.book.budget(key)) is not None:
            scope["fairserve.budget"] = budget  # NOTE: a key made through the API with its own budget (a quota)
        # NOTE: 16 random bytes, as uuid4's (whose UUID object cost 3% of the gateway's CPU)
        return tenant, rid if rid is not None and _REQUEST_ID.match(rid) else os.urandom(16).hex()

    def _tenant(self, key: str | None, claimed: str | None) -> str | None:
        if self.keyless:  # NOTE: no tenants configured: everyone is the one tenant, no key asked
            return DEFAULT_TENANT
        if key is None:
            return None
        owner = self.owners.get(key)
        if self.cfg.trusted_proxy and claimed is not None:
            valid = owner is not None or same_key(key, self.cfg.admin_key)
            return claimed if valid and claimed in self.tenant_names else None
        return owner

    async def models(self, tenant: str | None = None) -> Response:
        """The models `tenant` may use (None, the admin key: all) of the union the backends serve (their /v1/models
        entries, adapters' `parent` kept); while no backend's list is known, the first healthy backend's answer,
        else the configured `models`. NOTE: a tenant limited to some models learns nothing of the others."""
        allowed = self.proxy.allowed_models.get(tenant) if tenant is not None else None
        doc = await self._listing()
        if allowed is not None:
            doc = {**doc, "data": [m for m in doc["data"] if isinstance(m, dict) and m.get("id") in allowed]}
        return JSONResponse(doc)

    async def _listing(self) -> dict[str, Any]:
        seen: dict[str, dict[str, Any]] = {}
        for b in self.sched.backends:
            for m in b.listing:
                seen.setdefault(m["id"], m)
        if seen:
            return {"object": "list", "data": list(seen.values())}
        for b in self.sched.backends:
            if not b.healthy:
                continue
            headers = {"authorization": f"Bearer {b.cfg.api_key}"} if b.cfg.api_key else {}
            try:
                resp = await self.client.get(b.url + "/v1/models", headers=headers, timeout=5.0)
                doc = resp.json() if resp.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                continue
            if isinstance(doc, dict) and isinstance(doc.get("data"), list):
                return doc
        return models_list(*self.cfg.models)
