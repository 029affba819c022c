"""One error shape for every server: FastAPI's own answers (an unknown path, a wrong method, a body that does not
validate), a `BadRequest`, an unexpected error and an unknown model all come back as OpenAI-style error bodies."""

from __future__ import annotations

import logging

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from .errors import error_response
from .protocol import BadRequest

log = logging.getLogger("fairserve")


def install(app: FastAPI, who: str) -> None:
    """Error handlers for `app`; `who` names the server in the message of an unexpected error."""

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        headers = dict(exc.headers) if exc.headers else None
        return error_response(exc.status_code, str(exc.detail), code=_code(exc.status_code), headers=headers)

    async def invalid(_: Request, exc: Exception) -> Response:
        errors = exc.errors() if isinstance(exc, RequestValidationError) else []
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"Invalid request: {first.get('msg', 'bad input')}" + (f" ({where})" if where else "")
        return error_response(400, message, param=where or None)

    async def bad_request(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, BadRequest)
        return error_response(400, exc.message, param=exc.param)

    async def server_error(request: Request, exc: Exception) -> Response:
        log.error("unexpected error on %s %s: %r", request.method, request.url.path, exc)
        return error_response(
            500, f"internal error in {who} ({type(exc).__name__}); see the server log", code="internal_error"
        )

    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(BadRequest, bad_request)
    app.add_exception_handler(Exception, server_error)


def _code(status: int) -> str | None:
    return {404: "not_found", 405: "method_not_allowed"}.get(status)


def unknown_model(model: str | None, served: list[str]) -> Response | None:
    """OpenAI's 404 `model_not_found` when a request names a model this server does not serve; None otherwise (a
    request that names none gets the served one)."""
    if model is None or model in served:
        return None
    return error_response(
        404,
        f"The model `{model}` does not exist. This server serves: {', '.join(served)}.",
        code="model_not_found",
        param="model",
    )
