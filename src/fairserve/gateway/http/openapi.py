"""The OpenAPI description of the gateway's endpoints, served at `/openapi.json`: what each accepts and every status
it may answer with (the schemathesis run in tests/test_openapi.py holds the gateway to it)."""

from __future__ import annotations

from typing import Any

from ...api.protocol import MAX_INT
from ...core import MAX_WEIGHT, MIN_WEIGHT
from ..keys.routes import key_paths
from ..settings.config import GatewayConfig

_ERROR = {"$ref": "#/components/schemas/Error"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _object(properties: dict[str, Any], description: str) -> dict[str, Any]:
    """A 200 whose JSON object has every one of `properties`."""
    return _json({"type": "object", "required": list(properties), "properties": properties}, description)


def _errors(*statuses: int) -> dict[str, Any]:
    what = {
        400: "invalid request",
        401: "missing or unknown key",
        403: "not allowed with this key (the admin API; a model the tenant may not use)",
        404: "unknown tenant or key id, or no backend serves the model",
        408: "the request body did not arrive in time",
        409: "not supported by the policy, or nowhere to keep the API's keys",
        413: "body too large",
        429: "queue full, rate limited, or too many failed authentications from this address or with this key",
        502: "no backend could serve it",
        503: "waited queue_ttl_s without a free backend, the backend is busy (Retry-After), shutting down, or the "
        "store of the API's keys did not answer",
        504: "no backend answered in time",
    }
    return {str(s): _json(_ERROR, what[s]) for s in statuses}


def _completion(chat: bool) -> dict[str, Any]:
    integer = {"type": "integer", "minimum": 1, "maximum": MAX_INT}
    props: dict[str, Any] = {
        "model": {"type": "string", "minLength": 1},
        "max_tokens": integer,
        "n": {"type": "integer", "minimum": 1, "maximum": MAX_INT},
        "stream": {"type": "boolean"},
        "priority": {
            "type": "integer",
            "minimum": -MAX_INT,
            "maximum": MAX_INT,
            "description": "vLLM's priority (lower first): one its tenant may name, else 400",
        },
    }
    if chat:
        props["messages"] = {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role", "content"],
                "properties": {
                    "role": {"type": "string", "enum": ["system", "user", "assistant"]},
                    "content": {"type": "string"},
                },
            },
        }
        props["max_completion_tokens"] = integer
        required = ["model", "messages"]
    else:
        props["prompt"] = {
            "oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "maxItems": 4, "items": {"type": "string"}}]
        }
        required = ["model", "prompt"]
    answer = {"type": "object", "required": ["choices"], "properties": {"choices": {"type": "array"}}}
    return {
        "summary": "Chat completion" if chat else "Completion",
        "security": [{"bearer": []}],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"type": "object", "required": required, "properties": props}}},
        },
        "responses": {
            "200": {
                "description": "the backend's answer (a stream of server-sent events with stream: true)",
                "content": {
                    "application/json": {"schema": answer},
                    "text/event-stream": {"schema": {"type": "object", "properties": {"data": {"type": "string"}}}},
                },
            },
            **_errors(400, 401, 403, 404, 408, 413, 429, 502, 503, 504),
        },
    }


def _more(summary: str, required: list[str], props: dict[str, Any], queued: bool = True) -> dict[str, Any]:
    """An endpoint beside the completions (embeddings, responses, tokenize): what it needs, and the backend's answer
    passed through (any JSON, any status the backend chose: an unknown model's 404, say)."""
    passed = {"description": "the backend's answer, as it gave it", "content": {"application/json": {"schema": {}}}}
    # NOTE: a 404 is the gateway's (no backend serves the model) or the backend's own, passed through: `default`
    errors = (400, 401, 403, 408, 413, 429, 502, 503, *((504,) if queued else ()))
    return {
        "summary": summary,
        "security": [{"bearer": []}],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"type": "object", "required": required, "properties": props}}},
        },
        "responses": {
            "200": {
                "description": "the backend's answer (server-sent events for a streamed response)",
                "content": {"application/json": {"schema": {}}, "text/event-stream": {"schema": {}}},
            },
            **_errors(*errors),
            "default": passed,
        },
    }


