"""OpenAI-compatible request models (pydantic) and response building.

Errors are OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``; every invalid request is a
400 ``invalid_request_error`` whose ``param`` names the field at fault.

Default ``max_tokens``: when neither ``max_tokens`` nor ``max_completion_tokens`` is given, a request may
generate up to the room left in the context (context length minus prompt tokens). This applies to both
``/v1/chat/completions`` and ``/v1/completions``.
"""
from __future__ import annotations

import json
import time
import uuid
from functools import lru_cache
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from radixrt.runtime.constrained.vocab import piece_bytes, special_token_ids

MAX_CHAT_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")


class ApiError(Exception):
    """An error answered with an OpenAI-style body. ``status`` 400 unless said otherwise."""

    def __init__(self, message: str, param: Optional[str] = None, status: int = 400,
                 type: str = "invalid_request_error", code: Optional[str] = None):
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type, code

    def body(self) -> dict:
        return error_body(self.message, self.param, self.type, self.code)


def error_body(message: str, param: Optional[str] = None, type: str = "invalid_request_error",
               code: Optional[str] = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# ---- requests ----------------------------------------------------------------------------------------
class _Req(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Req):
    include_usage: bool = False


class ChatMessage(_Req):
    role: str
    content: Optional[Union[str, list[dict[str, Any]]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None
    tool_call_id: Optional[str] = None


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
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    response_format: Optional[dict[str, Any]] = None
    skip_special_tokens: bool = True
    no_stop_trim: bool = False


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage]
    max_completion_tokens: Optional[int] = None
    logprobs: bool = False
    top_logprobs: Optional[int] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    parallel_tool_calls: Optional[bool] = None


class CompletionRequest(_Common):
    prompt: Union[str, list[str], list[int], list[list[int]]] = Field(union_mode="left_to_right")
    logprobs: Optional[int] = None
    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None


# ---- request -> sampling params -------------------------------------------------------------------------
def response_format_grammar(rf: Optional[dict]) -> Optional[tuple[str, Any]]:
    """``response_format`` -> ``("json_schema", schema)`` or None; edge case 11's malformed variants -> 400."""
    from radixrt.runtime.constrained import JSON_OBJECT_SCHEMA

    if rf is None:
        return None
    t = rf.get("type")
    if t is None:
        raise ApiError("response_format.type is required: one of 'text', 'json_object', 'json_schema'",
                       param="response_format.type")
    if t == "text":
        return None
    if t == "json_object":
        return "json_schema", JSON_OBJECT_SCHEMA
    if t != "json_schema":
        raise ApiError(f"response_format.type must be one of 'text', 'json_object', 'json_schema', got {t!r}",
                       param="response_format.type")
    js = rf.get("json_schema")
    if js is None:
        raise ApiError("response_format of type 'json_schema' needs a 'json_schema' object "
                       "({'name': ..., 'schema': {...}})", param="response_format.json_schema")
    if not isinstance(js, dict):
        raise ApiError(f"response_format.json_schema must be an object, got {type(js).__name__}",
                       param="response_format.json_schema")
    if "schema" not in js or js["schema"] is None:
        raise ApiError("response_format.json_schema.schema is required (a JSON Schema object)",
                       param="response_format.json_schema.schema")
    schema = js["schema"]
    if not isinstance(schema, dict):
        raise ApiError(f"response_format.json_schema.schema must be a JSON object, got {type(schema).__name__}",
                       param="response_format.json_schema.schema")
    name = js.get("name")
    if name is not None and not isinstance(name, str):
        raise ApiError("response_format.json_schema.name must be a string", param="response_format.json_schema.name")
    strict = js.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ApiError("response_format.json_schema.strict must be a boolean",
                       param="response_format.json_schema.strict")
    return "json_schema", schema


def sampling_params(req: _Common, max_new_tokens: Optional[int], max_param: str,
                    top_logprobs: int = 0) -> dict:
    """SGLang sampling params of an OpenAI request (still to be checked by ``normalize``)."""
    if max_new_tokens is not None and max_new_tokens < 1:
        raise ApiError(f"{max_param} must be >= 1, got {max_new_tokens}", param=max_param)
    if req.n < 1:
        raise ApiError(f"n must be >= 1, got {req.n}", param="n")
    if req.n > 128:
        raise ApiError(f"n must be <= 128, got {req.n}", param="n")
    if req.logit_bias:
        raise ApiError("logit_bias is not supported", param="logit_bias")
    sp: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    for k in ("temperature", "top_p", "frequency_penalty", "presence_penalty", "top_k", "min_p",
              "repetition_penalty", "seed", "regex", "ebnf"):
        v = getattr(req, k)
        if v is not None:
            sp[k] = v
    if req.stop is not None:
        sp["stop"] = [req.stop] if isinstance(req.stop, str) else list(req.stop)
    if req.stop_token_ids:
        sp["stop_token_ids"] = list(req.stop_token_ids)
    sp["ignore_eos"] = req.ignore_eos
    sp["min_new_tokens"] = req.min_tokens
    sp["skip_special_tokens"] = req.skip_special_tokens
    sp["no_stop_trim"] = req.no_stop_trim
    g = response_format_grammar(req.response_format)
    if g is not None:
        if req.regex is not None or req.ebnf is not None:
            raise ApiError("response_format json_schema/json_object cannot be combined with regex or ebnf",
                           param="response_format")
        sp[g[0]] = g[1]
    return sp


def n_seeds(seed: Optional[int], n: int) -> list[Optional[int]]:
    """Seeds of the n copies: ``seed + i`` (distinct, reproducible) or None (the scheduler's own)."""
    return [None if seed is None else seed + i for i in range(n)]


_PARAM_MAP = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "text": "prompt",
              "input_ids": "prompt", "top_logprobs_num": "logprobs", "json_schema": "response_format",
              "sampling_params": None}


def openai_param(native: Optional[str], msg: str, prompt_param: str, max_param: str) -> Optional[str]:
    """Map a native validation field to the OpenAI request field."""
    if native is None:
        return None
    if native in ("text", "input_ids"):
        return prompt_param
    if native == "max_new_tokens":
        return max_param
    if native == "json_schema":
        return "response_format.json_schema.schema"
    if native == "sampling_params" and msg.startswith("only one of"):
        return "response_format"
    return _PARAM_MAP.get(native, native)


# ---- token text (logprobs) -------------------------------------------------------------------------------
class TokenTexts:
    """A token's exact bytes (byte-level BPE, see :mod:`radixrt.runtime.constrained.vocab`) and its text,
    for OpenAI logprobs."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.byte_level = False
        try:
            spec = json.loads(tokenizer.backend_tokenizer.to_str())
            self.byte_level = (spec.get("decoder") or {}).get("type") == "ByteLevel"
        except Exception:
            pass
        self.special = special_token_ids(tokenizer)  # their text as written; every other id is byte-level
        self.token_bytes = lru_cache(maxsize=65536)(self._token_bytes)

    def _token_bytes(self, tid: int) -> bytes:
        if self.byte_level and tid not in self.special:
            piece = self.tok.convert_ids_to_tokens(tid)
            raw = piece_bytes(piece) if isinstance(piece, str) else None
            if raw is not None:
                return raw
        return self.tok.decode([tid]).encode("utf-8")

    def text(self, tid: int) -> str:
        return self.token_bytes(tid).decode("utf-8", errors="replace")


def chat_logprobs(tt: TokenTexts, pairs: list, tops: list, top_n: int) -> list[dict]:
    """OpenAI chat ``logprobs.content`` entries."""
    out = []
    for i, (lp, tid) in enumerate(pairs):
        e = {"token": tt.text(tid), "logprob": lp, "bytes": list(tt.token_bytes(tid)), "top_logprobs": []}
        if top_n and i < len(tops):
            e["top_logprobs"] = [{"token": tt.text(t), "logprob": l, "bytes": list(tt.token_bytes(t))}
                                 for l, t in tops[i][:top_n]]
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
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": top_list if top_n else None,
            "text_offset": offsets}


# ---- responses -------------------------------------------------------------------------------------------
def finish_reason(reason: Optional[dict]) -> Optional[str]:
    """The scheduler's finish type as OpenAI's: stop | length (an abort reads as stop)."""
    if reason is None:
        return None
    t = reason.get("type")
    return "length" if t == "length" else "stop"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def batch_usage(outs: list, n: int) -> dict:
    """Usage of ``len(outs) // n`` prompts times n choices: each prompt counts once (its copies share it),
    completions add up, and ``cached_tokens`` is the best hit among a prompt's copies."""
    prompt = cached = completion = 0
    for k in range(0, len(outs), n):
        group = outs[k:k + n]
        prompt += group[0].prompt_tokens
        cached += max(o.cached_tokens for o in group)
        completion += sum(o.completion_tokens for o in group)
    return usage(prompt, completion, cached)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())
