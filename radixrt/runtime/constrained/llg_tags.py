"""Structural tags (tool calls inside free text) as an llguidance Lark grammar.

Input: the spellings :mod:`.xgrammar_backend` takes (``{"type": "structural_tag", "format": {"type":
"triggered_tags", "triggers": [...], "tags": [{"begin", "content": {"type": "json_schema", "json_schema"},
"end"}], "stop_after_first"}}``, a bare format, or SGLang's legacy ``{"structures", "triggers"}``).

Output: free text in which each trigger starts a tag: its ``begin`` text, a JSON value of its schema
(``%json``), its ``end`` text; then free text again (or the end, with ``stop_after_first``). The text before
a trigger is a *lazy* lexeme (llguidance ends it at the first trigger, so free text cannot contain one),
which is how llguidance's own ``StructTag`` lowers tool calls.
"""

from __future__ import annotations

import json

from .structural_tags import normalize_structural_tag


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False) if text else ""


def lowers_to_lark(text: str) -> bool:
    """True when :func:`structural_tag_lark` lowers the spec: a ``triggered_tags`` format whose tags all hold
    ``json_schema`` content (the tool-call shape). False for any other format, or a spec that does not parse."""
    try:
        fmt = json.loads(normalize_structural_tag(text))["format"]
    except (ValueError, TypeError, KeyError):
        return False
    tags = fmt.get("tags") if isinstance(fmt, dict) and fmt.get("type") == "triggered_tags" else None
    return isinstance(tags, list) and all(
        isinstance(t, dict) and isinstance(t.get("content"), dict) and t["content"].get("type") == "json_schema"
        for t in tags
    )


def structural_tag_lark(text: str) -> str:
    """The Lark grammar for a structural-tag spec (JSON text).

    Raises:
        ValueError: an unsupported format type, a tag whose ``begin`` starts with no trigger, or a tag
            content other than ``json_schema``.
    """
    fmt = json.loads(normalize_structural_tag(text))["format"]
    if fmt.get("type") != "triggered_tags":
        raise ValueError(f'format type {fmt.get("type")!r} is not supported (only "triggered_tags")')
    triggers, tags = fmt.get("triggers") or [], fmt.get("tags") or []
    if not tags:
        raise ValueError("'tags' must not be empty")
    ws = max(0, int(tags[0].get("content", {}).get("max_whitespace_cnt") or 0))
    rules = []
    for i, tag in enumerate(tags):
        begin, end, content = tag.get("begin", ""), tag.get("end", ""), tag.get("content") or {}
        trig = next((t for t in triggers if begin.startswith(t)), None)
        if trig is None:
            raise ValueError(f"tags[{i}].begin {begin!r} starts with none of the triggers {triggers}")
        if content.get("type") != "json_schema":
            raise ValueError(f"tags[{i}].content type {content.get('type')!r} is not supported (only json_schema)")
        schema = dict(content["json_schema"]) if isinstance(content["json_schema"], dict) else {}
        # xgrammar's tags allow JSON whitespace (at most max_whitespace_cnt characters when given)
        opts = {"whitespace_flexible": True}
        if ws:
            opts["whitespace_pattern"] = f"[ \\n\\t]{{0,{ws}}}"
        schema["x-guidance"] = opts
        rules.append(
            f"tag_{i}_trig[lazy]: TAG_TEXT {_lit(trig)}\n"
            f"tag_{i}: tag_{i}_trig {_lit(begin[len(trig) :])} %json {json.dumps(schema)} {_lit(end)}\n"
        )
    alts = " | ".join(f"tag_{i}" for i in range(len(tags)))
    start = f"start: tag_end | ({alts})\n" if fmt.get("stop_after_first") else f"start: ({alts})* tag_end\n"
    return "%llguidance {}\n" + start + "tag_end: TAG_TEXT\nTAG_TEXT: /(.|\\n)*/\n" + "".join(rules)
