"""Backend-independent checks and helpers for grammar specs.

``validate_spec`` is what the tokenizer manager calls before a request is queued, so a bad spec becomes a
400 with a message that names the field. Backends call it again in ``compile`` so that every path gives
the same errors. ``choices_to_regex`` turns a ``select``/``choice`` list into a regex both backends accept.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .json_pointer import json_pointer


GRAMMAR_KINDS = ("json_schema", "regex", "ebnf", "structural_tag")
JSON_OBJECT_SCHEMA = '{"type":"object"}'  # what OpenAI's response_format {"type": "json_object"} maps to

# Keywords whose values are instance data, not subschemas: a "pattern" key inside them is not a regex.
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "example"})
# Characters with a meaning in regex syntax (outside a class); choices escape exactly these.
_REGEX_META = frozenset("\\.^$|?*+()[]{}")


def _where(path: list[str]) -> str:
    """``path`` for a message: its JSON pointer, the root shown as "/"."""
    return json_pointer(path) or "/"


def _compile_regex(pattern: str) -> None:
    """Python's ``re`` (what jsonschema's "regex" format check uses too); ``\\p{..}`` is refused, which
    neither backend could compile anyway."""
    re.compile(pattern)


def _check_patterns(node: Any, path: list[str]) -> None:
    """Compile every ``pattern`` and ``patternProperties`` key under ``node``; ValueError names the place."""
    if isinstance(node, list):
        for i, item in enumerate(node):
            _check_patterns(item, path + [str(i)])
        return
    if not isinstance(node, dict):
        return
    pat = node.get("pattern")
    if isinstance(pat, str):
        try:
            _compile_regex(pat)
        except (re.error, RecursionError, OverflowError) as e:
            raise ValueError(f"json_schema: 'pattern' at {_where(path)} is not a valid regex: {pat!r}: {e}") from None
    pprops = node.get("patternProperties")
    if isinstance(pprops, dict):
        for key in pprops:
            try:
                _compile_regex(key)
            except (re.error, RecursionError, OverflowError) as e:
                raise ValueError(
                    f"json_schema: 'patternProperties' key at {_where(path + ['patternProperties'])} "
                    f"is not a valid regex: {key!r}: {e}"
                ) from None
    for key, value in node.items():
        if key in _DATA_KEYWORDS or isinstance(value, str):
            continue
        _check_patterns(value, path + [key])


def _loads(field: str, text: str) -> Any:
    """Strict JSON (no NaN/Infinity); ValueError names ``field``."""

    def reject(name: str):
        raise ValueError(f"{field}: {name} is not valid JSON (RFC 8259 has no NaN/Infinity)")

    try:
        return json.loads(text, parse_constant=reject)
    except json.JSONDecodeError as e:
        raise ValueError(f"{field}: not valid JSON: {e}") from None


def _validate_json_schema(spec: Any) -> str:
    if isinstance(spec, (bytes, bytearray)):
        spec = spec.decode("utf-8", errors="strict")
    if isinstance(spec, str):
        obj = _loads("json_schema", spec)
    elif isinstance(spec, (dict, bool)):
        obj = spec
    else:
        raise ValueError(f"json_schema: must be a JSON string, an object or a boolean, got {type(spec).__name__}")
    if not isinstance(obj, (dict, bool)):
        raise ValueError(f"json_schema: a schema must be a JSON object or a boolean, got {type(obj).__name__}")
    if isinstance(obj, dict):
        _check_patterns(obj, [])
        from jsonschema import validators
        from jsonschema.exceptions import SchemaError

        # Draft 2020-12 unless the schema declares another draft with "$schema" (draft-04 corpora use
        # boolean exclusiveMinimum, which 2020-12 rejects).
        cls = validators.validator_for(obj, default=validators.Draft202012Validator)
        try:
            cls.check_schema(obj)
        except SchemaError as e:
            where = _where([str(p) for p in e.path])
            raise ValueError(f"json_schema: invalid schema at {where}: {e.message}") from None
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


MAX_SCHEMA_DEPTH = 64  # deeper nesting overflows the recursion limit of a compile (docs/measurements.md)


def validate_spec(kind: str, spec: Any) -> str:
    """Check a grammar spec without any backend and return its normalized text.

    Args:
        kind: one of :data:`GRAMMAR_KINDS`.
        spec: the spec text. For ``json_schema`` a ``dict`` or ``bool`` is accepted too.

    Returns:
        ``json_schema``/``structural_tag``: compact JSON text (key order kept, since it is the order the
        grammar generates properties in). ``regex``/``ebnf``: the text unchanged.

    Raises:
        ValueError: the message starts with the field at fault (``kind:``, ``json_schema:``, ``regex:``,
            ``ebnf:``, ``structural_tag:``), e.g.
            ``json_schema: 'pattern' at /properties/x is not a valid regex: '(': ...``.
    """
    if kind not in GRAMMAR_KINDS:
        raise ValueError(f"kind: unknown grammar kind {kind!r}; choose one of {list(GRAMMAR_KINDS)}")
    if kind == "json_schema":
        try:
            return _validate_json_schema(spec)
        except RecursionError:  # the checks (and both backends) recurse over the schema
            raise ValueError(f"json_schema: nested too deeply (at most about {MAX_SCHEMA_DEPTH} levels)") from None
    if not isinstance(spec, str):
        raise ValueError(f"{kind}: must be a string, got {type(spec).__name__}")
    if kind == "regex":
        if spec == "":
            raise ValueError("regex: the pattern is empty")
        try:
            _compile_regex(spec)
        except (re.error, RecursionError, OverflowError) as e:
            raise ValueError(f"regex: not a valid regex: {spec!r}: {e}") from None
        return spec
    if kind == "ebnf":
        if not spec.strip():
            raise ValueError("ebnf: the grammar is empty")
        return spec
    # structural_tag
    obj = _loads("structural_tag", spec)
    if not isinstance(obj, dict):
        raise ValueError(f"structural_tag: must be a JSON object, got {type(obj).__name__}")
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _escape_literal(text: str) -> str:
    out = []
    for ch in text:
        if ch in _REGEX_META:
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def choices_to_regex(choices: list[str]) -> str:
    """A regex matching exactly one of ``choices`` (each escaped literally), e.g. ``(Yes|No)``.

    Only regex metacharacters and control characters are escaped, so xgrammar's and outlines-core's
    regex parsers (stricter than Python's about escapes such as ``\\ ``) both accept the result.
    Duplicates are dropped, the first occurrence keeping its place.

    Raises:
        ValueError: ``choices`` is not a non-empty list, or an item is not a non-empty string
            (the message names ``choices[i]``).
    """
    if not isinstance(choices, (list, tuple)) or len(choices) == 0:
        raise ValueError("choices: must be a non-empty list of strings")
    seen: dict[str, None] = {}
    for i, c in enumerate(choices):
        if not isinstance(c, str):
            raise ValueError(f"choices[{i}]: must be a string, got {type(c).__name__}")
        if c == "":
            raise ValueError(f"choices[{i}]: must not be empty")
        seen.setdefault(c, None)
    return "(" + "|".join(_escape_literal(c) for c in seen) + ")"
