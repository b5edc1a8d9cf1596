"""``POST /v1/chat/completions``: OpenAI chat over the model's chat template, with tool calling."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Optional

from fastapi import APIRouter, Request

from radixrt.runtime.server.api_models import ChatCompletionResponse, doc
from radixrt.runtime.server.context import ServerContext, ctx
from radixrt.runtime.server.manager.req_batch import ReqBatch
from radixrt.runtime.server.openai.protocol import (
    CHAT_ROLES,
    MAX_CHAT_TOP_LOGPROBS,
    ApiError,
    parse_body,
    ChatCompletionRequest,
    chat_logprobs,
    finish_reason,
    new_id,
    now,
)
from radixrt.runtime.server.openai.sampling import n_seeds, sampling_params
from radixrt.runtime.server.openai.serving import Envelope, check_model, complete, session_of, stream, submit
from radixrt.runtime.server.openai.chat_format import ChatFormat, ChatTurn, prepare_turn
from radixrt.runtime.server.openai.continuity import encode_turn, remember
from radixrt.runtime.server.openai.tool_parser import ToolPlan, plan_tools

router = APIRouter()


def check_tools(req: ChatCompletionRequest) -> Optional[ToolPlan]:
    """THE hook for tool calling (see :mod:`.tool_parser`): validates ``tools``/``tool_choice`` and returns
    the plan (prompt, grammar, parsing), or None when no tool may be called. Raises ApiError 400."""
    plan = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls)
    if plan is not None:
        for field in (
            "response_format",
            "regex",
            "ebnf",
            "guided_json",
            "guided_regex",
            "guided_choice",
            "guided_grammar",
            "structured_outputs",
        ):
            v = vars(req)[field]
            if v is not None and not (field == "response_format" and isinstance(v, dict) and v.get("type") == "text"):
                raise ApiError(
                    f"{field} cannot be combined with tools (tool_choice {plan.mode!r} constrains the "
                    f"output to tool calls); use tool_choice 'none'",
                    param=field,
                )
    return plan


def _check_size(messages, limits) -> None:
    """Refuse, before the template renders it, a conversation that cannot fit the context: more messages
    than tokens, or more characters than the context's tokens can hold (rendering and tokenizing such a
    message would hold the event loop for seconds). Raises ApiError 400 naming ``messages``."""
    chars = 0
    for m in messages:
        parts = m.content if isinstance(m.content, list) else [m.content]
        chars += sum(len(p) if isinstance(p, str) else len(str(p.get("text", ""))) for p in parts if p)
    ctx_len = limits.context_length
    if len(messages) >= ctx_len or (limits.max_chars is not None and chars > limits.max_chars):
        raise ApiError(
            f"messages: {len(messages)} messages of {chars} characters cannot fit the context length "
            f"of {ctx_len} tokens",
            param="messages",
        )


def chat_messages(messages) -> list[dict]:
    """OpenAI messages (roles system/developer/user/assistant/tool) as template-ready dicts. Raises ApiError
    400 naming the message field at fault."""
    if not messages:
        raise ApiError("messages must be a non-empty list", param="messages")
    msgs, called = [], set()  # called: the ids of earlier assistant tool calls, which tool messages answer
    for i, m in enumerate(messages):
        if m.role not in CHAT_ROLES:
            raise ApiError(
                f"messages[{i}].role: unknown role {m.role!r}; expected one of {list(CHAT_ROLES)}",
                param=f"messages[{i}].role",
            )
        content = m.content
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ApiError(
                        f"messages[{i}].content[{j}]: only text parts ({{'type': 'text', 'text': ...}}) are supported",
                        param=f"messages[{i}].content[{j}]",
                    )
                texts.append(part["text"])
            content = "\n".join(texts)
        if content is None:
            if m.role in ("system", "developer", "user", "tool"):
                raise ApiError(f"messages[{i}].content is required for role {m.role!r}", param=f"messages[{i}].content")
            content = ""
        if m.role == "tool" and not m.tool_call_id:
            raise ApiError(
                f"messages[{i}].tool_call_id is required for role 'tool'", param=f"messages[{i}].tool_call_id"
            )
        if m.role == "tool" and m.tool_call_id not in called:
            raise ApiError(
                f"messages[{i}].tool_call_id {m.tool_call_id!r} answers no tool call of an earlier assistant message",
                param=f"messages[{i}].tool_call_id",
            )
        for j, tc in enumerate(m.tool_calls or []):
            fn = tc.get("function")
            if not isinstance(tc.get("id"), str) or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise ApiError(
                    f"messages[{i}].tool_calls[{j}] needs an id and a function with a name",
                    param=f"messages[{i}].tool_calls[{j}]",
                )
            called.add(tc["id"])
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": content}
        if m.name is not None:
            d["name"] = m.name
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            d["tool_calls"] = m.tool_calls
        msgs.append(d)
    return msgs


def chat_format(c) -> ChatFormat:
    """The server's :class:`ChatFormat` (template, tool-call and reasoning parsers), built on first use."""
    from radixrt.runtime.models.loader import load_config

    a = c.args
    return c.chat_format(
        lambda: ChatFormat.for_model(
            c.tm.tokenizer, load_config(a.model).model_type, a.tool_call_parser, a.reasoning_parser
        )
    )


