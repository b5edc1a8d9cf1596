"""``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``: OpenAI's Responses API over the chat
path (:func:`..chat.run_chat`: the same template, sampling, tool grammar and parsers, reasoning parser and
turn continuity), answered as a Response object or as typed SSE events (:mod:`.events`).

``previous_response_id`` continues a stored response's conversation (its input and output, not its
``instructions``, as OpenAI's); ``store`` (default true) keeps the response (:mod:`.store`) and pins the
conversation's KV in a session until the next turn. ``usage.input_tokens_details.cached_tokens`` is the
prompt tokens the radix tree matched.
"""

from __future__ import annotations

from typing import Optional

from fastapi import APIRouter, Request
from pydantic import ValidationError as PydanticValidationError
from starlette.responses import Response

from radixrt.runtime.server.api_models import doc
from radixrt.runtime.server.context import ServerContext, ctx
from radixrt.runtime.server.http.body import parse_model
from radixrt.runtime.server.http.fields import renamed
from radixrt.runtime.server.http.errors import ApiError, validation_error
from radixrt.runtime.server.http.responses import ClientGone, JSONResp, SSEResponse, first_or_abort, wait_or_abort
from radixrt.runtime.server.openai.chat import run_chat
from radixrt.runtime.server.openai.protocol import ChatCompletionRequest, chat_logprobs, new_id, now
from radixrt.runtime.server.openai.responses.events import EventStream, sse_event
from radixrt.runtime.server.openai.responses.items import ItemIds, input_items, output_items
from radixrt.runtime.server.openai.responses.protocol import (
    ResponsesRequest,
    chat_body,
    check_refused,
    input_messages,
    responses_param,
    wants_logprobs,
)
from radixrt.runtime.server.openai.responses.store import ResponseStore, Stored

router = APIRouter()
SESSION_CAPACITY = 1 << 30  # characters: a stored conversation is bounded by the context, not by this


def response_store(c: ServerContext) -> ResponseStore:
    return c.responses(lambda: ResponseStore(c.args.response_store_size, c.args.response_session_ttl))


def _renamed(e: ApiError) -> ApiError:
    """A chat-path error as the Responses request names the field."""
    return renamed(e, responses_param)


async def parse_request(request: Request) -> ResponsesRequest:
    return await parse_model(request, ResponsesRequest, check_refused)


def assistant_message(items: list[dict]) -> dict:
    """Output items as the chat message a later turn renders (continuity finds it by this form)."""
    m: dict = {
        "role": "assistant",
        "content": "".join(p["text"] for i in items if i["type"] == "message" for p in i["content"]),
    }
    calls = [
        {"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
        for i in items
        if i["type"] == "function_call"
    ]
    if calls:
        m["tool_calls"] = calls
    reasoning = "".join(p["text"] for i in items if i["type"] == "reasoning" for p in i.get("content") or [])
    if reasoning:
        m["reasoning_content"] = reasoning
    return m


def response_obj(
    rid: str,
    created: int,
    model: str,
    req: ResponsesRequest,
    status: str,
    output: list,
    usage: Optional[dict],
    incomplete: Optional[str] = None,
) -> dict:
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": model,
        "output": output,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": req.store is not False,
        "temperature": req.temperature,
        "text": req.text or {"format": {"type": "text"}},
        "tool_choice": req.tool_choice or "auto",
        "tools": req.tools or [],
        "top_p": req.top_p,
        "truncation": "disabled",
        "usage": usage,
        "user": req.user,
        "metadata": req.metadata or {},
    }


def usage_of(o) -> dict:
    return {
        "input_tokens": o.prompt_tokens,
        "input_tokens_details": {"cached_tokens": o.cached_tokens},
        "output_tokens": o.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": o.prompt_tokens + o.completion_tokens,
    }


async def _close_sessions(c: ServerContext, sids: list[str]) -> None:
    for sid in sids:
        try:
            await c.tm.close_session(sid)
        except Exception:  # the runtime is gone or the TTL closed it first: nothing stays pinned either way
            pass


