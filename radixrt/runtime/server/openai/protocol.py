"""OpenAI-compatible request models (pydantic) and response building (request -> sampling params is in
:mod:`.openai_sampling`).

Errors are OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``; every invalid request is a
400 ``invalid_request_error`` whose ``param`` names the field at fault.

Default ``max_tokens``: when neither ``max_tokens`` nor ``max_completion_tokens`` is given, a request may
generate up to the room left in the context (the smaller of the context length and the KV pool's size, minus
the prompt tokens). This applies to both
``/v1/chat/completions`` and ``/v1/completions``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Optional, Union

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field

from radixrt.runtime.io_struct import FinishReason, kind
from radixrt.runtime.server.http.body import parse_model
from radixrt.runtime.server.http.errors import ApiError
from radixrt.runtime.tokenizer.token_texts import TokenTexts

MAX_CHAT_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")


# ---- requests ----------------------------------------------------------------------------------------
# OpenAI fields that are accepted and have no effect here, with the reason (docs/compatibility.md) ...
IGNORED_FIELDS = {
    "user": "no per-user accounting",
    "metadata": "nothing is stored",
    "store": "nothing is stored",
    "service_tier": "one tier",
    "safety_identifier": "no abuse monitoring",
    "moderation": "no moderation layer",
    "reasoning_effort": "not a reasoning model",
    "verbosity": "no verbosity control; use max_tokens",
    "prediction": "a speed hint (predicted outputs); the output is the same without it",
    "prompt_cache_key": "the radix cache matches prefixes by content (use cache_salt to keep tenants apart)",
    "prompt_cache_options": "the radix cache matches prefixes by content",
    "prompt_cache_retention": "cached pages live until evicted (LRU)",
    "guided_decoding_backend": "--grammar-backend chooses the backend",
}
# ... and fields refused with a 400 naming them when set (null, false and [] count as unset).
REFUSED_FIELDS = {
    "audio": "the model is text-only",
    "web_search_options": "there is no web search",
    "functions": "deprecated by OpenAI; use tools",
    "function_call": "deprecated by OpenAI; use tool_choice",
    "modalities": 'the output is text only (only ["text"] is accepted)',
}
# /generate's names sent to an OpenAI route: unknown there, so they would be ignored (an unknown field is, as
# in SGLang and vLLM) and the output silently unconstrained; refused instead, naming the OpenAI field.
GENERATE_NAMES = {
    "json_schema": "it is a /generate sampling parameter; here use response_format (type json_schema) or guided_json",
    "structural_tag": "it is a /generate sampling parameter; here use structured_outputs.structural_tag",
    "sampling_params": "it is the /generate body's field; here the sampling parameters are top-level fields",
    "max_new_tokens": "it is a /generate sampling parameter; here use max_tokens",
    "session_params": "it is a /generate field; here send the whole history with session_id (or the "
    "X-Session-Id header)",
}
REFUSED_FIELDS.update(GENERATE_NAMES)


REASONING_EFFORTS = (None, "none", "minimal", "low", "medium", "high")


def check_refused(body: dict) -> None:
    """Raises ApiError 400 naming the first :data:`REFUSED_FIELDS` key that is set, or a
    ``reasoning_effort`` OpenAI does not take."""
    for k, why in REFUSED_FIELDS.items():
        v = body.get(k)
        if k in GENERATE_NAMES:  # even {} or 0: on /generate they mean something
            unset = v is None
        else:
            unset = v in (None, False, [], {}) or (k == "modalities" and v == ["text"])
        if not unset:
            raise ApiError(f"{k} is not supported: {why}", param=k)
    effort = body.get("reasoning_effort")  # ignored (IGNORED_FIELDS), but OpenAI's values only
    if effort not in REASONING_EFFORTS:
        raise ApiError(
            f"reasoning_effort must be one of {list(REASONING_EFFORTS[1:])}, got {effort!r}", param="reasoning_effort"
        )


async def parse_body(request: Request, model_cls):
    """The JSON body of an OpenAI route as ``model_cls``. Raises ApiError 400: not JSON, not an object, a
    refused field (:data:`REFUSED_FIELDS`), or a pydantic error (``param`` names the first bad field)."""
    return await parse_model(request, model_cls, check_refused)


class _Req(BaseModel):
    # strict: "2" is not an integer nor "yes" a boolean, as on /generate (an int is still a valid float)
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Req):
    include_usage: bool = False


class ChatMessage(_Req):
    role: str
    content: Optional[Union[str, list[dict[str, Any]]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None
    tool_call_id: Optional[str] = None


class StructuredOutputs(BaseModel):
    """vLLM's ``structured_outputs``: exactly one of json, regex, choice, grammar, json_object,
    structural_tag. An unknown key is a 400 naming it."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)
    json_: Optional[Union[dict[str, Any], str, bool]] = Field(None, alias="json")
    regex: Optional[str] = None
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    structural_tag: Optional[Union[dict[str, Any], str]] = None
    disable_any_whitespace: bool = False  # True: no whitespace between JSON tokens (our default)
    disable_additional_properties: bool = False  # guidance-only in vLLM: accepted, no effect
    disable_fallback: bool = False  # one grammar backend here: nothing to fall back to
    whitespace_pattern: Optional[str] = None  # refused (400): xgrammar takes no whitespace regex


