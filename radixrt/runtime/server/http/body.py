"""Reading a request body: JSON whatever the content type, then a pydantic model (errors name the field)."""

from __future__ import annotations

import json
import math
from typing import Any, Callable, TypeVar

import msgspec
from fastapi import Request
from pydantic import BaseModel, ValidationError as PydanticValidationError

from radixrt.runtime.server.http.errors import ApiError, validation_error

M = TypeVar("M", bound=BaseModel)


async def body_json(request: Request) -> Any:
    """The request body as JSON whatever its content type ({} when empty). Raises ApiError 400."""
    raw = await request.body()
    try:
        return msgspec.json.decode(raw) if raw else {}
    except msgspec.DecodeError as e:
        raise ApiError(f"the request body is not valid JSON: {_why(raw, e)}") from None
    except RecursionError:  # msgspec refuses deep nesting this way, not with a DecodeError
        raise ApiError("the request body is nested too deeply") from None


async def parse_model(request: Request, model_cls: type[M], check: Callable[[dict], None]) -> M:
    """The JSON body as ``model_cls``, after ``check(body)`` (which raises ApiError for a refused field).

    Raises:
        ApiError: 400: not JSON, not an object, what ``check`` refuses, or a pydantic error (``param`` names
            the first bad field).
    """
    body = await body_json(request)
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    check(body)
    try:
        return model_cls.model_validate(body)
    except PydanticValidationError as e:
        raise validation_error(e.errors()) from None


def _why(raw: bytes, e: msgspec.DecodeError) -> str:
    """msgspec reports a lone UTF-16 surrogate escape (``"\\ud800"``, no Unicode character: it cannot be
    encoded for the tokenizer) as "Input data was truncated"; say what it is, and what a body that is not
    UTF-8 is (a byte-order mark, UTF-16/32). Only on the error path."""
    try:  # a byte-order mark or UTF-16/32: Python's json decodes them itself, so it would pass below
        raw.decode("utf-8")
        if b"\x00" in raw:  # UTF-16/32 without a mark (a raw NUL is never valid JSON)
            raise UnicodeDecodeError("utf-8", raw, 0, 1, "NUL byte")
    except UnicodeDecodeError:
        return "the body is not UTF-8 (JSON bodies are UTF-8, without a byte-order mark)"
    if raw.startswith(b"\xef\xbb\xbf"):
        return "the body starts with a UTF-8 byte-order mark, which JSON does not allow"
    try:  # Python's json takes NaN/Infinity and overflows 1e400 to inf; JSON (and msgspec) does not
        json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError):
        return str(e)
    return "it holds a lone UTF-16 surrogate escape (\\ud800-\\udfff), which is not a Unicode character"


def _no_constant(name: str):
    raise ValueError(name)


def _finite(text: str) -> float:
    x = float(text)
    if math.isinf(x):
        raise ValueError(text)
    return x