def openapi(cfg: GatewayConfig) -> dict[str, Any]:
    row = {
        "type": "object",
        "required": ["name", "weight", "counter", "service", "queue_length", "in_flight"],
        "properties": {
            "name": {"type": "string"},
            "weight": {"type": "number"},
            "counter": {"type": "number"},
            "service": {"type": "number"},
            "priority": {"type": "integer"},
            "queue_length": {"type": "integer"},
            "in_flight": {"type": "integer"},
        },
    }
    health = {
        "type": "object",
        "required": ["status", "policy", "queued", "backends"],
        "properties": {
            "status": {"type": "string", "enum": ["ok", "unavailable"]},
            "reason": {"type": "string"},
            "policy": {"type": "string"},
            "queued": {"type": "integer"},
            "backends": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["url", "healthy"],
                    "properties": {"url": {"type": "string"}, "healthy": {"type": "boolean"}},
                },
            },
        },
    }
    health_op = {
        "summary": "Health for load balancers: 503 while no backend is healthy",
        "responses": {
            "200": _json(health, "some backend is healthy"),
            "503": _json(health, "no backend is healthy (`reason` says why)"),
        },
    }
    admin: list[dict[str, list[str]]] = [{"bearer": []}]
    weight_body = {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["weight"],
                    "properties": {"weight": {"type": "number", "minimum": MIN_WEIGHT, "maximum": MAX_WEIGHT}},
                }
            }
        },
    }
    metrics_responses: dict[str, Any] = {
        "200": {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}
    }
    if cfg.metrics_key is not None:
        metrics_responses.update(_errors(401, 429))
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "fairserve gateway",
            "version": "1",
            "description": "A fair OpenAI-compatible gateway (see docs/gateway.md).",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["message", "type"],
                            "properties": {
                                "message": {"type": "string"},
                                "type": {"type": "string"},
                                "param": {"type": "string", "nullable": True},
                                "code": {"type": "string", "nullable": True},
                            },
                        }
                    },
                }
            },
        },
        "paths": {
            "/v1/chat/completions": {"post": _completion(True)},
            "/v1/completions": {"post": _completion(False)},
            "/v1/embeddings": {
                "post": _more(
                    "Embeddings (queued and charged w_p x the input tokens)",
                    ["model", "input"],
                    {
                        "model": {"type": "string", "minLength": 1},
                        "input": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
                        "encoding_format": {"type": "string", "enum": ["float", "base64"]},
                    },
                )
            },
            "/v1/responses": {
                "post": _more(
                    "Responses (queued and charged as a completion; previous_response_id and background: 400)",
                    ["model", "input"],
                    {
                        "model": {"type": "string", "minLength": 1},
                        "input": {"type": "string"},
                        "max_output_tokens": {"type": "integer", "minimum": 1, "maximum": MAX_INT},
                        "stream": {"type": "boolean"},
                    },
                )
            },
            **{
                path: {
                    "post": _more(
                        f"vLLM's {path}: sent to a backend of the model, not queued or charged",
                        [],
                        {"model": {"type": "string"}},
                        queued=False,
                    )
                }
                for path in ("/tokenize", "/detokenize")
            },
            "/v1/models": {
                "get": {
                    "summary": "Models",
                    "security": [{"bearer": []}],
                    "responses": {
                        "200": _json(
                            {"type": "object", "required": ["data"], "properties": {"data": {"type": "array"}}},
                            "the union of the backends' models (else the first healthy backend's list, else the "
                            "configured `models`)",
                        ),
                        **_errors(401, 429),
                    },
                }
            },
            "/healthz": {"get": health_op},
            "/health": {"get": health_op},
            "/livez": {
                "get": {
                    "summary": "Liveness: 200 while the process answers, whatever the backends' state",
                    "responses": {"200": _json({"type": "object", "required": ["status"]}, "the process is alive")},
                }
            },
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": metrics_responses}},
            "/admin/tenants": {
                "get": {
                    "summary": "Every tenant's account",
                    "security": admin,
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["policy", "tenants"],
                                "properties": {
                                    "policy": {"type": "string"},
                                    "tenants": {"type": "array", "items": row},
                                },
                            },
                            "the accounts",
                        ),
                        **_errors(401, 403, 429),
                    },
                }
            },
            "/admin/tree": {
                "get": {
                    "summary": "The tenant tree: every group and tenant with its weight, priority, service, counter, "
                    "queued and in flight, members nested under their groups",
                    "security": admin,
                    "responses": {
                        "200": _object({"policy": {"type": "string"}, "tree": {"type": "array"}}, "the tree"),
                        **_errors(401, 403, 429),
                    },
                }
            },
            "/admin/nodes/{path}/weight": {
                "put": {
                    "summary": "Change the weight of a tenant or a group of the tenant tree (its path, e.g. pro/acme)",
                    "security": admin,
                    "parameters": [{"name": "path", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "requestBody": weight_body,
                    "responses": {"200": _json(row, "the node's account"), **_errors(400, 401, 403, 404, 409, 429)},
                }
            },
            "/admin/tenants/{name}/weight": {
                "put": {
                    "summary": "Change a tenant's weight",
                    "security": admin,
                    "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "requestBody": weight_body,
                    "responses": {"200": _json(row, "the tenant's account"), **_errors(400, 401, 403, 404, 409, 429)},
                }
            },
            "/admin/reset": {
                "post": {
                    "summary": "Every counter back to 0",
                    "security": admin,
                    "responses": {
                        "200": _json(
                            {"type": "object", "required": ["reset"], "properties": {"reset": {"type": "boolean"}}},
                            "reset",
                        ),
                        **_errors(401, 403, 409, 429),
                    },
                }
            },
            "/admin/quotas": {
                "get": {
                    "summary": "Every quota's use in its current window: limit, used, held, remaining, resets_at",
                    "security": admin,
                    "responses": {
                        "200": _object(
                            {
                                "enforced": {"type": "boolean"},
                                "estimated": {"type": "boolean"},
                                "quotas": {"type": "object"},
                            },
                            "the quotas",
                        ),
                        **_errors(401, 403, 429),
                    },
                }
            },
            "/admin/rates": {
                "get": {
                    "summary": "Every rate cap's count in the current minute: limit, used, remaining, resets_at",
                    "security": admin,
                    "responses": {
                        "200": _object(
                            {
                                "enforced": {"type": "boolean"},
                                "estimated": {"type": "boolean"},
                                "per": {"type": "string"},
                                "rates": {"type": "object"},
                            },
                            "the rate caps",
                        ),
                        **_errors(401, 403, 429),
                    },
                }
            },
            **key_paths(_errors, _json),
            "/admin/reload": {
                "post": {
                    "summary": "Re-read the configuration (as SIGHUP): tenants, keys, weights, groups, model access, "
                    "quotas, rate caps, prices, timeouts, backends",
                    "security": admin,
                    "responses": {
                        "200": _object({"reloaded": {"type": "boolean"}, "message": {"type": "string"}}, "reloaded"),
                        **_errors(400, 401, 403, 409, 429),
                    },
                }
            },
            "/openapi.json": {
                "get": {"summary": "This description", "responses": {"200": _json({"type": "object"}, "OpenAPI 3")}}
            },
        },
    }