class _Common(_Req):
    """Fields shared by chat and completions (OpenAI's plus SGLang's extras)."""

    model: Optional[str] = None
    max_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    n: int = 1
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[int] = None
    frequency_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None  # ignored
    logit_bias: Optional[dict[str, float]] = None
    # extras (SGLang / vLLM)
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    min_tokens: int = 0
    cache_salt: Optional[str] = None
    session_id: Optional[str] = None  # radixrt: pin this conversation's KV in an open session (extra_body)
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    response_format: Optional[dict[str, Any]] = None
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    spaces_between_special_tokens: bool = True
    speculative: bool = True  # radixrt: False opts this request out of --speculative-algorithm
    # vLLM extras
    include_stop_str_in_output: bool = False
    guided_json: Optional[Union[dict[str, Any], str, bool]] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None
    guided_decoding_backend: Optional[str] = None  # accepted, no effect: --grammar-backend decides
    guided_whitespace_pattern: Optional[str] = None  # refused (400)
    structured_outputs: Optional[StructuredOutputs] = None


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage]
    max_completion_tokens: Optional[int] = None
    logprobs: bool = False
    top_logprobs: Optional[int] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    parallel_tool_calls: Optional[bool] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None  # template variables, e.g. {"enable_thinking": false}
    separate_reasoning: bool = True  # with --reasoning-parser: thinking goes to reasoning_content
    # vLLM's template options: the prompt ends with the assistant header (default), or inside the last message
    add_generation_prompt: bool = True
    continue_final_message: bool = False


class CompletionRequest(_Common):
    prompt: Union[str, list[str], list[int], list[list[int]]] = Field(union_mode="left_to_right")
    logprobs: Optional[int] = None
    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None


def chat_logprobs(tt: TokenTexts, pairs: list, tops: list, top_n: int) -> list[dict]:
    """OpenAI chat ``logprobs.content`` entries."""
    out = []
    for i, (lp, tid) in enumerate(pairs):
        e = {"token": tt.text(tid), "logprob": lp, "bytes": list(tt.token_bytes(tid)), "top_logprobs": []}
        if top_n and i < len(tops):
            e["top_logprobs"] = [
                {"token": tt.text(t), "logprob": l, "bytes": list(tt.token_bytes(t))} for l, t in tops[i][:top_n]
            ]
        out.append(e)
    return out


def completion_logprobs(tt: TokenTexts, pairs: list, tops: list, top_n: int, offset: int = 0) -> dict:
    """OpenAI completions ``logprobs``: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens, lps, top_list, offsets = [], [], [], []
    for i, (lp, tid) in enumerate(pairs):
        s = tt.text(tid)
        tokens.append(s)
        lps.append(lp)
        offsets.append(offset)
        offset += len(s)
        if top_n:
            d: dict[str, float] = {}
            for l, t in (tops[i] if i < len(tops) else [])[:top_n]:
                d.setdefault(tt.text(t), l)
            top_list.append(d)
    return {
        "tokens": tokens,
        "token_logprobs": lps,
        "top_logprobs": top_list if top_n else None,
        "text_offset": offsets,
    }


# ---- responses -------------------------------------------------------------------------------------------
def finish_reason(reason: Optional[FinishReason]) -> Optional[str]:
    """The scheduler's finish type as OpenAI's: stop | length | abort (SGLang's extra value: the request
    was aborted by the client or a drain; a grammar that cannot be completed is a 400, not a finish)."""
    return kind(reason)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def batch_usage(outs: list, n: int) -> dict:
    """Usage of ``len(outs) // n`` prompts times n choices: each prompt counts once (its copies share it),
    completions add up, and ``cached_tokens`` is the best hit among a prompt's copies."""
    prompt = cached = completion = 0
    for k in range(0, len(outs), n):
        group = outs[k : k + n]
        prompt += group[0].prompt_tokens
        cached += max(o.cached_tokens for o in group)
        completion += sum(o.completion_tokens for o in group)
    return usage(prompt, completion, cached)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())
