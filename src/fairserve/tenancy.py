"""Tenancy, shared by every server in front of a ledger (`fairserve gateway`, `fairserve serve`): tenant config,
API keys, Bearer auth, the tenant flags, the admin API with the live dashboard, and the per-tenant Prometheus
collector.

The admin API and the collector read the ledger's `view()` and change it through `set_weight` / `reset`, whatever
owns the ledger (the gateway's scheduler, an engine's queue): see `Accounts`.
"""

from __future__ import annotations

import argparse
import hmac
import json
import math
import re
import time
from collections.abc import Iterator
from typing import Any, Protocol

from fastapi import APIRouter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from pydantic import Field, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .api.config import Strict
from .api.errors import error_response
from .core import MAX_WEIGHT, MIN_WEIGHT, LedgerView, Unsupported, check_weight
from .dashboard import BackendRows, History, asset, snapshot

_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
# NOTE: the largest cost of a token (w_p, w_q): with weights down to MIN_WEIGHT and token counts up to 2**31 a
# request adds at most ~1e21 to a counter, finite for any realistic lifetime
MAX_COST = 1e6


class TenantConfig(Strict):
    name: str
    api_keys: list[str] = Field(min_length=1)
    weight: float = Field(1.0, ge=MIN_WEIGHT, le=MAX_WEIGHT, allow_inf_nan=False)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"must be 1-64 characters of letters, digits, '_', '.', '@' or '-', got {v!r}")
        return v

    @field_validator("api_keys")
    @classmethod
    def _keys(cls, v: list[str]) -> list[str]:
        if any(not k or k != k.strip() for k in v):
            raise ValueError("API keys must be non-empty, without surrounding spaces")
        return v


def check_tenants(tenants: list[TenantConfig], admin_key: str | None) -> None:
    """Unique names; a key belongs to one tenant and is not the admin key."""
    names = [t.name for t in tenants]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"tenant names must be unique; repeated: {', '.join(sorted(dup))}")
    owner: dict[str, str] = {}
    for t in tenants:
        for k in t.api_keys:
            if k in owner and owner[k] != t.name:
                raise ValueError(f"an API key is shared by tenants {owner[k]!r} and {t.name!r}")
            owner[k] = t.name
    if admin_key is not None and admin_key in owner:
        raise ValueError(f"admin_key is also an API key of tenant {owner[admin_key]!r}")


class TenantsMixin:
    """What a config with `listen`, `tenants` and `admin_key` derives (the gateway's and `fairserve serve`'s)."""

    listen: str
    tenants: list[TenantConfig]

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    def weights(self) -> dict[str, float]:
        return {t.name: t.weight for t in self.tenants}

    def key_owners(self) -> dict[str, str]:
        return {k: t.name for t in self.tenants for k in t.api_keys}


