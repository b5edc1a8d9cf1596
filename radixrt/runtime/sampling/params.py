"""Validation of user sampling parameters into a :class:`SamplingParams` struct.

Every check raises :class:`ValidationError` (a ``ValueError``) whose ``param`` names the field, before
anything is queued. Unknown keys are
rejected (a typo such as ``max_token`` must not silently fall back to a default).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import msgspec

from radixrt.runtime.errors import ValidationError
from radixrt.runtime.io_struct import SamplingParams

_FIELDS = set(SamplingParams.__struct_fields__)
_GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")
MAX_N = 128  # samples per prompt (n)
KNOWN_KEYS = _FIELDS | {"choices", "sampling_seed", "custom_params"}  # every key normalize() accepts


def _num(
    name: str, v: Any, lo: float | None = None, hi: float | None = None, integer: bool = False, lo_open: bool = False
) -> None:
    ok_type = isinstance(v, int) if integer else isinstance(v, (int, float))
    if not ok_type or isinstance(v, bool):
        raise ValidationError(f"{name} must be {'an integer' if integer else 'a number'}, got {v!r}", name)
    if isinstance(v, float) and not math.isfinite(v):
        raise ValidationError(f"{name} must be finite, got {v!r}", name)
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise ValidationError(f"{name} must be {'>' if lo_open else '>='} {lo}, got {v!r}", name)
    if hi is not None and v > hi:
        raise ValidationError(f"{name} must be <= {hi}, got {v!r}", name)


def normalize(params: dict | SamplingParams | None) -> SamplingParams:
    """Check and convert user sampling parameters.

    Accepts SGLang's keys (``max_new_tokens``, ``json_schema`` as dict or string, ``choices`` ...).
    ``choices`` becomes a ``regex`` alternation.

    Raises:
        ValidationError: an unknown key, a wrong type, a negative / NaN / out-of-range value, or two grammars.
    """
    if params is None:
        params = {}
    if isinstance(params, SamplingParams):
        params = msgspec.structs.asdict(params)
    if not isinstance(params, dict):
        raise ValidationError(f"sampling_params must be an object, got {type(params).__name__}", "sampling_params")
    # SGLang's clients send None for "not set" (its frontend sends regex=None, stop_token_ids=None ...);
    # only max_new_tokens gives None a meaning ("the room left in the context").
    p = {k: v for k, v in params.items() if v is not None or k == "max_new_tokens"}
    choices = p.pop("choices", None)
    _aliases(p)
    unknown = sorted(set(p) - _FIELDS)
    if unknown:
        raise ValidationError(
            f"unknown sampling parameter(s) {unknown}; known: {sorted(KNOWN_KEYS)}", "sampling_params"
        )
    if isinstance(p.get("json_schema"), (dict, bool)):
        p["json_schema"] = json.dumps(p["json_schema"])
    if isinstance(p.get("stop"), str):
        p["stop"] = [p["stop"]]
    if p.get("stop") is None:
        p.pop("stop", None)
    if choices is not None:
        from radixrt.runtime.constrained import choices_to_regex

        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
            raise ValidationError("choices must be a non-empty list of strings", "choices")
        if p.get("regex") is not None:  # choices become the regex: the given one would be dropped
            raise ValidationError("only one of choices and regex may be set", "choices")
        try:
            p["regex"] = choices_to_regex(choices)
        except ValueError as e:  # "choices[i]: must not be empty"
            raise ValidationError(str(e), "choices") from None
    try:
        sp = msgspec.convert(p, SamplingParams, strict=True)
    except msgspec.ValidationError as e:  # "Expected `int | null`, got `str` - at `$.max_new_tokens`"
        at = re.search(r"at `\$\.(\w+)", str(e))
        raise ValidationError(f"sampling_params: {e}", at.group(1) if at else "sampling_params") from None
    if sp.max_new_tokens is not None:
        _num("max_new_tokens", sp.max_new_tokens, lo=0, integer=True)
    _num("min_new_tokens", sp.min_new_tokens, lo=0, integer=True)
    if sp.max_new_tokens is not None and sp.min_new_tokens > sp.max_new_tokens:
        raise ValidationError(
            f"min_new_tokens ({sp.min_new_tokens}) must be <= max_new_tokens ({sp.max_new_tokens})", "min_new_tokens"
        )
    _num("temperature", sp.temperature, lo=0)
    _num("top_p", sp.top_p, lo=0, hi=1, lo_open=True)
    _num("top_k", sp.top_k, lo=-1, integer=True)
    if sp.top_k == 0:
        raise ValidationError("top_k must be -1 (off) or >= 1, got 0", "top_k")
    _num("min_p", sp.min_p, lo=0, hi=1)
    _num("frequency_penalty", sp.frequency_penalty, lo=-2, hi=2)
    _num("presence_penalty", sp.presence_penalty, lo=-2, hi=2)
    _num("repetition_penalty", sp.repetition_penalty, lo=0, hi=2, lo_open=True)
    if sp.seed is not None:
        _num("seed", sp.seed, lo=0, integer=True)
    _num("n", sp.n, lo=1, hi=MAX_N, integer=True)
    _num("stream_interval", sp.stream_interval, lo=1, integer=True)
    for s in sp.stop:
        if not s:
            raise ValidationError("stop strings must be non-empty", "stop")
    for t in sp.stop_token_ids:
        _num("stop_token_ids", t, lo=0, integer=True)
    for t in sp.reasoning_end_ids:
        _num("reasoning_end_ids", t, lo=0, integer=True)
    grammars = [g for g, v in _grammars(sp) if v is not None]
    if len(grammars) > 1:
        raise ValidationError(
            f"only one of {_GRAMMAR_FIELDS} (or choices) may be set, got {grammars}", "sampling_params"
        )
    return sp


def _aliases(p: dict) -> None:
    """SGLang keys that map onto ours: ``sampling_seed`` (newer SGLang) is ``seed``; ``custom_params`` is
    only read by a custom logit processor (refused at the top level), so it is checked and dropped;
    ``logit_bias`` keys become token ids."""
    if "sampling_seed" in p:
        seed = p.pop("sampling_seed")
        if "seed" in p and p["seed"] != seed:
            raise ValidationError(
                f"sampling_seed ({seed!r}) and seed ({p['seed']!r}) differ; give one", "sampling_seed"
            )
        p["seed"] = seed
    custom = p.pop("custom_params", None)
    if custom is not None and not isinstance(custom, dict):
        raise ValidationError(f"custom_params must be an object, got {type(custom).__name__}", "custom_params")
    if "logit_bias" in p:
        p["logit_bias"] = logit_bias(p["logit_bias"])


def logit_bias(bias: Any) -> dict[int, float]:
    """``{token id (int or decimal string): bias}`` -> ``{int: float}``; biases in [-100, 100] (OpenAI's
    range), added to the logits before sampling. Raises ValidationError naming ``logit_bias``."""
    if not isinstance(bias, dict):
        raise ValidationError(
            f"logit_bias must be an object of token id -> bias, got {type(bias).__name__}", "logit_bias"
        )
    out: dict[int, float] = {}
    for k, v in bias.items():
        tid = k if isinstance(k, int) and not isinstance(k, bool) else None
        if isinstance(k, str) and k.strip().isdigit():
            tid = int(k)
        if tid is None or tid < 0:
            raise ValidationError(f"logit_bias: key {k!r} is not a token id (a non-negative integer)", "logit_bias")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not -100 <= v <= 100:
            raise ValidationError(f"logit_bias[{k!r}] must be a number in [-100, 100], got {v!r}", "logit_bias")
        out[tid] = float(v)
    return out


def grammar_of(sp: SamplingParams) -> tuple[str, str] | None:
    """``(kind, spec)`` of the request's grammar, or None."""
    for g, v in _grammars(sp):
        if v is not None:
            return g, v
    return None


def _grammars(sp: SamplingParams) -> tuple[tuple[str, str | None], ...]:
    """Each of :data:`_GRAMMAR_FIELDS` with its value in ``sp``."""
    return (
        ("json_schema", sp.json_schema),
        ("regex", sp.regex),
        ("ebnf", sp.ebnf),
        ("structural_tag", sp.structural_tag),
    )
