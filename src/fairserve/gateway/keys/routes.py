"""The admin routes of the keys made through the API (`POST /admin/keys`, `GET /admin/keys`, `DELETE
/admin/keys/{id}`, the admin key only) and their OpenAPI description (gateway/http/openapi.py merges it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...api.errors import error_response
from .book import Refused
from .gate import ApiKeys
from .tenants import TENANT_FIELDS

MAX_BODY = 4096  # bytes of a create's body


def keys_router(keys: ApiKeys, denied: Callable[[Request], Response | None]) -> APIRouter:
    """The three routes; `denied`: the admin API's guard (None: the request carries the admin key)."""
    router = APIRouter(prefix="/admin/keys")

    def refused(e: Refused) -> Response:
        return error_response(e.status, e.message, code=e.code, param=e.param)

    @router.post("")
    async def create(request: Request) -> Response:
        if (bad := denied(request)) is not None:
            return bad
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY:
                return error_response(413, f"a key's request body is at most {MAX_BODY} bytes", code="body_too_large")
        try:
            return JSONResponse(await keys.create(body), status_code=201, headers={"cache-control": "no-store"})
        except Refused as e:
            return refused(e)

    @router.get("")
    async def list_keys(request: Request) -> Response:
        if (bad := denied(request)) is not None:
            return bad
        return JSONResponse(await keys.all_rows(), headers={"cache-control": "no-store"})

    @router.delete("/{key_id}")
    async def revoke(key_id: str, request: Request) -> Response:
        if (bad := denied(request)) is not None:
            return bad
        try:
            return JSONResponse(await keys.revoke(key_id))
        except Refused as e:
            return refused(e)

    return router


def key_paths(errors: Callable[..., dict[str, Any]], json: Callable[[dict[str, Any], str], dict[str, Any]]) -> dict:
    """The routes' OpenAPI paths (`errors(*statuses)` and `json(schema, description)`: openapi.py's)."""
    admin: list[dict[str, list[str]]] = [{"bearer": []}]
    text = {"type": "string", "nullable": True}
    budget = {
        "type": "object",
        "description": "the key's own quota, beside its tenant's: as a tenant's `quota`",
        "required": ["per"],
        "properties": {
            "per": {"type": "string", "enum": ["hour", "day", "month"]},
            "tokens": {"type": "integer", "minimum": 1},
            "service": {"type": "number", "exclusiveMinimum": True, "minimum": 0},
        },
    }
    row_fields = ["id", "name", "prefix", "tenant", "created_at", "expires_at", "last_used_at", "expired"]
    row_props: dict[str, Any] = {
        "id": {"type": "string"},
        "name": text,
        "prefix": {"type": "string"},
        "tenant": {"type": "string"},
        "created_at": {"type": "string"},
        "expires_at": text,
        "last_used_at": text,
        "expired": {"type": "boolean"},
        "orphaned": {"type": "boolean"},
        "budget": {**budget, "nullable": True},
    }
    row = {"type": "object", "required": row_fields, "properties": row_props}
    made = {**row, "required": ["key", *row_fields], "properties": {"key": {"type": "string"}, **row_props}}
    body = {
        "type": "object",
        "required": ["tenant"],
        "properties": {
            "tenant": {"type": "string", "minLength": 1},
            "name": {"type": "string", "maxLength": 200},
            "expires_at": {"type": "string", "description": "ISO 8601, UTC unless it says (e.g. 2027-01-31T00:00:00Z)"},
            "expires_in_s": {"type": "number", "exclusiveMinimum": True, "minimum": 0},
            "budget": budget,
            "new_tenant": {
                "type": "object",
                "description": "make the tenant with the key: a config file's tenant table less its keys ({}: "
                "weight 1); it goes with its last key",
                "properties": {f: {} for f in TENANT_FIELDS},
                "additionalProperties": False,
            },
        },
    }
    made_tenant = {
        "type": "object",
        "required": ["name", "keys"],
        "properties": {"name": {"type": "string"}, "keys": {"type": "integer"}, **{f: {} for f in TENANT_FIELDS}},
    }
    listing = {
        "type": "object",
        "required": ["store", "keys", "tenants"],
        "properties": {
            "store": {"type": "string", "nullable": True},
            "keys": {"type": "array", "items": row},
            "tenants": {"type": "array", "items": made_tenant},
        },
    }
    return {
        "/admin/keys": {
            "post": {
                "summary": "Make a key for a tenant (`new_tenant`: the tenant too): the answer holds the key, "
                "once (stored hashed)",
                "security": admin,
                "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
                "responses": {
                    "201": json(made, "the new key and its record"),
                    **errors(400, 401, 403, 404, 409, 413, 429, 503),
                },
            },
            "get": {
                "summary": "The keys made through the API (names, prefixes, tenants, expiry, last use; never a "
                "key) and the tenants it made",
                "security": admin,
                "responses": {"200": json(listing, "the keys"), **errors(401, 403, 429)},
            },
        },
        "/admin/keys/{id}": {
            "delete": {
                "summary": "Revoke a key made through the API: refused at once here, on every replica within a second",
                "security": admin,
                "parameters": [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {
                    "200": json(
                        {
                            "type": "object",
                            "required": ["id", "revoked"],
                            "properties": {"id": {"type": "string"}, "revoked": {"type": "boolean"}},
                        },
                        "revoked",
                    ),
                    **errors(401, 403, 404, 409, 429, 503),
                },
            },
        },
    }
