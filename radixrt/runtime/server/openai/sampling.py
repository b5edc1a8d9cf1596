"""An OpenAI request as SGLang sampling parameters, and validation fields mapped back to OpenAI's names.

Default ``max_tokens``: when neither ``max_tokens`` nor ``max_completion_tokens`` is given, a request may
generate up to the room left in the context (the smaller of the context length and the KV pool's size,
minus the prompt tokens).
"""

from __future__ import annotations

import json
from typing import Any, Optional

from radixrt.runtime.server.openai.protocol import ApiError, _Common


# ---- request -> sampling params -------------------------------------------------------------------------
def response_format_grammar(rf: Optional[dict]) -> Optional[tuple[str, Any]]:
    """``response_format`` -> ``("json_schema", schema)`` or None; edge case 11's malformed variants -> 400."""
    from radixrt.runtime.constrained import JSON_OBJECT_SCHEMA

    if rf is None:
        return None
    t = rf.get("type")
    if t is None:
        raise ApiError(
            "response_format.type is required: one of 'text', 'json_object', 'json_schema'",
            param="response_format.type",
        )
    if t == "text":
        return None
    if t == "json_object":
        return "json_schema", JSON_OBJECT_SCHEMA
    if t != "json_schema":
        raise ApiError(
            f"response_format.type must be one of 'text', 'json_object', 'json_schema', got {t!r}",
            param="response_format.type",
        )
    js = rf.get("json_schema")
    if js is None:
        raise ApiError(
            "response_format of type 'json_schema' needs a 'json_schema' object ({'name': ..., 'schema': {...}})",
            param="response_format.json_schema",
        )
    if not isinstance(js, dict):
        raise ApiError(
            f"response_format.json_schema must be an object, got {type(js).__name__}",
            param="response_format.json_schema",
        )
    if "schema" not in js or js["schema"] is None:
        raise ApiError(
            "response_format.json_schema.schema is required (a JSON Schema object)",
            param="response_format.json_schema.schema",
        )
    schema = js["schema"]
    if not isinstance(schema, dict):
        raise ApiError(
            f"response_format.json_schema.schema must be a JSON object, got {type(schema).__name__}",
            param="response_format.json_schema.schema",
        )
    name = js.get("name")
    if name is not None and not isinstance(name, str):
        raise ApiError("response_format.json_schema.name must be a string", param="response_format.json_schema.name")
    strict = js.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ApiError(
            "response_format.json_schema.strict must be a boolean", param="response_format.json_schema.strict"
        )
    return "json_schema", schema


_OPENAI_RANGES = (("temperature", 0, 2), ("frequency_penalty", -2, 2), ("presence_penalty", -2, 2))


def sampling_params(req: _Common, max_new_tokens: Optional[int], max_param: str) -> tuple[dict, Optional[str]]:
    """SGLang sampling params of an OpenAI request (still to be checked by ``normalize``), and the request
    field its grammar came from (errors of that grammar name it), or None.

    Raises:
        ApiError: 400 naming the field: ``stream_options`` without ``stream``, a bad ``max_tokens``/``n``,
            ``temperature`` outside [0, 2], a penalty outside [-2, 2], two grammar sources at once, a malformed
            ``response_format`` or ``structured_outputs``, a refused key (``guided_whitespace_pattern``).
    """
    if max_new_tokens is not None and max_new_tokens < 1:
        raise ApiError(f"{max_param} must be >= 1, got {max_new_tokens}", param=max_param)
    if req.stream_options is not None and not req.stream:  # as OpenAI and vLLM answer
        raise ApiError("stream_options is only allowed with stream: true", param="stream_options")
    if req.n < 1:
        raise ApiError(f"n must be >= 1, got {req.n}", param="n")
    if req.n > 128:
        raise ApiError(f"n must be <= 128, got {req.n}", param="n")
    fields = vars(req)  # the request model's field values, by name
    for k, lo, hi in _OPENAI_RANGES:  # OpenAI's documented ranges (the native API keeps SGLang's wider ones)
        v = fields[k]
        if v is not None and not lo <= v <= hi:
            raise ApiError(f"{k} must be between {lo} and {hi}, got {v}", param=k)
    sp: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    for k in (
        "temperature",
        "top_p",
        "frequency_penalty",
        "presence_penalty",
        "top_k",
        "min_p",
        "repetition_penalty",
        "seed",
        "logit_bias",
    ):
        v = fields[k]
        if v is not None:
            sp[k] = v
    if req.stop is not None:
        sp["stop"] = [req.stop] if isinstance(req.stop, str) else list(req.stop)
    if req.stop_token_ids:
        sp["stop_token_ids"] = list(req.stop_token_ids)
    sp["ignore_eos"] = req.ignore_eos
    sp["min_new_tokens"] = req.min_tokens
    sp["skip_special_tokens"] = req.skip_special_tokens
    sp["spaces_between_special_tokens"] = req.spaces_between_special_tokens
    sp["no_stop_trim"] = req.no_stop_trim or req.include_stop_str_in_output
    if not req.speculative:
        sp["speculative"] = False
    if req.guided_whitespace_pattern is not None:
        raise ApiError(
            "guided_whitespace_pattern is not supported: the grammar backends take no whitespace regex",
            param="guided_whitespace_pattern",
        )
    g = response_format_grammar(req.response_format)
    if g is not None and (req.regex is not None or req.ebnf is not None):
        raise ApiError(
            "response_format json_schema/json_object cannot be combined with regex or ebnf", param="response_format"
        )
    sources = [(src, kind, spec) for src, kind, spec in _grammars(req, g) if spec is not None]
    if len(sources) > 1:
        raise ApiError(f"only one grammar may be given, got {[x[0] for x in sources]}", param=sources[1][0])
    if not sources:
        return sp, None
    src, kind, spec = sources[0]
    sp[kind] = spec
    return sp, src


