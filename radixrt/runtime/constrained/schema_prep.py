"""Rewrite a JSON schema, before a backend lowers it, so that the grammar stays sound.

Both backends derive a grammar from ``type``; keywords on a subschema *without* ``type`` are silently
dropped (``{"maxLength": 2}`` would accept ``"foo"``). :func:`prepare_schema` returns a copy where:

1. **Typeless subschemas get a type.** With string/number/array keywords only, ``type`` becomes every
   JSON type (exactly the schema's meaning: the keywords constrain their own type, other types pass).
   With object keywords (``properties``, ``required``, ...), ``type`` becomes ``object`` (plus the other
   constrained types): real-world schemas routinely omit ``"type": "object"``, and generating a bare
   ``null`` for them would be useless. Subschemas with ``$ref``/``anyOf``/``oneOf``/``allOf``/``not``/
   ``if``/``enum``/``const`` are left alone.
2. **Arrays without ``items``/``prefixItems`` get ``"items": {}``, objects with other keywords but no
   ``properties``/``patternProperties``/``additionalProperties`` get ``"additionalProperties": {}``** (same
   meaning; xgrammar's strict mode would otherwise allow only ``[]``/``{}``, or fail to compile). A
   ``required`` key missing from ``properties`` is declared there with the ``additionalProperties``
   schema (backends ignore undeclared required keys).
3. **Integral ``multipleOf`` turns ``number`` into ``integer``** (only integers are multiples of an
   integer; backends enforce ``multipleOf`` on integers but ignore it on numbers).
4. **``$ref`` through embedded ``$id``/``id``/``$anchor``** is rewritten to a local ``#/...`` pointer.
   A ``$ref`` that cannot be resolved locally raises ValueError (backends would treat it as "anything").
5. **A ``type`` beside ``anyOf``/``oneOf`` is copied into each branch without one** (``string`` and (A or B)
   is (``string`` and A) or (``string`` and B)). xgrammar lowers only the branches, so
   ``{"type": "string", "anyOf": [{"pattern": ...}, {"format": ...}]}`` accepted an object (dev corpus,
   Snowplow). Branches holding a ``$ref`` are left alone.
"""

from __future__ import annotations

import copy
from typing import Any
from urllib.parse import urldefrag, urljoin

from .json_pointer import json_pointer, split_pointer