# ---- flags -----------------------------------------------------------------------------------------------------------
def parse_tenant(text: str) -> tuple[str, str, float | None]:
    """`NAME:KEY[:WEIGHT]` → (name, key, weight or None)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise ValueError(f"bad --tenant {text!r}: expected NAME:KEY or NAME:KEY:WEIGHT")
    weight = None
    if len(parts) == 3:
        try:
            weight = float(parts[2])
        except ValueError:
            raise ValueError(f"bad --tenant {text!r}: weight {parts[2]!r} is not a number") from None
    return parts[0], parts[1], weight


def tenants_from_flags(flags: list[str]) -> list[dict[str, Any]]:
    """Repeating a name adds keys to that tenant (`--tenant a:k1 --tenant a:k2:2`)."""
    tenants: dict[str, dict[str, Any]] = {}
    for text in flags:
        name, key, weight = parse_tenant(text)
        t = tenants.setdefault(name, {"name": name, "api_keys": []})
        t["api_keys"].append(key)
        if weight is not None:
            t["weight"] = weight
    return list(tenants.values())


# flag dest -> config key, for the flags of add_server_arguments
SERVER_SCALARS = {
    "w_p": "w_p",
    "w_q": "w_q",
    "admin_key": "admin_key",
    "max_body_bytes": "max_body_bytes",
    "client_timeout": "client_timeout_s",
    "drain_timeout": "drain_timeout_s",
    "metrics_key": "metrics_key",
}


def add_server_arguments(p: argparse.ArgumentParser) -> None:
    """The flags `fairserve gateway` and `fairserve serve` share: tenants, costs, admin key, body size, the client
    and drain timeouts, the /metrics key."""
    p.add_argument("--tenant", action="append", metavar="NAME:KEY[:WEIGHT]", help="a tenant and its API key; repeat")
    p.add_argument("--w-p", type=float, metavar="W", help="cost of a prompt token (default 1)")
    p.add_argument("--w-q", type=float, metavar="W", help="cost of an output token (default 2)")
    p.add_argument("--admin-key", metavar="KEY", help="Bearer key of the admin API (default: admin API off)")
    p.add_argument("--max-body-bytes", type=int, metavar="N", help="largest request body (default 4 MiB)")
    p.add_argument(
        "--client-timeout",
        type=float,
        metavar="S",
        help="a client's request headers, and its body, must each arrive within this (30)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        metavar="S",
        help="on SIGTERM, in-flight requests get this long, then end with an error (30)",
    )
    p.add_argument("--metrics-key", metavar="KEY", help="Bearer key /metrics requires (default: /metrics is open)")


# ---- auth ------------------------------------------------------------------------------------------------------------
def bearer(request: Request) -> str | None:
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and key else None


def same_key(given: str | None, secret: str | None) -> bool:
    """Whether `given` is `secret`, in time independent of where they differ (no key guessed byte by byte)."""
    if given is None or secret is None:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), secret.encode("utf-8", "surrogateescape"))


class AuthThrottle:
    """Repeated failed authentications (401) from one client address: after `limit` of them within `window_s`, every
    request from that address is refused (429 with Retry-After) until the window ends, whatever key it carries, so
    keys cannot be guessed at speed. `limit` 0: no throttling. At most `max_addresses` addresses are remembered (the
    oldest forgotten first). Behind a reverse proxy the address is the one it forwards (uvicorn's proxy headers)."""

    def __init__(self, limit: int, window_s: float, max_addresses: int = 100_000, clock: Any = time.monotonic) -> None:
        self.limit, self.window_s, self.max_addresses, self.clock = limit, window_s, max_addresses, clock
        self._failures: dict[str, tuple[float, int]] = {}  # address -> (window start, failures in it)

    def blocked(self, address: str | None) -> float:
        """Seconds until `address` may try again; 0 if it may now."""
        entry = self._failures.get(address or "") if self.limit else None
        if entry is None or entry[1] < self.limit:
            return 0.0
        left = entry[0] + self.window_s - self.clock()
        if left <= 0:
            del self._failures[address or ""]
            return 0.0
        return left

    def failed(self, address: str | None) -> None:
        if not self.limit:
            return
        key, now = address or "", self.clock()
        start, count = self._failures.pop(key, (now, 0))
        if now - start >= self.window_s:
            start, count = now, 0
        self._failures[key] = (start, count + 1)  # NOTE: re-inserted last: the dict's order is by last failure
        if len(self._failures) > self.max_addresses:
            del self._failures[next(iter(self._failures))]

    def refusal(self, seconds: float) -> Response:
        return error_response(
            429,
            f"too many failed authentications from this address; try again in {math.ceil(seconds)} s",
            code="auth_throttled",
            headers={"Retry-After": str(math.ceil(seconds))},
        )


def metrics_denied(request: Request, metrics_key: str | None) -> Response | None:
    """The 401 for `/metrics` when `metrics_key` is set and the request does not carry it as Bearer, else None."""
    if metrics_key is None or same_key(bearer(request), metrics_key):
        return None
    return error_response(
        401,
        "/metrics needs 'Authorization: Bearer METRICS_KEY'",
        code="invalid_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


# ---- the admin API ---------------------------------------------------------------------------------------------------
class Accounts(Protocol):
    """What owns a ledger and lets the admin API read and change it."""

    def view(self) -> LedgerView: ...

    def set_weight(self, tenant: str, weight: float) -> None: ...

    def reset(self) -> None: ...


MAX_OWNER_KEYS = 1000  # keys one `POST /admin/owners` may ask about

# NOTE: the page is static and loads only its own files; the data comes by fetch() with the admin key
_PAGE_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "cache-control": "no-cache",
    "referrer-policy": "no-referrer",
}
_ASSETS = {
    "": ("index.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript"),
    "/dashboard.css": ("dashboard.css", "text/css"),
    "/favicon.svg": ("favicon.svg", "image/svg+xml"),
}


def admin_denied(request: Request, admin_key: str | None, tenant_keys: dict[str, str]) -> Response | None:
    """None if `request` carries the admin key as Bearer; else the 401/403 to answer."""
    key = bearer(request)
    admin = same_key(key, admin_key)
    if key is None or (not admin and key not in tenant_keys):
        return error_response(401, "the admin API needs 'Authorization: Bearer ADMIN_KEY'", code="invalid_key")
    if admin_key is None:
        return error_response(403, "the admin API is disabled: no admin_key is configured", code="admin_disabled")
    if not admin:
        return error_response(403, "a tenant's key may not use the admin API", code="not_admin")
    return None


def admin_router(
    accounts: Accounts,
    tenants: list[str],
    admin_key: str | None,
    tenant_keys: dict[str, str],
    backends: BackendRows | None = None,
) -> APIRouter:
    """GET /admin/tenants, PUT /admin/tenants/{name}/weight, POST /admin/reset, POST /admin/owners (which tenant owns
    each of some API keys) and GET /admin/dashboard (the dashboard's data): only the admin key (as Bearer) gets in.
    Rows for the configured `tenants` only (bounded, and no tenant appears that nobody configured). Also the
    dashboard page, GET /dashboard, which holds no data. `backends`: the gateway's backend rows, for the dashboard."""
    router = APIRouter(prefix="/admin")
    known = set(tenants)
    history = History()

    def denied(request: Request) -> Response | None:
        return admin_denied(request, admin_key, tenant_keys)

    def rows(view: LedgerView) -> list[dict[str, Any]]:
        return [view.tenants[t].row() for t in tenants if t in view.tenants]

    @router.get("/tenants")
    async def list_tenants(request: Request) -> Response:
        if (bad := denied(request)) is not None:
            return bad
        view = accounts.view()
        return JSONResponse({"policy": view.policy, "tenants": rows(view)})

    @router.put("/tenants/{name}/weight")
    async def set_weight(name: str, request: Request) -> Response:
        if (bad := denied(request)) is not None:
            return bad
        if name not in known:
            return error_response(404, f"no tenant named {name!r}", code="unknown_tenant")
        try:
            weight = check_weight(name, json.loads(await request.body())["weight"])
        except (ValueError, TypeError, KeyError, RecursionError):
            return error_response(
                400,
                f'expected a JSON body {{"weight": W}} with W from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}',
                code="invalid_weight",
                param="weight",
            )
        try:
            accounts.set_weight(name, weight)
        except Unsupported as e:
            return error_response(409, str(e), code="unsupported")
        return JSONResponse(accounts.view().tenants[name].row())

    @router.post("/reset")
    async def reset(request: Request) -> Response:
        if (bad := denied(request)) is not None:
            return bad
        try:
            accounts.reset()
        except Unsupported as e:
            return error_response(409, str(e), code="unsupported")
        return JSONResponse({"reset": True, "policy": accounts.view().policy})

    @router.post("/owners")
    async def owners(request: Request) -> Response:
        if (bad := denied(request)) is not None:
            return bad
        try:
            keys = json.loads(await request.body())["keys"]
            if not isinstance(keys, list) or len(keys) > MAX_OWNER_KEYS or not all(isinstance(k, str) for k in keys):
                raise TypeError
        except (ValueError, TypeError, KeyError, RecursionError):
            return error_response(
                400,
                f'expected a JSON body {{"keys": [KEY, ...]}} with at most {MAX_OWNER_KEYS} keys',
                code="invalid_keys",
                param="keys",
            )
        return JSONResponse({"owners": {k: tenant_keys.get(k) for k in keys}})

    @router.get("/dashboard")
    async def dashboard_data(request: Request) -> Response:
        if (bad := denied(request)) is not None:
            return bad
        return JSONResponse(
            snapshot(accounts.view(), tenants, history, backends), headers={"cache-control": "no-store"}
        )

    page = APIRouter()
    for suffix, (name, media_type) in _ASSETS.items():
        body = asset(name)
        page.add_api_route("/dashboard" + suffix, _static(body, media_type), methods=["GET"])
    page.include_router(router)
    return page


def _static(body: bytes, media_type: str):  # noqa: ANN202
    async def get() -> Response:
        return Response(body, media_type=media_type, headers=_PAGE_HEADERS)

    return get


# ---- Prometheus ------------------------------------------------------------------------------------------------------
# (TenantView field, family name, type, help): the per-tenant live values every server in front of a ledger exports
TENANT_FAMILIES = (
    (
        "service",
        "service",
        "counter",
        "Service charged by the policy: w_p*prompt + w_q*output (live; reconciliation may correct it slightly)",
    ),
    ("counter", "counter", "gauge", "The policy's virtual counter (service / weight, lifted)"),
    ("queued", "queue_length", "gauge", "Queued requests"),
    ("running", "tenant_inflight_requests", "gauge", "Requests being served"),
    ("weight", "tenant_weight", "gauge", "Tenant weight"),
)
SPREAD_HELP = "Max minus min counter among backlogged tenants"
JAIN_HELP = "Jain's index of weighted service among backlogged tenants"
METRICS_WINDOW_S = 900.0  # a tenant's series stay this long after its last request


class TenantActivity:
    """Which tenants have Prometheus series: those with requests queued or running, and those that sent or ended one
    in the last `window_s` seconds. The others leave the exposition (their counts are kept and come back with them),
    so a scrape's size follows the tenants in use, not the tenants configured. Every per-tenant series follows this
    rule."""

    def __init__(self, window_s: float = METRICS_WINDOW_S, clock: Any = time.monotonic) -> None:
        self.window_s, self.clock = window_s, clock
        self._seen: dict[str, float] = {}  # tenant -> when it last sent or ended a request

    def saw(self, tenant: str) -> None:
        self._seen[tenant] = self.clock()

    def active(self, busy: Any) -> list[str]:
        """The tenants with series now, in first-seen order; `busy(tenant)`: whether it has requests queued or
        running. O(tenants seen in the window)."""
        cutoff = self.clock() - self.window_s
        out, idle = [], []
        for tenant, at in self._seen.items():
            if at >= cutoff or busy(tenant):
                out.append(tenant)
            else:
                idle.append(tenant)
        for tenant in idle:  # NOTE: forgotten until its next request: the scan stays O(active)
            del self._seen[tenant]
        return out


class TenantCollector:
    """Per-tenant service, counter, queue, in-flight requests and weight, plus the backlogged counter spread and
    Jain's index, read from the ledger at scrape time. Labels: the configured tenants only (with `activity`, only
    those it names active)."""

    def __init__(
        self, accounts: Accounts, tenants: list[str], prefix: str, activity: TenantActivity | None = None
    ) -> None:
        self.accounts, self.tenants, self.prefix, self.activity = accounts, tenants, prefix, activity

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        view, p = self.accounts.view(), self.prefix
        families = {
            field: (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(p + name, text, labels=["tenant"])
            for field, name, kind, text in TENANT_FAMILIES
        }
        tenants = self.tenants
        if self.activity is not None:
            known = set(tenants)

            def busy(t: str) -> bool:
                row = view.tenants.get(t)
                return row is not None and bool(row.queued or row.running)

            tenants = [t for t in self.activity.active(busy) if t in known]
        for t in tenants:
            row = view.tenants.get(t)
            for field, family in families.items():
                family.add_metric([t], float(getattr(row, field)) if row is not None else 0.0)
        yield from families.values()
        yield GaugeMetricFamily(p + "backlogged_counter_spread", SPREAD_HELP, value=view.counter_spread)
        yield GaugeMetricFamily(p + "jain_index", JAIN_HELP, value=view.jain)