def _check_top_logprobs(req: ChatCompletionRequest) -> None:
    if req.top_logprobs is not None:
        if not 0 <= req.top_logprobs <= MAX_CHAT_TOP_LOGPROBS:
            raise ApiError(
                f"top_logprobs must be in [0, {MAX_CHAT_TOP_LOGPROBS}], got {req.top_logprobs}", param="top_logprobs"
            )
        if req.top_logprobs > 0 and not req.logprobs:
            raise ApiError("top_logprobs needs logprobs=true", param="top_logprobs")


@dataclass
class ChatRun:
    """One chat-shaped call in flight: its turn (prompt, parser), its requests, and what continuity spliced.
    The Responses and Messages routes run through it too, so all three share one path."""

    c: ServerContext
    turn: ChatTurn
    batch: Optional[ReqBatch]  # None when only counted (``submit=False``)
    n: int
    salt: Optional[str]
    spliced: int  # earlier assistant turns whose generated ids were spliced into the prompt
    ids: list[int]  # the prompt's token ids

    def parse(self, i: int) -> tuple[dict, Optional[str]]:
        """Finished choice i as ``(assistant message, finish_reason)``; its ids are remembered for the
        turns to come (turn continuity)."""
        o = self.batch.outs[i]
        message, reason = {"role": "assistant", "content": o.text}, finish_reason(o.finished_reason)
        parser = self.turn.parser()
        if parser is not None:
            message, reason = parser.parse(o.text, reason)
        remember(self.c.turns(), self.turn, self.salt, o, message)
        return message, reason


async def run_chat(
    c: ServerContext,
    request: Request,
    req: ChatCompletionRequest,
    msgs: Optional[list] = None,
    session_id: Optional[str] = None,
    submit_it: bool = True,
) -> ChatRun:
    """Validate, render, tokenize (with turn continuity) and queue a chat request; ``msgs``: template-ready
    messages when the caller converted them itself (else ``req.messages``); ``submit_it=False``: only the
    prompt (token counting).

    Raises:
        ApiError: 400 naming the field (chat's names), 503 when not ready.
    """
    tm = c.tm
    tm.check_ready()
    check_model(c, req.model)
    _check_size(req.messages if msgs is None else [SimpleNamespace(content=m.get("content")) for m in msgs], tm.limits)
    plan = check_tools(req)
    _check_top_logprobs(req)
    if req.continue_final_message and req.add_generation_prompt:  # vLLM's rule: a new turn or the last one
        raise ApiError(
            "continue_final_message and add_generation_prompt cannot both be true (set add_generation_prompt"
            " to false to continue the last message)",
            param="continue_final_message",
        )
    max_param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    max_new = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    sp, grammar_src = sampling_params(req, max_new, max_param)
    forced = grammar_src or ("tool_choice" if plan is not None and plan.mode != "auto" else None)
    if req.continue_final_message and forced:  # its grammar would start over after the continued text
        raise ApiError(
            f"continue_final_message cannot be combined with {forced.split('.')[0]}: the constrained output would"
            " start anew after the continued text instead of completing it",
            param="continue_final_message",
        )
    turn = prepare_turn(
        chat_format(c),
        tm.tokenizer,
        msgs if msgs is not None else chat_messages(req.messages),
        plan,
        sp,
        req.chat_template_kwargs,
        req.separate_reasoning,
        req.add_generation_prompt,
        req.continue_final_message,
    )
    sp.update(turn.sampling)
    ids, spliced = encode_turn(tm.tokenizer, c.turns(), turn, req.cache_salt, c.args.reasoning_history == "keep")
    n = req.n
    if not submit_it:
        return ChatRun(c, turn, None, n, req.cache_salt, spliced, ids)
    sps = [dict(sp, **({"seed": s} if s is not None else {})) for s in n_seeds(req.seed, n)]
    batch = await submit(
        c,
        "messages",
        max_param,
        sps,
        ids=[ids] * n,
        return_logprob=req.logprobs,
        top_n=req.top_logprobs or 0,
        cache_salt=req.cache_salt,
        grammar_param="tools" if plan else grammar_src,
        session_id=session_id if session_id is not None else session_of(request, req.session_id),
    )
    return ChatRun(c, turn, batch, n, req.cache_salt, spliced, ids)


