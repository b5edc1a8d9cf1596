"""Keep xgrammar and outlines-core sound: fold ``allOf`` into its parent, refuse what they would drop.

Both libraries drop some keywords silently, so a finished output could fail the schema. Before lowering,
:func:`make_sound` (on a schema already through :func:`.schema_prep.prepare_schema`'s ``$ref`` rewrite):

1. **merges ``allOf``** into the subschema that holds it (xgrammar lowered the branches only, losing the
   parent's keywords, ``type`` included). A branch that is a local ``$ref`` is inlined. Keywords merge
   by meaning: ``properties`` union (a key in both gets ``allOf`` of both schemas, merged in turn),
   ``required`` union, ``type`` intersection, lower bounds max, upper bounds min, annotations kept from the
   parent; anything else that differs between the parts is refused. ``additionalProperties`` next to
   properties declared by another part is refused (the merge would let those through where the part
   forbids them).
2. **drops the keywords of excluded types** (``properties`` beside ``type: array``: no instance can fail them,
   and outlines-core took them for an object) and **distributes** the keywords beside ``anyOf``/``oneOf``
   into each branch (both libraries lower the branches alone and lose the parent's keywords);
3. **refuses** (ValueError naming the keyword and where it is) each keyword the backend does not enforce:
   ``uniqueItems``, ``not``, ``if``/``then``/``else``, ``contains``, ``dependent*``, ``propertyNames``,
   ``unevaluated*``, a non-integral ``multipleOf``, a ``format`` the backend does not know (for outlines-core
   also ``time``, ``email``, ``uri``, whose regexes break the JSON string), a ``pattern`` beside a
   ``format``, a ``pattern`` beside ``minLength``/``maxLength`` unless the pattern already implies them
   (Python's ``re`` gives the widths), a ``patternProperties`` key that matches a declared property,
   and a ``oneOf`` whose branches are not provably disjoint (distinct types, or distinct ``const``/``enum``
   values of one required property): both libraries treat ``oneOf`` as ``anyOf``.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from .schema_merge import ANNOTATIONS, schema_refusal, type_set, merge_all_of
from .schema_prep import subschemas

_ALWAYS_REFUSED = (
    "not",
    "if",
    "then",
    "else",
    "contains",
    "minContains",
    "maxContains",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "$dynamicRef",
)
XGRAMMAR_FORMATS = frozenset(
    {
        "date",
        "time",
        "date-time",
        "duration",
        "email",
        "uuid",
        "uri",
        "uri-reference",
        "uri-template",
        "ipv4",
        "ipv6",
        "hostname",
        "json-pointer",
        "relative-json-pointer",
    }
)
# outlines-core's regexes for time, email and uri break the JSON string they sit in (0.1.x): TIME has "\\."
# (a backslash, then any character: "01:08:31\*57" is an invalid escape), URI "[^\s]+" lets a '"' through and
# EMAIL's quoted local part starts with a bare '"'; so outlines refuses those formats by name
OUTLINES_FORMATS = frozenset({"date", "date-time", "uuid"})
_NUMBER_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


_BY_TYPE = {  # keywords that constrain instances of one type only (JSON Schema validation, section 6)
    "object": (
        "properties",
        "additionalProperties",
        "patternProperties",
        "required",
        "minProperties",
        "maxProperties",
        "propertyNames",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
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
    "string": ("minLength", "maxLength", "pattern"),
    "number": _NUMBER_KEYWORDS,
}


def prune_inapplicable(node: dict) -> None:
    """Drop, in place, the keywords of types that ``node["type"]`` excludes: they cannot reject an instance of
    its types, yet outlines-core reads ``properties`` beside ``type: array`` as an object (the output ``{}``)."""
    t = node.get("type")
    if not (isinstance(t, str) or isinstance(t, list) and all(isinstance(x, str) for x in t)):
        return
    types = type_set(t) | ({"number"} if "integer" in type_set(t) else set())
    for kind, keys in _BY_TYPE.items():
        if kind not in types:
            for k in keys:
                node.pop(k, None)


def distribute(root: dict, node: dict, backend: str, path: list[str]) -> None:
    """Move the keywords beside ``anyOf``/``oneOf`` into each branch, in place: ``{P, anyOf: [A, B]}`` becomes
    ``{anyOf: [P+A, P+B]}`` (the same instances; for ``oneOf`` too, as exactly one of P+A, P+B holds iff P and
    exactly one of A, B do). Both libraries lower the branches alone, dropping P: Snowplow's Slack schema
    (``additionalProperties: false`` beside ``anyOf: [{required: [text]}, ...]``) got extra keys from xgrammar
    and ``{}`` from outlines-core. Branches merge as in :func:`merge_all_of`; a clash is refused by name."""
    for kw in ("anyOf", "oneOf"):
        branches = node.get(kw)
        rest = {k: v for k, v in node.items() if k != kw and k not in ANNOTATIONS}
        if not isinstance(branches, list) or not rest:
            continue
        merged = []
        for branch in branches:
            if branch is False:
                continue  # matches nothing, with or without P
            part = {"allOf": [copy.deepcopy(rest), {} if branch is True else copy.deepcopy(branch)]}
            merge_all_of(root, part, backend, path + [kw], kw=kw)
            merged.append(part)
        for k in rest:
            del node[k]
        node[kw] = merged
        return  # another combinator among ``rest`` is now inside each branch, distributed when reached


def _values(sub: Any) -> set[str] | None:
    """The values (as ``repr``) that ``sub``'s ``const``/``enum`` allow, looking into an ``allOf`` not merged yet
    (a property both the parent and a distributed branch declare), or None when nothing limits them."""
    if not isinstance(sub, dict):
        return None
    out = None
    for part in [sub] + [p for p in sub.get("allOf") or [] if isinstance(p, dict)]:
        vals = [part["const"]] if "const" in part else part.get("enum")
        if isinstance(vals, list):
            out = {repr(v) for v in vals} if out is None else out & {repr(v) for v in vals}
    return out


def _disjoint(branches: list) -> bool:
    """True when no instance can match two of ``branches`` (by type, or by a required discriminator)."""
    if not all(isinstance(b, dict) for b in branches):
        return False
    types = [type_set(b["type"]) if "type" in b else None for b in branches]
    if all(t is not None for t in types):
        norm = [t | ({"integer"} if "number" in t else set()) for t in types]
        if all(not (norm[i] & norm[j]) for i in range(len(norm)) for j in range(i)):
            return True
    for key in branches[0].get("properties") or {}:
        values = []
        for b in branches:
            vals = _values((b.get("properties") or {}).get(key))
            if key not in (b.get("required") or []) or vals is None:
                break
            values.append(vals)
        else:
            if all(not (values[i] & values[j]) for i in range(len(values)) for j in range(i)):
                return True
    return False


def _implied(pattern: str, lo: int, hi: int | None) -> bool:
    """Whether every full match of ``pattern`` has between ``lo`` and ``hi`` characters."""
    try:
        import re._parser as sre_parse  # Python >= 3.11
    except ImportError:  # pragma: no cover
        import sre_parse
    try:
        wmin, wmax = sre_parse.parse(pattern).getwidth()
    except (re.error, RecursionError, OverflowError):
        return False
    anchored = pattern.startswith("^") and pattern.endswith("$") and not pattern.endswith("\\$")
    return anchored and wmin >= lo and (hi is None or wmax <= hi)


def _check_node(node: dict, backend: str, path: list[str]) -> None:
    for k in _ALWAYS_REFUSED:
        if k in node:
            raise schema_refusal(backend, k, path + [k], "not enforced by its grammar")
    if node.get("uniqueItems") is True and not (isinstance(node.get("maxItems"), int) and node["maxItems"] <= 1):
        raise schema_refusal(backend, "uniqueItems", path, "a grammar cannot express it")
    mult = node.get("multipleOf")
    if isinstance(mult, (int, float)) and not isinstance(mult, bool) and not float(mult).is_integer():
        raise schema_refusal(backend, "multipleOf", path, "only integral multipleOf is enforced")
    if backend == "outlines" and ("minProperties" in node or "maxProperties" in node):
        raise schema_refusal(
            backend,
            "minProperties" if "minProperties" in node else "maxProperties",
            path,
            "property counts are not enforced",
        )
    if backend == "outlines" and any(k in node for k in _NUMBER_KEYWORDS):
        k = next(k for k in _NUMBER_KEYWORDS if k in node)
        raise schema_refusal(backend, k, path, "number bounds are not enforced")
    fmt = node.get("format")
    known = XGRAMMAR_FORMATS if backend == "xgrammar" else OUTLINES_FORMATS
    if isinstance(fmt, str) and fmt not in known:
        raise schema_refusal(backend, "format", path, f"format {fmt!r} is not enforced")
    pat = node.get("pattern")
    if isinstance(pat, str) and isinstance(fmt, str):
        raise schema_refusal(backend, "format", path, "a 'pattern' beside a 'format' would be dropped")
    if (
        isinstance(pat, str)
        and ("minLength" in node or "maxLength" in node)
        and not _implied(pat, node.get("minLength", 0), node.get("maxLength"))
    ):
        key = "maxLength" if "maxLength" in node else "minLength"
        raise schema_refusal(backend, key, path, "a length beside a 'pattern' that does not imply it would be dropped")
    props, pprops = node.get("properties"), node.get("patternProperties")
    if isinstance(props, dict) and isinstance(pprops, dict):
        for key in pprops:
            hit = next((p for p in props if re.search(key, p)), None)
            if hit is not None:
                raise schema_refusal(
                    backend, "patternProperties", path, f"{key!r} matches the declared property {hit!r}"
                )
    one = node.get("oneOf")
    if isinstance(one, list) and len(one) > 1 and not _disjoint(one):
        raise schema_refusal(backend, "oneOf", path, "its branches may overlap (it would act as anyOf)")


def make_sound(schema: Any, backend: str) -> Any:
    """``schema`` with every ``allOf`` merged, checked for what ``backend`` drops; modified in place.

    Raises:
        ValueError: ``json_schema: '<keyword>' at <pointer> is not supported by <backend>: <why> ...``.
    """
    if not isinstance(schema, dict):
        return schema
    stack = [(schema, [])]
    while stack:
        node, path = stack.pop()
        if not isinstance(node, dict):
            continue
        merge_all_of(schema, node, backend, path)
        prune_inapplicable(node)
        distribute(schema, node, backend, path)
        _check_node(node, backend, path)
        stack.extend((sub, path + suffix) for suffix, sub in subschemas(node))
    return schema
