"""User input of agent sessions, checked where it enters (Engine, /generate, /open_session, OpenAI routes).

Field names are SGLang's: ``/open_session`` takes ``capacity_of_str_len``, ``session_id`` and ``timeout``;
``/generate`` takes ``session_params`` ``{id, rid, offset, replace, drop_previous_output}``. radixrt adds
``session_id`` on a request whose prompt already holds the history (OpenAI routes, the DSL).
"""

from __future__ import annotations

from typing import Any, Optional

from radixrt.runtime.errors import ValidationError
from radixrt.runtime.io_struct import OpenSessionReq, SessionParams

SESSION_PARAM_KEYS = ("id", "rid", "offset", "replace", "drop_previous_output")


def check_session_id(v: Any, param: str = "session_id") -> Optional[str]:
    """None or a non-empty string of at most 256 characters.

    Raises:
        ValidationError: anything else (``param`` names the field).
    """
    if v is None:
        return None
    if not isinstance(v, str) or not v or len(v) > 256:
        raise ValidationError(f"{param} must be a non-empty string of at most 256 characters", param)
    return v


def check_session_params(p: Any, session_id: Any = None) -> Optional[SessionParams]:
    """SGLang's ``session_params`` object -> :class:`SessionParams` (None stays None); ``session_id`` is
    checked too, and the two may not both be given.

    Raises:
        ValidationError: not an object, an unknown key, a missing or bad ``id``, a bad ``rid``/``offset``/flag,
            a bad ``session_id``, or both forms at once.
    """
    check_session_id(session_id)
    if p is None:
        return None
    if session_id is not None:
        raise ValidationError("give session_params or session_id, not both", "session_id")
    if not isinstance(p, dict):
        raise ValidationError(
            f"session_params must be an object with keys {list(SESSION_PARAM_KEYS)}", "session_params"
        )
    unknown = [k for k in p if k not in SESSION_PARAM_KEYS]
    if unknown:
        raise ValidationError(
            f"session_params.{unknown[0]}: unknown key; known: {list(SESSION_PARAM_KEYS)}", "session_params"
        )
    if p.get("id") is None:
        raise ValidationError("session_params.id is required", "session_params")
    check_session_id(p["id"], "session_params")
    if p.get("rid") is not None and not isinstance(p["rid"], str):
        raise ValidationError("session_params.rid must be a string", "session_params")
    off = p.get("offset")
    if off is not None and (not isinstance(off, int) or isinstance(off, bool) or off < 0):
        raise ValidationError(f"session_params.offset must be an integer >= 0 (tokens), got {off!r}", "session_params")
    for k in ("replace", "drop_previous_output"):
        if not isinstance(p.get(k, False), bool):
            raise ValidationError(f"session_params.{k} must be a boolean", "session_params")
    return SessionParams(
        id=p["id"],
        rid=p.get("rid"),
        offset=off,
        replace=p.get("replace", False),
        drop_previous_output=p.get("drop_previous_output", False),
    )


def check_open_session(capacity_of_str_len: Any = 0, session_id: Any = None, timeout: Any = None) -> OpenSessionReq:
    """Validate ``/open_session``'s fields.

    Raises:
        ValidationError: naming the bad field (a negative capacity, an empty id, a timeout <= 0).
    """
    if capacity_of_str_len is None:
        capacity_of_str_len = 0
    if not isinstance(capacity_of_str_len, int) or isinstance(capacity_of_str_len, bool) or capacity_of_str_len < 0:
        raise ValidationError(
            f"capacity_of_str_len must be an integer >= 0, got {capacity_of_str_len!r}", "capacity_of_str_len"
        )
    check_session_id(session_id)
    if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0):
        raise ValidationError(f"timeout must be a number of seconds > 0, got {timeout!r}", "timeout")
    return OpenSessionReq(
        capacity_of_str_len=capacity_of_str_len,
        session_id=session_id,
        timeout=None if timeout is None else float(timeout),
    )


def open_session_body(body: Any) -> OpenSessionReq:
    """A ``POST /open_session`` body (``capacity_of_str_len`` required, as in SGLang's OpenSessionReqInput).

    Raises:
        ValidationError: not an object, an unknown or missing field, or a bad value (naming the field).
    """
    if not isinstance(body, dict):
        raise ValidationError("the request body must be a JSON object", None)
    unknown = sorted(set(body) - {"capacity_of_str_len", "session_id", "timeout"})
    if unknown:
        raise ValidationError(
            f"{unknown[0]}: unknown field; known: capacity_of_str_len, session_id, timeout", unknown[0]
        )
    if "capacity_of_str_len" not in body:
        raise ValidationError("capacity_of_str_len is required (an integer >= 0)", "capacity_of_str_len")
    return check_open_session(body["capacity_of_str_len"], body.get("session_id"), body.get("timeout"))
