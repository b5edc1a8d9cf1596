"""``allOf`` merging for :mod:`.schema_sound`: :func:`merge_all_of` folds each part (a local ``$ref`` inlined)
into the subschema that holds it, keyword by keyword by meaning, and refuses a clash by name (the rules are step 1
of :mod:`.schema_sound`'s doc).

Its own file because merging two schemas into one is one idea, apart from checking what a backend drops. It also
holds what both need (``schema_refusal``, ``type_set``, ``ANNOTATIONS``), so it is a leaf that ``schema_sound`` imports.
"""

from __future__ import annotations

import copy
from typing import Any

from .json_pointer import json_pointer, split_pointer

ANNOTATIONS = (
    "title",
    "description",
    "$comment",
    "examples",
    "default",
    "$schema",
    "$id",
    "id",
    "definitions",
    "$defs",
    "readOnly",
    "writeOnly",
    "deprecated",
)
_LOWER = ("minLength", "minItems", "minProperties", "minimum", "exclusiveMinimum")
_UPPER = ("maxLength", "maxItems", "maxProperties", "maximum", "exclusiveMaximum")


def schema_refusal(backend: str, keyword: str, path: list[str], why: str) -> ValueError:
    return ValueError(
        f"json_schema: '{keyword}' at {json_pointer(path) or '/'} is not supported by {backend}: "
        f"{why} (use --grammar-backend llguidance)"
    )


def _resolve(root: dict, ref: str) -> Any:
    node: Any = root
    for part in split_pointer(ref[1:]):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def type_set(t: Any) -> set[str]:
    return set(t) if isinstance(t, list) else {t}


def _merge_into(a: dict, b: dict, backend: str, path: list[str], kw: str = "allOf") -> None:
    for k, v in b.items():
        if k not in a:
            if (
                k in ("additionalProperties", "patternProperties")
                and isinstance(a.get("properties"), dict)
                and set(a["properties"]) - set(b.get("properties") or {})
            ):
                raise schema_refusal(backend, kw, path, f"'{k}' of one part would constrain the properties of another")
            a[k] = copy.deepcopy(v)
        elif k == "properties" and isinstance(v, dict) and isinstance(a[k], dict):
            extra = set(v) - set(a[k])
            if extra and ("additionalProperties" in a or "patternProperties" in a):
                raise schema_refusal(
                    backend, kw, path, "'additionalProperties' of one part would constrain the properties of another"
                )
            for name, sub in v.items():
                if name not in a[k] or a[k][name] == sub:
                    a[k][name] = copy.deepcopy(sub)
                else:
                    a[k][name] = {"allOf": [a[k][name], copy.deepcopy(sub)]}
        elif k == "required" and isinstance(v, list) and isinstance(a[k], list):
            a[k] = a[k] + [x for x in v if x not in a[k]]
        elif k == "type":
            ta, tb = type_set(a[k]), type_set(v)
            both = (ta & tb) | (
                {"integer"} if ("integer" in ta and "number" in tb) or ("number" in ta and "integer" in tb) else set()
            )
            if not both:
                raise schema_refusal(backend, kw, path, f"the parts' types {sorted(ta)} and {sorted(tb)} do not meet")
            a[k] = sorted(both) if len(both) > 1 else both.pop()
        elif a[k] == v or k in ANNOTATIONS:
            continue
        elif k in _LOWER and isinstance(v, (int, float)) and isinstance(a[k], (int, float)):
            a[k] = max(a[k], v)
        elif k in _UPPER and isinstance(v, (int, float)) and isinstance(a[k], (int, float)):
            a[k] = min(a[k], v)
        else:
            raise schema_refusal(backend, kw, path, f"'{k}' differs between its parts")


def merge_all_of(root: dict, node: dict, backend: str, path: list[str], depth: int = 0, kw: str = "allOf") -> None:
    """Fold ``node["allOf"]`` (and any ``allOf`` it brings in) into ``node``, in place; see the module doc.
    ``kw`` is the keyword refusals name (the ``anyOf``/``oneOf`` being distributed, see :func:`distribute`)."""
    while "allOf" in node:
        if depth > 16:
            raise schema_refusal(backend, kw, path, "nested too deeply")
        parts = node.pop("allOf")
        if not isinstance(parts, list):
            raise schema_refusal(backend, kw, path, "not a list")
        for part in parts:
            if part is True or part == {}:
                continue
            if part is False:
                raise schema_refusal(backend, kw, path, "a part is `false`")
            part = copy.deepcopy(part)
            while isinstance(part, dict) and isinstance(part.get("$ref"), str) and part["$ref"].startswith("#"):
                ref = part.pop("$ref")
                target = copy.deepcopy(_resolve(root, ref))
                if not isinstance(target, dict) or "$ref" in target and target["$ref"] == ref:
                    raise schema_refusal(backend, kw, path, f"cannot inline {ref!r}")
                _merge_into(part, target, backend, path, kw)
            if "$ref" in part:
                raise schema_refusal(backend, kw, path, "a part holds a $ref that is not local")
            merge_all_of(root, part, backend, path, depth + 1, kw)
            _merge_into(node, part, backend, path, kw)
        depth += 1