def _grammars(req: _Common, rf) -> list[tuple[str, str, Any]]:
    """``(request field, native grammar kind, spec)`` of every grammar source (spec None when unset)."""
    out = [
        ("regex", "regex", req.regex),
        ("ebnf", "ebnf", req.ebnf),
        ("response_format.json_schema.schema", "json_schema", rf[1] if rf else None),
        ("guided_json", "json_schema", req.guided_json),
        ("guided_regex", "regex", req.guided_regex),
        ("guided_choice", "choices", req.guided_choice),
        ("guided_grammar", "ebnf", req.guided_grammar),
    ]
    so = req.structured_outputs
    if so is not None:
        if so.whitespace_pattern is not None:
            raise ApiError(
                "structured_outputs.whitespace_pattern is not supported: the grammar backends take no whitespace regex",
                param="structured_outputs.whitespace_pattern",
            )
        from radixrt.runtime.constrained import JSON_OBJECT_SCHEMA

        tag = so.structural_tag
        given = [
            ("structured_outputs.json", "json_schema", so.json_),
            ("structured_outputs.regex", "regex", so.regex),
            ("structured_outputs.choice", "choices", so.choice),
            ("structured_outputs.grammar", "ebnf", so.grammar),
            ("structured_outputs.json_object", "json_schema", JSON_OBJECT_SCHEMA if so.json_object else None),
            ("structured_outputs.structural_tag", "structural_tag", json.dumps(tag) if isinstance(tag, dict) else tag),
        ]
        if not any(x[2] is not None for x in given):
            raise ApiError(
                "structured_outputs needs one of json, regex, choice, grammar, json_object, structural_tag",
                param="structured_outputs",
            )
        out += given
    return out


def n_seeds(seed: Optional[int], n: int) -> list[Optional[int]]:
    """Seeds of the n copies: ``seed + i`` (distinct, reproducible) or None (the scheduler's own)."""
    return [None if seed is None else seed + i for i in range(n)]


# Native validation fields under their OpenAI names. In an OpenAI request every sampling parameter is
# built here with its right type, so the one ``sampling_params`` error left is two grammars at once.
_PARAM_MAP = {
    "min_new_tokens": "min_tokens",
    "top_logprobs_num": "logprobs",
    "json_schema": "response_format.json_schema.schema",
    "sampling_params": "response_format",
}
GRAMMAR_PARAMS = ("json_schema", "regex", "ebnf", "structural_tag", "choices")


def openai_param(
    native: Optional[str], prompt_param: str, max_param: str, grammar_param: Optional[str] = None
) -> Optional[str]:
    """The OpenAI request field of a native validation field (:attr:`ValidationError.param`);
    ``grammar_param``: the field the request's grammar came from (``guided_json``, ``tools`` ...)."""
    if native in ("text", "input_ids"):
        return prompt_param
    if native == "max_new_tokens":
        return max_param
    if grammar_param is not None and native in GRAMMAR_PARAMS:
        return grammar_param
    return _PARAM_MAP.get(native, native)
