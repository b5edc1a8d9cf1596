"""Rendering chat messages with the model's own chat template (tokenizer_config.json or the GGUF's
``tokenizer.chat_template``), tools included when the template handles them.

A template handles tools when it reads the ``tools`` variable (Qwen2.5, Qwen3, Llama 3.1, Mistral do;
SmolLM2's does not — the server then injects its Hermes-style tool prompt instead). Earlier assistant
``tool_calls`` are passed through with their ``arguments`` JSON text parsed into objects, the shape the
released templates expect (they ``tojson`` the arguments). ``chat_template_kwargs`` (for example Qwen3's
``enable_thinking``) become template variables, as in SGLang and vLLM.
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

_READS_TOOLS = re.compile(r"\btools\b")
RESERVED_KWARGS = (
    "messages",
    "tools",
    "add_generation_prompt",
    "continue_final_message",
    "tokenize",
    "conversation",
    "documents",
)


def chat_template(tokenizer) -> str:
    """The tokenizer's default chat template text ("" when it has none)."""
    t = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(t, dict):  # named templates: the default one
        t = t.get("default") or next(iter(t.values()), "")
    return t


def handles_tools(template: str) -> bool:
    """True when the template reads the ``tools`` variable."""
    return bool(_READS_TOOLS.search(template))


def _template_call(call: Any) -> Any:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    fn = dict(call["function"])
    if isinstance(fn.get("arguments"), str):
        try:
            fn["arguments"] = json.loads(fn["arguments"])
        except ValueError:
            pass  # not JSON: the template prints the text as it is
    return {**call, "function": fn}


def template_messages(msgs: list[dict]) -> list[dict]:
    """``msgs`` with each assistant tool call's ``function.arguments`` parsed from JSON text."""
    return [
        {**m, "tool_calls": [_template_call(c) for c in m["tool_calls"]]} if m.get("tool_calls") else m for m in msgs
    ]


def render(
    tokenizer,
    msgs: list[dict],
    tools: Optional[list[dict]] = None,
    kwargs: Optional[dict] = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
) -> str:
    """The generation prompt of ``msgs`` (template-ready dicts) through the model's template, with
    ``tools`` (OpenAI tool objects) and ``kwargs`` as template variables (``add_generation_prompt=False``:
    the conversation as it stands, which turn continuity compares with the generation prompt;
    ``continue_final_message``: the text ends inside the last message, without its end of turn, so that
    the model continues it; transformers' ``apply_chat_template`` options, as vLLM's chat fields).

    Raises:
        ValueError: a ``kwargs`` key that the renderer itself sets (``messages``, ``tools``, ...); any
            error of the template propagates (transformers' ValueError when the last message's text is not
            found in the rendered chat, with ``continue_final_message``).
    """
    kwargs = dict(kwargs or {})
    bad = [k for k in kwargs if k in RESERVED_KWARGS or not isinstance(k, str)]
    if bad:
        raise ValueError(f"chat_template_kwargs may not set {bad}")
    return tokenizer.apply_chat_template(
        template_messages(msgs),
        tools=tools or None,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        tokenize=False,
        **kwargs,
    )
