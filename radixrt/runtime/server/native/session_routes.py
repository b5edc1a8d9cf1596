"""SGLang's session routes: ``POST /open_session`` and ``POST /close_session`` (see runtime/scheduler/session.py).

``/open_session`` takes ``{"capacity_of_str_len": int, "session_id": str?, "timeout": seconds?}`` and answers
the session id as a JSON string, as SGLang does; a taken ``session_id`` is a 400 naming it.
``/close_session`` takes ``{"session_id": str}`` and answers ``{"success": bool}`` (False: not open).
Requests then join the session with ``session_params`` or ``session_id`` on ``/generate``, or with the
``X-Session-Id`` header / ``session_id`` body field on the OpenAI routes.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from radixrt.runtime.server.api_models import CloseSessionRequest, OpenSessionRequest, Success, doc
from radixrt.runtime.server.context import ctx
from radixrt.runtime.server.http.body import body_json
from radixrt.runtime.server.http.responses import JSONResp

router = APIRouter()


@router.post("/open_session", **doc(str, OpenSessionRequest))
async def open_session(request: Request):
    return JSONResp(await ctx(request).tm.open_session(await body_json(request)))


@router.post("/close_session", **doc(Success, CloseSessionRequest))
async def close_session(request: Request):
    body = await body_json(request)
    sid = body.get("session_id") if isinstance(body, dict) else None
    return JSONResp({"success": await ctx(request).tm.close_session(sid)})
