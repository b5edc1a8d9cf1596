"""Field checks shared by the request protocols (Responses, Messages): refused fields and text-only content."""

from __future__ import annotations

from typing import Any, Callable

from radixrt.runtime.server.http.errors import ApiError


def foreign_constraints(here: str) -> dict[str, str]:
    """Field -> why for the constraint and /generate names of SGLang / vLLM / chat completions, refused on an
    agent route (Responses, Messages): unknown there, they would be ignored and the output silently
    unconstrained. ``here``: how this route says it (e.g. "here use text.format")."""
    names = (
        "json_schema",
        "regex",
        "ebnf",
        "choices",
        "structural_tag",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "response_format",
        "sampling_params",
        "max_new_tokens",
    )
    return {k: f"it is a /generate or chat completions field; {here}" for k in names}


def refuse_set_fields(body: dict, refused: dict[str, str]) -> None:
    """Raises ApiError 400 naming the first key of ``refused`` (field -> why) that ``body`` sets to a value
    other than None, False, [] or {}."""
    for k, why in refused.items():
        if body.get(k) not in (None, False, [], {}):
            raise ApiError(f"{k} is not supported: {why}", param=k)


def text_of_parts(content: Any, where: str, kinds: tuple[str, ...], sep: str, noun: str) -> str:
    """``content`` (a string, or a list of ``{"type": <one of kinds>, "text": str}`` parts) as one string,
    the parts' texts joined by ``sep``.

    Raises:
        ApiError: 400 naming ``where`` (not a string or list) or ``where[j]`` (a part of another type);
            ``noun`` names the parts in the message ("text blocks", "text parts (input_text, output_text)").
    """
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(f"{where} must be a string or a list of {noun.split(' (')[0]}", param=where)
    out = []
    for j, p in enumerate(content):
        if not isinstance(p, dict) or p.get("type") not in kinds or not isinstance(p.get("text"), str):
            raise ApiError(
                f"{where}[{j}]: only {noun} are supported" + ("" if "(" in noun else " here"), param=f"{where}[{j}]"
            )
        out.append(p["text"])
    return sep.join(out)


def renamed(e: ApiError, rename: Callable[[str], str]) -> ApiError:
    """``e`` (raised by the chat path a route runs on) with its ``param`` as the route's request names that
    field, in the message too; ``rename`` maps a chat field path to the route's."""
    if e.param:
        p = rename(e.param)
        if p != e.param:
            e.message = e.message.replace(e.param, p, 1)
            e.param = p
    return e
