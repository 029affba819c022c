"""The admin API: per-tenant accounts, live weights, counter reset. Only the admin key (as Bearer) gets in."""
from __future__ import annotations

import json
import math
from collections.abc import Callable

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..api.errors import error_response
from .scheduler import Scheduler


def admin_router(sched: Scheduler, bearer: Callable[[Request], str | None]) -> APIRouter:
    router = APIRouter(prefix="/admin")
    admin_key = sched.cfg.admin_key
    tenant_keys = sched.cfg.key_owners()

    def denied(request: Request) -> Response | None:
        key = bearer(request)
        if key is None or (key != admin_key and key not in tenant_keys):
            return error_response(401, "the admin API needs 'Authorization: Bearer ADMIN_KEY'", code="invalid_key")
        if admin_key is None:
            return error_response(403, "the admin API is disabled: no admin_key is configured", code="admin_disabled")
        if key != admin_key:
            return error_response(403, "a tenant's key may not use the admin API", code="not_admin")
        return None

    def tenant_row(name: str) -> dict[str, object]:
        p = sched.policy
        return {"name": name, "weight": p.weight(name), "counter": p.counters.get(name, 0.0),
                "service": p.service.get(name, 0.0), "queue_length": sched.queued[name],
                "in_flight": sched.in_flight[name]}

    @router.get("/tenants")
    async def tenants(request: Request) -> Response:
        if (bad := denied(request)) is not None:
            return bad
        return JSONResponse({"policy": sched.policy.name, "tenants": [tenant_row(t) for t in sched.tenants]})

    @router.put("/tenants/{name}/weight")
    async def set_weight(name: str, request: Request) -> Response:
        if (bad := denied(request)) is not None:
            return bad
        if name not in sched.queued:
            return error_response(404, f"no tenant named {name!r}", code="unknown_tenant")
        try:
            body = json.loads(await request.body())
            weight = body["weight"]
            ok = isinstance(weight, int | float) and not isinstance(weight, bool) and math.isfinite(weight) \
                and weight > 0
        except (ValueError, TypeError, KeyError, RecursionError):
            ok = False
        if not ok:
            return error_response(400, 'expected a JSON body {"weight": W} with W > 0', code="invalid_weight",
                                  param="weight")
        sched.set_weight(name, float(weight))
        return JSONResponse(tenant_row(name))

    @router.post("/reset")
    async def reset(request: Request) -> Response:
        if (bad := denied(request)) is not None:
            return bad
        return JSONResponse({"reset": sched.reset(), "policy": sched.policy.name})

    return router
