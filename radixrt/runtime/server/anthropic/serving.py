"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API over the chat path
(:func:`radixrt.runtime.server.openai.chat.run_chat`: template, sampling, tool grammar and parsers, reasoning
parser, turn continuity). Streamed as Anthropic's events: ``message_start``, per block
``content_block_start`` / ``content_block_delta`` (``text_delta``, ``input_json_delta``,
``thinking_delta``) / ``content_block_stop``, then ``message_delta`` (stop reason, usage) and
``message_stop``. ``usage.cache_read_input_tokens`` is the prompt tokens the radix tree matched.
Authentication takes ``x-api-key`` beside ``Authorization: Bearer``; errors are Anthropic's shape.
"""

from __future__ import annotations

from typing import Optional

import msgspec
from fastapi import APIRouter, Request
from pydantic import ValidationError as PydanticValidationError
from starlette.responses import Response

from radixrt.runtime.server.anthropic.protocol import (
    MessagesRequest,
    chat_body,
    chat_messages,
    check_refused,
    content_blocks,
    messages_param,
    new_msg_id,
    stop_reason,
    tool_id,
    usage,
)
from radixrt.runtime.server.api_models import doc
from radixrt.runtime.server.context import ctx
from radixrt.runtime.server.http.body import parse_model
from radixrt.runtime.server.http.fields import renamed
from radixrt.runtime.server.http.errors import ApiError, validation_error
from radixrt.runtime.server.http.responses import ClientGone, JSONResp, SSEResponse, first_or_abort, wait_or_abort
from radixrt.runtime.server.openai.chat import ChatRun, run_chat
from radixrt.runtime.server.openai.protocol import ChatCompletionRequest

router = APIRouter()


def event(typ: str, **data) -> bytes:
    return b"event: " + typ.encode() + b"\ndata: " + msgspec.json.encode({"type": typ, **data}) + b"\n\n"


def _prefill(req: MessagesRequest, msgs: list[dict], cbody: dict) -> None:
    """A final assistant message: text is a prefill the answer continues (``continue_final_message``);
    tool_use blocks that no tool_result answers are a 400, as is a prefill under a grammar (which would
    start over after it)."""
    last = msgs[-1]
    if last["role"] == "assistant" and isinstance(last.get("content"), str) and not last.get("tool_calls"):  # prefill
        if last["content"] != last["content"].rstrip():
            raise ApiError(
                "final assistant content cannot end with trailing whitespace",
                param=f"messages[{len(req.messages) - 1}].content",
            )
        if cbody.get("response_format") or (req.tools and cbody.get("tool_choice") not in (None, "auto", "none")):
            raise ApiError(  # its grammar would start over after the prefill instead of completing it
                "a final assistant message (a prefill) cannot be combined with a structured output or a forced tool",
                param=f"messages[{len(req.messages) - 1}]",
            )
        cbody.update(add_generation_prompt=False, continue_final_message=True)
    elif last["role"] == "assistant" and last.get("tool_calls"):  # a tool_use nothing answers
        raise ApiError(
            "the final assistant message has tool_use blocks and no tool_result follows them",
            param=f"messages[{len(req.messages) - 1}].content",
        )


async def _run(request: Request, submit_it: bool = True) -> tuple[MessagesRequest, ChatRun]:
    c = ctx(request)
    req = await parse_model(request, MessagesRequest, check_refused)
    msgs = chat_messages(req)
    if not submit_it:
        req.max_tokens = req.max_tokens or 1
    cbody = chat_body(req)
    _prefill(req, msgs, cbody)
    try:
        chat_req = ChatCompletionRequest.model_validate(cbody)
        return req, await run_chat(c, request, chat_req, msgs=msgs, submit_it=submit_it)
    except PydanticValidationError as e:
        raise renamed(validation_error(e.errors()), messages_param) from None
    except ApiError as e:
        raise renamed(e, messages_param) from None


@router.post("/v1/messages/count_tokens", **doc(request=MessagesRequest, errors=()))  # Anthropic error bodies
async def count_tokens(request: Request):
    """``{"input_tokens": n}``: the prompt's tokens as ``/v1/messages`` would render it (turns continued
    from earlier outputs count as their generated ids)."""
    _, run = await _run(request, submit_it=False)
    return JSONResp({"input_tokens": len(run.ids)})


class BlockStream:
    """Chat deltas in, Anthropic content-block events out (one open block at a time)."""

    def __init__(self):
        self.index = -1
        self.kind: Optional[str] = None

    def _start(self, kind: str, block: dict) -> list[bytes]:
        out = self.stop()
        self.index += 1
        self.kind = kind
        return out + [event("content_block_start", index=self.index, content_block=block)]

    def stop(self) -> list[bytes]:
        if self.kind is None:
            return []
        self.kind = None
        return [event("content_block_stop", index=self.index)]

    def feed(self, d: dict) -> list[bytes]:
        out: list[bytes] = []
        if d.get("reasoning_content"):
            if self.kind != "thinking":
                out += self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(
                event(
                    "content_block_delta",
                    index=self.index,
                    delta={"type": "thinking_delta", "thinking": d["reasoning_content"]},
                )
            )
        if d.get("content"):
            if self.kind != "text":
                out += self._start("text", {"type": "text", "text": ""})
            out.append(
                event("content_block_delta", index=self.index, delta={"type": "text_delta", "text": d["content"]})
            )
        for tc in d.get("tool_calls") or []:
            fn = tc.get("function") or {}
            if tc.get("id") is not None:
                out += self._start(
                    "tool_use", {"type": "tool_use", "id": tool_id(tc["id"]), "name": fn.get("name"), "input": {}}
                )
            if fn.get("arguments"):
                out.append(
                    event(
                        "content_block_delta",
                        index=self.index,
                        delta={"type": "input_json_delta", "partial_json": fn["arguments"]},
                    )
                )
        return out


@router.post("/v1/messages", **doc(request=MessagesRequest, stream=True, errors=()))
async def create_message(request: Request):
    """Anthropic Messages: ``system``, ``messages`` (text, tool_use, tool_result, thinking blocks), ``tools``
    with ``input_schema``, ``tool_choice``, ``stop_sequences``, ``thinking``, ``max_tokens``, ``stream``."""
    req, run = await _run(request)
    c, mid = ctx(request), new_msg_id()
    model = req.model or c.tm.model_name

    def message(content: list, o, reason: Optional[str]) -> dict:
        sr, seq = stop_reason(reason, o.finished_reason)
        return {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": sr,
            "stop_sequence": seq,
            "usage": usage(o),
        }

    if not req.stream:
        try:
            outs = await wait_or_abort(request, run.batch)
        except ClientGone:
            return Response(status_code=499)
        except ApiError as e:  # the scheduler's refusal, in chat's field names
            raise renamed(e, messages_param) from None
        msg, reason = run.parse(0)  # the ids are remembered for turn continuity
        return JSONResp(message(content_blocks(msg), outs[0], reason))

    try:
        await first_or_abort(request, run.batch)  # a refusal before the first token is a 400
    except ClientGone:
        return Response(status_code=499)
    except ApiError as e:
        raise renamed(e, messages_param) from None

    async def events():
        blocks, parser, started = BlockStream(), run.turn.parser(), False
        try:
            while not run.batch.finished:
                _, s = await run.batch.next()
                if not started:  # the first output carries the prompt and cache counts
                    head = message([], s.token, None)
                    head.update(stop_reason=None, stop_sequence=None)
                    head["usage"]["output_tokens"] = 0
                    yield event("message_start", message=head)
                    started = True
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
                    for b in blocks.feed(d):
                        yield b
            for b in blocks.stop():
                yield b
            _, reason = run.parse(0)
            o = run.batch.outs[0]
            sr, seq = stop_reason(reason, o.finished_reason)
            yield event("message_delta", delta={"stop_reason": sr, "stop_sequence": seq}, usage=usage(o))
            yield event("message_stop")
        except ApiError as e:
            yield event(
                "error",
                error={"type": "api_error" if e.status >= 500 else "invalid_request_error", "message": e.message},
            )

    return SSEResponse(events(), run.batch.abort_unfinished)