@router.post("/v1/responses", **doc(request=ResponsesRequest, stream=True))
async def create_response(request: Request):
    """OpenAI Responses: ``input`` (a string or message / function_call / function_call_output / reasoning
    items), ``instructions``, function ``tools`` and ``tool_choice``, ``text.format``, ``max_output_tokens``,
    ``temperature``/``top_p``, ``stream``, ``store`` and ``previous_response_id``. Raises ApiError 400
    naming the field (``input[1].type``, ``max_output_tokens`` ...)."""
    c = ctx(request)
    req = await parse_request(request)
    c.tm.check_ready()
    st = response_store(c)
    prev = None
    if req.previous_response_id is not None:
        prev = st.get(req.previous_response_id)
        if prev is None:
            raise ApiError(
                f"previous_response_id: no stored response {req.previous_response_id!r}", param="previous_response_id"
            )
    conv = (prev.messages if prev else []) + input_messages(req.input)
    msgs = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + conv
    try:
        chat_req = ChatCompletionRequest.model_validate(chat_body(req))
    except PydanticValidationError as e:
        raise _renamed(validation_error(e.errors())) from None
    sid, opened = None, False
    if req.store is not False:
        sid = st.session_for(prev)
        if sid is None:
            sid = await c.tm.open_session({"capacity_of_str_len": SESSION_CAPACITY, "timeout": st.ttl})
            opened = True
        st.touch(sid)
    try:
        run = await run_chat(c, request, chat_req, msgs=msgs, session_id=sid)
    except ApiError as e:
        if opened:
            await _close_sessions(c, [sid])
        raise _renamed(e) from None
    rid, created = new_id("resp").replace("-", "_"), now()
    ids = ItemIds(rid)

    def lp_entries(pairs, tops) -> Optional[list]:
        if not wants_logprobs(req):
            return None
        return chat_logprobs(c.token_texts(), pairs or [], tops or [], req.top_logprobs or 0)

    async def finish(output: list, o, reason: Optional[str]) -> dict:
        # an abort (client, drain, a grammar that cannot complete) is no completed response either; its
        # reason "abort" is SGLang's finish_reason value, beside OpenAI's max_output_tokens
        status, why = {"length": ("incomplete", "max_output_tokens"), "abort": ("incomplete", "abort")}.get(
            reason, ("completed", None)
        )
        resp = response_obj(rid, created, c.tm.model_name, req, status, output, usage_of(o), why)
        if req.store is not False:
            stored = Stored(resp, conv + [assistant_message(output)], sid, req.cache_salt, input_items(req.input, ids))
            await _close_sessions(c, st.put(rid, stored))
        return resp

    async def answered(first_only: bool):
        """The outputs (or, for a stream, the first output): a refusal (400) or a client gone (499) before
        then closes the session this call opened, which nothing will store."""
        try:
            return await (first_or_abort if first_only else wait_or_abort)(request, run.batch)
        except (ApiError, ClientGone) as e:
            if opened:
                await _close_sessions(c, [sid])
            if isinstance(e, ClientGone):
                return Response(status_code=499)
            raise _renamed(e) from None

    if not req.stream:
        outs = await answered(first_only=False)
        if isinstance(outs, Response):
            return outs
        message, reason = run.parse(0)  # the ids are remembered for turn continuity
        lp = lp_entries(outs[0].output_token_logprobs, outs[0].output_top_logprobs)
        return JSONResp(await finish(output_items(message, ids, lp), outs[0], reason))

    if isinstance(gone := await answered(first_only=True), Response):  # a refusal before the first token: 400
        return gone

    async def events():
        es = EventStream(ids)
        head = response_obj(rid, created, c.tm.model_name, req, "in_progress", [], None)
        yield sse_event(es.ev("response.created", response=head))
        yield sse_event(es.ev("response.in_progress", response=head))
        parser, pending = run.turn.parser(), []
        try:
            while not run.batch.finished:
                _, s = await run.batch.next()
                pending += lp_entries(s.token.output_token_logprobs, s.token.output_top_logprobs) or []
                deltas = (
                    parser.feed(s.text_delta or "")
                    if parser is not None
                    else [{"content": s.text_delta}]
                    if s.text_delta
                    else []
                )
                if s.token.finished_reason is not None and parser is not None:
                    deltas += parser.finish()
                for d in deltas:
                    lp, pending = (pending, []) if d.get("content") else (None, pending)
                    for e in es.feed(d, lp):
                        yield sse_event(e)
            for e in es.finish():
                yield sse_event(e)
            _, reason = run.parse(0)  # the ids are remembered for turn continuity
            resp = await finish(es.items, run.batch.outs[0], reason)
            yield sse_event(
                es.ev("response." + ("incomplete" if resp["status"] == "incomplete" else "completed"), response=resp)
            )
        except ApiError as e:
            yield sse_event(es.ev("error", code=e.code, message=e.message, param=e.param))

    return SSEResponse(events(), run.batch.abort_unfinished)


def _stored(request: Request, response_id: str) -> Stored:
    s = response_store(ctx(request)).get(response_id)
    if s is None:
        raise ApiError(f"no stored response {response_id!r}", param="response_id", status=404, type="not_found_error")
    return s


@router.get("/v1/responses/{response_id}", **doc(errors=(400, 404)))
async def get_response(request: Request, response_id: str):
    """A stored response. ``stream=true`` (a replay of its events) is refused: it is answered whole."""
    s = _stored(request, response_id)
    if request.query_params.get("stream", "false").lower() not in ("false", "0", ""):
        raise ApiError("stream: a stored response is returned whole (no event replay)", param="stream")
    return JSONResp(s.response)


@router.get("/v1/responses/{response_id}/input_items", **doc(errors=(400, 404)))
async def list_input_items(request: Request, response_id: str):
    """The stored response's own input as items (``responses.input_items.list``): ``order`` asc|desc
    (default desc, as OpenAI's), ``limit`` 1..100 (default 20), ``after`` an item id."""
    items = list(_stored(request, response_id).input_items)
    q = request.query_params
    order, after = q.get("order", "desc"), q.get("after")
    if order not in ("asc", "desc"):
        raise ApiError(f"order must be 'asc' or 'desc', got {order!r}", param="order")
    try:
        limit = int(q.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise ApiError(f"limit must be an integer in [1, 100], got {q.get('limit')!r}", param="limit")
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [i["id"] for i in items]
        if after not in ids:
            raise ApiError(f"after: no input item {after!r} in this response", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return JSONResp(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }
    )


@router.post("/v1/responses/{response_id}/cancel", **doc(errors=(400, 404)))
async def cancel_response(request: Request, response_id: str):
    """OpenAI cancels only background responses; here every response runs in the foreground and is finished
    when stored, so a stored one is a 400 (an unknown one a 404)."""
    _stored(request, response_id)
    raise ApiError(
        "only background responses can be cancelled; this server runs responses in the foreground", param="response_id"
    )


@router.delete("/v1/responses/{response_id}", **doc(errors=(404,)))
async def delete_response(request: Request, response_id: str):
    c = ctx(request)
    found, sids = response_store(c).delete(response_id)
    if not found:
        raise ApiError(f"no stored response {response_id!r}", param="response_id", status=404, type="not_found_error")
    await _close_sessions(c, sids)
    return JSONResp({"id": response_id, "object": "response.deleted", "deleted": True})
