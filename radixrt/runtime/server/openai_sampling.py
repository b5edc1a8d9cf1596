"""An OpenAI request as SGLang sampling parameters, and validation fields mapped back to OpenAI's names.

Default ``max_tokens``: when neither ``max_tokens`` nor ``max_completion_tokens`` is given, a request may
generate up to the room left in the context (context length minus prompt tokens).
"""
from __future__ import annotations

from typing import Any, Optional

from radixrt.runtime.server.openai_protocol import ApiError, _Common


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


# Native validation fields under their OpenAI names. In an OpenAI request every sampling parameter is
# built here with its right type, so the one ``sampling_params`` error left is two grammars at once.
_PARAM_MAP = {"min_new_tokens": "min_tokens", "top_logprobs_num": "logprobs",
              "json_schema": "response_format.json_schema.schema", "sampling_params": "response_format"}


def openai_param(native: Optional[str], prompt_param: str, max_param: str) -> Optional[str]:
    """The OpenAI request field of a native validation field (:attr:`ValidationError.param`)."""
    if native in ("text", "input_ids"):
        return prompt_param
    if native == "max_new_tokens":
        return max_param
    return _PARAM_MAP.get(native, native)
