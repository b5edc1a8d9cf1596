"""Every error of the HTTP API as an OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``.

- :class:`ApiError` (raised by routes): its own status, 400 unless said otherwise;
- :class:`ValidationError` (raised where user input is checked): 400 whose ``param`` is the error's;
- FastAPI / pydantic request validation: 400 naming the first bad field (``messages[0].role``);
- Starlette HTTP errors (404, 405): their status, ``not_found_error`` for a 404;
- anything else: 500 ``internal_error`` (logged with its traceback).
"""
from __future__ import annotations

import logging
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixrt.runtime.errors import ValidationError
from radixrt.runtime.server.openai_protocol import ApiError, error_body
from radixrt.runtime.server.responses import JSONResp

logger = logging.getLogger("radixrt.server")

_TYPE_NAMES = ("str", "int", "float", "bool")


def loc_param(loc) -> Optional[str]:
    """A pydantic error location as a field path: ``("body", "messages", 0, "role")`` -> ``messages[0].role``."""
    out = ""
    for p in loc:
        if p == "body":
            continue
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            # pydantic reports a failed union member by its type ("str", "list[int]"): not a field name
            if out and (p in _TYPE_NAMES or "[" in str(p) or "function" in str(p)):
                continue
            out += ("." if out else "") + str(p)
    return out or None


def validation_error(errs: list) -> ApiError:
    """A pydantic / FastAPI validation error list as a 400 naming the first bad field."""
    first = errs[0] if errs else {"loc": (), "msg": "invalid request"}
    param = loc_param(first.get("loc", ()))
    msg = first.get("msg", "invalid request")
    if first.get("type") == "json_invalid":
        return ApiError(f"the request body is not valid JSON: {first.get('ctx', {}).get('error', msg)}")
    return ApiError(f"{param}: {msg}" if param else msg, param=param)


def from_validation(e: ValueError) -> ApiError:
    """A 400 for a ValueError of the runtime's validation; ``param`` from a :class:`ValidationError`."""
    return ApiError(str(e), param=getattr(e, "param", None))


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        return JSONResp(e.body(), status_code=e.status)

    @app.exception_handler(ValidationError)
    async def _input_error(request: Request, e: ValidationError):
        err = from_validation(e)
        return JSONResp(err.body(), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def _request_error(request: Request, e: RequestValidationError):
        err = validation_error(e.errors())
        return JSONResp(err.body(), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        typ = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return JSONResp(error_body(str(e.detail), None, typ), status_code=e.status_code)

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(request: Request, e: ClientDisconnect):  # left mid-body: nobody to answer
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        logger.exception("internal error on %s", request.url.path)
        return JSONResp(error_body(f"internal error: {type(e).__name__}: {e}", None, "internal_error"),
                        status_code=500)