TYPE_KEYWORDS = {
    "object": (
        "properties",
        "patternProperties",
        "additionalProperties",
        "required",
        "minProperties",
        "maxProperties",
        "propertyNames",
        "dependentRequired",
        "dependentSchemas",
        "unevaluatedProperties",
    ),
    "array": (
        "items",
        "prefixItems",
        "additionalItems",
        "minItems",
        "maxItems",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "unevaluatedItems",
    ),
    "string": ("maxLength", "minLength", "pattern", "format", "contentEncoding", "contentMediaType"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
}
ALL_TYPES = ["object", "array", "string", "number", "boolean", "null"]
_SKIP_TYPING = ("$ref", "$dynamicRef", "anyOf", "oneOf", "allOf", "not", "if", "enum", "const")
# Where subschemas live: keyword -> "one" (a schema), "map" (name -> schema), "list" (schemas).
_SUBSCHEMAS = {
    "properties": "map",
    "patternProperties": "map",
    "$defs": "map",
    "definitions": "map",
    "dependentSchemas": "map",
    "items": "one",
    "additionalItems": "one",
    "additionalProperties": "one",
    "contains": "one",
    "propertyNames": "one",
    "not": "one",
    "if": "one",
    "then": "one",
    "else": "one",
    "unevaluatedItems": "one",
    "unevaluatedProperties": "one",
    "prefixItems": "list",
    "anyOf": "list",
    "oneOf": "list",
    "allOf": "list",
}


def subschemas(node: dict):
    """Yield ``(path suffix, subschema)`` for every direct subschema of ``node``."""
    for key, how in _SUBSCHEMAS.items():
        value = node.get(key)
        if how == "map" and isinstance(value, dict):
            for name, sub in value.items():
                yield [key, name], sub
        elif (how == "list" or key == "items") and isinstance(value, list):  # draft-04 tuple items
            for i, sub in enumerate(value):
                yield [key, str(i)], sub
        elif how == "one" and isinstance(value, (dict, bool)):
            yield [key], value


def _add_type(node: dict, expand_types: bool) -> None:
    if "type" not in node and not any(k in node for k in _SKIP_TYPING):
        groups = [t for t, kws in TYPE_KEYWORDS.items() if any(k in node for k in kws)]
        if groups and "object" in groups:
            node["type"] = groups
        elif groups and expand_types:
            node["type"] = list(ALL_TYPES)
    types = node.get("type")
    if (
        (types == "array" or isinstance(types, list) and "array" in types)
        and "items" not in node
        and "prefixItems" not in node
    ):
        node["items"] = {}  # same meaning; xgrammar's strict mode otherwise allows only [] here
    if types == "object" or isinstance(types, list) and "object" in types:
        undeclared = not any(k in node for k in ("properties", "patternProperties", "additionalProperties"))
        extra = node.get("additionalProperties", {})
        required = node.get("required")
        if isinstance(required, list) and extra is not False and "patternProperties" not in node:
            props = node.setdefault("properties", {})
            for key in required:  # backends only enforce required keys that are declared properties
                if isinstance(key, str) and isinstance(props, dict) and key not in props:
                    props[key] = extra if isinstance(extra, (dict, bool)) else {}
        if undeclared and len(node) > 1:
            node["additionalProperties"] = {}  # likewise: strict mode would allow only {}
    mult = node.get("multipleOf")
    if isinstance(mult, (int, float)) and not isinstance(mult, bool) and float(mult).is_integer() and mult > 0:
        types = node.get("type")
        if types == "number":
            node["type"] = "integer"
        elif isinstance(types, list) and "number" in types:
            node["type"] = [t for t in types if t not in ("number", "integer")] + ["integer"]


def _collect_ids(node: Any, base: str, path: list[str], ids: dict, bases: list) -> None:
    if not isinstance(node, dict):
        return
    ident = node.get("$id", node.get("id"))
    if isinstance(ident, str) and ident.startswith("#"):  # draft-04 plain-name fragment: an anchor
        ids[base + ident] = path
    elif isinstance(ident, str):
        base = urldefrag(urljoin(base, ident))[0]
        ids[base] = path
    anchor = node.get("$anchor")
    if isinstance(anchor, str):
        ids[base + "#" + anchor] = path
    bases.append((node, base, path))
    for suffix, sub in subschemas(node):
        _collect_ids(sub, base, path + suffix, ids, bases)


def _exists(root: Any, path: list[str]) -> bool:
    node = root
    for part in path:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


def _rewrite_refs(root: dict) -> None:
    ids: dict[str, list[str]] = {}
    nodes: list[tuple[dict, str, list[str]]] = []
    root_base = root.get("$id", root.get("id"))
    root_base = urldefrag(root_base)[0] if isinstance(root_base, str) else ""
    ids[root_base] = []
    _collect_ids(root, root_base, [], ids, nodes)
    for node, base, path in nodes:
        ref = node.get("$ref")
        if not isinstance(ref, str):
            continue
        if ref == "#" or ref.startswith("#/"):
            if base == root_base:
                continue  # plain local pointer: the backends resolve it
            inner = ids[base] + split_pointer(ref[1:])
            if _exists(root, inner) or not _exists(root, split_pointer(ref[1:])):
                node["$ref"] = "#" + json_pointer(inner)
            continue  # else: many real schemas mean the root document despite a nested id; keep it
        doc, frag = urldefrag(urljoin(base, ref))
        if frag and not frag.startswith("/"):  # "#anchor"
            target = ids.get(doc + "#" + frag)
            frag = ""
        else:
            target = ids.get(doc)
        if target is None:
            raise ValueError(
                f"json_schema: cannot resolve $ref {ref!r} at {json_pointer(path) or '/'}: only local "
                "pointers and embedded $id/$anchor are supported (nothing is fetched)"
            )
        node["$ref"] = "#" + json_pointer(target) + frag


def rewrite_local_refs(schema: Any) -> Any:
    """A deep copy of ``schema`` with rule 4 only (``$ref`` through embedded ids made local pointers).

    Raises:
        ValueError: a ``$ref`` that cannot be resolved within the schema.
    """
    if not isinstance(schema, dict):
        return schema
    out = copy.deepcopy(schema)
    _rewrite_refs(out)
    return out


def prepare_schema(schema: Any, expand_types: bool = True, explicit_any: bool = False) -> Any:
    """A rewritten deep copy of ``schema`` (a parsed JSON object or boolean); see the module doc.

    ``true`` becomes ``{}``. ``expand_types=False`` skips the "every JSON type" part of rule 1 (the
    subschema stays typeless, which outlines-core refuses with a clear error). ``explicit_any=True`` turns
    every empty subschema (``{}``/``true``) into ``{"type": [all types]}`` (outlines-core 0.2.14 splices an
    empty subschema's alternation unparenthesized: ``{"a":{}}`` would also match a bare ``null``).

    Raises:
        ValueError: a ``$ref`` that cannot be resolved within the schema; the root schema ``false``.
    """
    if schema is True:
        return {}
    if schema is False:
        raise ValueError("json_schema: the schema `false` accepts no value")
    if not isinstance(schema, dict):
        raise ValueError(f"json_schema: a schema must be an object or a boolean, got {type(schema).__name__}")
    out = copy.deepcopy(schema)
    _rewrite_refs(out)
    stack = [out]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            _add_type(node, expand_types)
            _type_branches(node)
            for suffix, sub in subschemas(node):
                if explicit_any and (sub is True or sub == {}):
                    _set_child(node, suffix, {"type": list(ALL_TYPES)})
                else:
                    stack.append(sub)
    if explicit_any and out == {}:
        out["type"] = list(ALL_TYPES)
    return out


def _type_branches(node: dict) -> None:
    """Rule 5: copy the node's ``type`` into its ``anyOf``/``oneOf`` branches that have none."""
    if "type" not in node:
        return
    for key in ("anyOf", "oneOf"):
        for branch in node.get(key) if isinstance(node.get(key), list) else []:
            if isinstance(branch, dict) and "type" not in branch and "$ref" not in branch:
                branch["type"] = copy.deepcopy(node["type"])


def _set_child(node: dict, suffix: list[str], value: Any) -> None:
    if len(suffix) == 1:
        node[suffix[0]] = value
    elif isinstance(node[suffix[0]], list):
        node[suffix[0]][int(suffix[1])] = value
    else:
        node[suffix[0]][suffix[1]] = value


def rewrite_patterns(schema: Any, fn) -> Any:
    """Replace, in place, every subschema's string ``pattern`` ``p`` by ``fn(p)``; returns ``schema``."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                node["pattern"] = fn(node["pattern"])
            stack.extend(sub for _, sub in subschemas(node))
    return schema
