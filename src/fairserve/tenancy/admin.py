"""The admin API and the live dashboard: every tenant's row, live weights and resets, through whatever owns the ledger
(`Accounts`: the gateway's scheduler, an engine's queue)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..api.errors import error_response
from ..core import MAX_WEIGHT, MIN_WEIGHT, LedgerView, Unsupported, check_weight
from ..core.account import nodes_of
from ..dashboard import BackendRows, History, asset, snapshot, tree
from .auth import bearer, same_key
from .index import KeyOwners

Owners = KeyOwners | dict[str, str]


class Accounts(Protocol):
    """What owns a ledger and lets the admin API read and change it."""

    def view(self) -> LedgerView: ...

    def set_weight(self, tenant: str, weight: float) -> None: ...

    def reset(self) -> None: ...


class Quotas(Protocol):
    """Quota use to show (the gateway's `QuotaGate`)."""

    async def status(self, path: str) -> dict[str, Any]: ...

    async def all_status(self) -> dict[str, Any]: ...


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


def admin_denied(request: Request, admin_key: str | None, tenant_keys: Owners) -> Response | None:
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
    tenant_keys: Owners,
    backends: BackendRows | None = None,
    quotas: Quotas | None = None,
    keys: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    rate_caps: Callable[[], Awaitable[dict[str, Any] | None]] | None = None,
) -> APIRouter:
    """GET /admin/tenants, GET /admin/tree (every node of the tenant tree), PUT /admin/tenants/{path}/weight and
    PUT /admin/nodes/{path}/weight (any tenant or group), POST /admin/reset, POST /admin/owners (which tenant owns
    each of some API keys) and GET /admin/dashboard (the dashboard's data): only the admin key (as Bearer) gets in.
    Rows for the configured `tenants` and their groups only (bounded, and no tenant appears that nobody configured).
    Also the dashboard page, GET /dashboard, which holds no data. `backends`: the gateway's backend rows, for the
    dashboard. `quotas`: each row then has its node's `quota` (used, held, remaining, resets_at per measure), and
    GET /admin/quotas lists every node's. `keys`: the keys made through the API (`GET /admin/keys`'s answer), and
    `rate_caps`: the per-minute caps' use (`GET /admin/rates`'s, None without caps), for the dashboard."""
    router = APIRouter(prefix="/admin")
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
        out = rows(view)
        if quotas is not None:
            for row in out:
                if status := await quotas.status(row["name"]):
                    row["quota"] = status
        return JSONResponse({"policy": view.policy, "tenants": out})

    @router.get("/quotas")
    async def list_quotas(request: Request) -> Response:
        if (bad := denied(request)) is not None:
            return bad
        if quotas is None:
            return JSONResponse({"enforced": False, "estimated": False, "quotas": {}})
        return JSONResponse(await quotas.all_status())

    @router.get("/tree")
    async def get_tree(request: Request) -> Response:
        if (bad := denied(request)) is not None:
            return bad
        view = accounts.view()
        return JSONResponse({"policy": view.policy, "tree": tree(view, tenants)})

    async def reweight(name: str, request: Request, what: str) -> Response:
        if (bad := denied(request)) is not None:
            return bad
        # NOTE: read from `tenants` each time: a live reload changes that list in place
        if name not in (set(tenants) if what == "tenant" else nodes_of(tenants)):
            return error_response(404, f"no {what} named {name!r}", code=f"unknown_{what}")
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
        view = accounts.view()
        row = (view.tenants.get(name) or view.groups[name]).row()
        if quotas is not None and (status := await quotas.status(name)):
            row["quota"] = status
        return JSONResponse(row)

    @router.put("/tenants/{name:path}/weight")
    async def set_weight(name: str, request: Request) -> Response:
        return await reweight(name, request, "tenant")

    @router.put("/nodes/{name:path}/weight")
    async def set_node_weight(name: str, request: Request) -> Response:
        return await reweight(name, request, "node")

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
        data = snapshot(accounts.view(), tenants, history, backends)
        data["quotas"] = await quotas.all_status() if quotas is not None else None
        data["keys"] = await keys() if keys is not None else None
        data["rate_caps"] = await rate_caps() if rate_caps is not None else None
        return JSONResponse(data, headers={"cache-control": "no-store"})

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