@router.post("/v1/chat/completions", **doc(ChatCompletionResponse, ChatCompletionRequest, stream=True))
async def chat_completions(request: Request):
    """OpenAI chat completions over the model's chat template.

    ``max_tokens`` / ``max_completion_tokens`` omitted: up to the room left in the context
    (min(context length, KV pool) - prompt tokens). ``n`` > 1 submits n requests sharing the prompt's KV (seeds
    ``seed + i`` when ``seed`` is given). ``finish_reason`` is ``stop`` (EOS, a stop string or token,
    or an abort), ``length``, or ``tool_calls``: ``tools``/``tool_choice`` are handled by
    :mod:`.chat_format` (tools in the model's template or injected into the system prompt, output
    constrained and parsed into ``message.tool_calls``; streamed as OpenAI tool-call deltas); with
    ``--reasoning-parser`` the thinking goes to ``reasoning_content``.
    """
    c = ctx(request)
    tm = c.tm
    req = await parse_body(request, ChatCompletionRequest)
    run = await run_chat(c, request, req)
    turn, batch, n, top_n = run.turn, run.batch, run.n, req.top_logprobs or 0
    env = Envelope(
        new_id("chatcmpl"),
        "chat.completion",
        "chat.completion.chunk",
        now(),
        tm.model_name,
        bool(req.stream_options and req.stream_options.include_usage),
    )

    def lp_obj(pairs, tops):
        return {"content": chat_logprobs(c.token_texts(), pairs, tops, top_n)} if req.logprobs else None

    def delta_choice(i, delta, finish=None, logprobs=None) -> dict:
        return {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    if req.stream:
        parsers = [turn.parser() for _ in range(n)]
        if parsers[0] is None:
            parsers = None

        def step(i, s):
            t = s.token
            lp = lp_obj(t.output_token_logprobs, t.output_top_logprobs) if t.output_token_logprobs else None
            if parsers is not None:  # reasoning, content and tool_call deltas from the parser
                deltas = parsers[i].feed(s.text_delta or "")
                if t.finished_reason is not None:
                    deltas += parsers[i].finish()
                if lp and not deltas:
                    deltas = [{"content": ""}]
                out = [delta_choice(i, d, logprobs=lp if k == 0 else None) for k, d in enumerate(deltas)]
                if t.finished_reason is not None:
                    run.parse(i)  # remembered for turn continuity
                    out.append(delta_choice(i, {}, parsers[i].finish_reason(finish_reason(t.finished_reason))))
                return out
            out = [delta_choice(i, {"content": s.text_delta}, logprobs=lp)] if s.text_delta or lp else []
            if t.finished_reason is not None:
                run.parse(i)
                out.append(delta_choice(i, {}, finish_reason(t.finished_reason)))
            return out

        head = [delta_choice(i, {"role": "assistant", "content": ""}) for i in range(n)]
        return await stream(request, env, batch, n, head, step)

    def choice(i, o) -> dict:
        message, reason = run.parse(i)
        return {
            "index": i,
            "message": message,
            "logprobs": lp_obj(o.output_token_logprobs, o.output_top_logprobs),
            "finish_reason": reason,
        }

    return await complete(request, env, batch, n, choice)
