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
from radixrt.runtime.server.http.responses import JSONResp

logger = logging.getLogger("radixrt.server")


class ApiError(Exception):
    """An error answered with an OpenAI-style body. ``status`` 400 unless said otherwise; ``headers`` are
    added to the response (``Retry-After`` of a 503)."""

    def __init__(
        self,
        message: str,
        param: Optional[str] = None,
        status: int = 400,
        type: str = "invalid_request_error",
        code: Optional[str] = None,
        headers: Optional[dict] = None,
    ):
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type, code
        self.headers = headers

    def body(self) -> dict:
        return error_body(self.message, self.param, self.type, self.code)


def error_body(
    message: str, param: Optional[str] = None, type: str = "invalid_request_error", code: Optional[str] = None
) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


_TYPE_NAMES = ("str", "int", "float", "bool")


def _is_member(p, out: str) -> bool:
    # pydantic reports a failed union member by its type ("str", "list[int]"): not a field name
    return bool(out) and isinstance(p, str) and (p in _TYPE_NAMES or "[" in p or "function" in p)


def _split(loc) -> tuple[str, Optional[str], str]:
    """``(field path, union member, path inside the member)`` of a pydantic error location, e.g.
    ``("body", "prompt", "list[int]", 0)`` -> ``("prompt", "list[int]", "[0]")``; member None when the location
    passes through no union member (further members inside it are dropped too)."""
    out, member, inner = "", None, ""
    for p in loc:
        if p == "body" or (member is not None and _is_member(p, out)):
            continue
        if member is not None:
            inner += f"[{p}]" if isinstance(p, int) else f".{p}"
        elif _is_member(p, out):
            member = p
        else:
            out += f"[{p}]" if isinstance(p, int) else ("." if out else "") + str(p)
    return out, member, inner


def loc_param(loc) -> Optional[str]:
    """A pydantic error location as a field path: ``("body", "messages", 0, "role")`` -> ``messages[0].role``."""
    out, _, inner = _split(loc)
    return (out + inner) or None


def _union_message(errs: list) -> Optional[str]:
    """For a field whose every union member failed (``prompt: [1.5, 2]``): the types it may have, and the
    failure inside the member it came closest to (the deepest error, then the member with the fewest)."""
    field, member, _ = _split(errs[0].get("loc", ()))
    if member is None:
        return None
    by_member: dict[str, list] = {}
    for e in errs:
        f, m, inner = _split(e.get("loc", ()))
        if f == field and m is not None:
            by_member.setdefault(m, []).append((inner, e.get("msg", "")))
    msg = f"{field}: must be one of {', '.join(by_member)}"
    best = max(by_member, key=lambda m: (max(len(i) for i, _ in by_member[m]), -len(by_member[m])))
    inner, why = max(by_member[best], key=lambda x: len(x[0]))
    return f"{msg}; as {best}, {inner.lstrip('.')}: {why}" if inner else msg


def validation_error(errs: list) -> ApiError:
    """A pydantic / FastAPI validation error list as a 400 naming the first bad field."""
    first = errs[0] if errs else {"loc": (), "msg": "invalid request"}
    param = loc_param(first.get("loc", ()))
    msg = first.get("msg", "invalid request")
    if first.get("type") == "json_invalid":
        return ApiError(f"the request body is not valid JSON: {first.get('ctx', {}).get('error', msg)}")
    union = _union_message(errs) if param else None
    return ApiError(union or (f"{param}: {msg}" if param else msg), param=param)


def from_validation(e: ValueError) -> ApiError:
    """A 400 for a ValueError of the runtime's validation; ``param`` from a :class:`ValidationError`."""
    return ApiError(str(e), param=e.param if isinstance(e, ValidationError) else None)


ANTHROPIC_PATHS = ("/v1/messages",)  # routes that answer errors in Anthropic's shape
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_body(status: int, body: dict) -> dict:
    """An OpenAI error body in Anthropic's shape ``{"type": "error", "error": {"type", "message"}}``; the
    message starts with the field at fault (Anthropic's body has no ``param``)."""
    e = body.get("error", {})
    msg, param = e.get("message", ""), e.get("param")
    if param and not msg.startswith(param):
        msg = f"{param}: {msg}"
    return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": msg}}


def error_response(path: str, body: dict, status: int, headers: Optional[dict] = None) -> JSONResp:
    """The error answer of route ``path``: OpenAI's shape, or Anthropic's on :data:`ANTHROPIC_PATHS`."""
    if path.startswith(ANTHROPIC_PATHS):
        body = anthropic_body(status, body)
    return JSONResp(body, status_code=status, headers=headers)


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        return error_response(request.url.path, e.body(), e.status, e.headers)

    @app.exception_handler(ValidationError)
    async def _input_error(request: Request, e: ValidationError):
        err = from_validation(e)
        return error_response(request.url.path, err.body(), err.status)

    @app.exception_handler(RequestValidationError)
    async def _request_error(request: Request, e: RequestValidationError):
        err = validation_error(e.errors())
        return error_response(request.url.path, err.body(), err.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        typ = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return error_response(request.url.path, error_body(str(e.detail), None, typ), e.status_code)

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(request: Request, e: ClientDisconnect):  # left mid-body: nobody to answer
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        logger.exception("internal error on %s", request.url.path)
        return error_response(
            request.url.path, error_body(f"internal error: {type(e).__name__}: {e}", None, "internal_error"), 500
        )
