"""OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    504: "timeout_error",
}


def error_type(status: int) -> str:
    """The OpenAI error type of a status: its own where it has one, else any 4xx is the client's
    (`invalid_request_error`: 405, 408, 409, 413, 431, ...) and any 5xx the server's."""
    return TYPES.get(status) or ("invalid_request_error" if status < 500 else "server_error")


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


def error_response(
    status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None, param: str | None = None
) -> JSONResponse:
    return JSONResponse(error_body(status, message, code, param), status_code=status, headers=headers)
