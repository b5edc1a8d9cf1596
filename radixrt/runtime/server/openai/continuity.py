"""Turn continuity for every chat-shaped API (chat completions, Responses, Messages: all build a
:class:`~.chat_format.ChatTurn`): remember what an assistant turn was generated as, and tokenize a later
prompt with the turns it renders replaced by those ids (the store and the key are
:mod:`radixrt.runtime.tokenizer.turn_store`'s).

Where a turn sits in the prompt: the template renders the messages before assistant message i with the generation prompt
(``prefix``: the prompt that turn was generated from) and the messages up to and including it without (``upto``); when
the prompt starts with both, the turn is ``upto`` past their common part: its body, then the end-of-turn marker the
model generated as its last token. A template whose generation prompt holds text its history drops (Qwen3's
``<think>\n\n</think>\n\n`` with thinking off, a thinking template's opened ``<think>``) gets that text back before the
ids under ``keep`` only. The generated ids replace the body and that marker (or only the body, when the turn ended on
``max_tokens`` and the marker is the template's). A template that renders history differently from the prompt the turn
came from (a prefix mismatch) keeps its own text: the cache matches up to there.

``--reasoning-history``: ``keep`` splices the generated ids, reasoning included, even where the template
dropped the reasoning; ``strip`` (default) splices a turn with reasoning only where the template rendered
that reasoning, so the prompt stays the template's.
"""

from __future__ import annotations

import os
from typing import Optional

from radixrt.runtime.io_struct import FinishStop, kind
from radixrt.runtime.parsers.chat_template import render
from radixrt.runtime.server.openai.chat_format import ChatTurn
from radixrt.runtime.server.openai.tool_parser import render_tool_history
from radixrt.runtime.tokenizer.turn_store import TurnStore, splice_encode, turn_key


def _render(tokenizer, turn: ChatTurn, msgs: list[dict], gen: bool) -> Optional[str]:
    try:
        return render(tokenizer, msgs, turn.tools, turn.template_kwargs, add_generation_prompt=gen)
    except Exception:  # a template that refuses a partial conversation: no continuity for that turn
        return None


def _end_text(tokenizer, ids: tuple[int, ...]) -> Optional[str]:
    """The text of the turn's last id when it is a special (end-of-turn) token, else None."""
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    if ids and ids[-1] in special:
        return tokenizer.decode([ids[-1]], skip_special_tokens=False)
    return None


def _tail_ok(tokenizer, prefix: str, seg: int, start: int, keep_reasoning: bool) -> bool:
    """Whether the dropped tail ``prefix[start:]`` may be spliced back: only under ``keep``, and only when
    tokenizing the text before it and it apart gives the ids the whole piece had in the earlier prompt."""
    if not keep_reasoning or start < seg:
        return False
    enc = lambda x: tokenizer.encode(x, add_special_tokens=False)  # noqa: E731
    return enc(prefix[seg:start]) + enc(prefix[start:]) == enc(prefix[seg:])


def encode_turn(
    tokenizer, store: TurnStore, turn: ChatTurn, salt: Optional[str], keep_reasoning: bool
) -> tuple[list[int], int]:
    """The prompt ids of ``turn``, with every earlier assistant turn found in ``store`` spliced in as the
    ids it was generated as; and how many turns were spliced."""
    msgs, prompt = turn.msgs, turn.prompt
    spans = []
    if store.capacity and any(m.get("role") == "assistant" for m in msgs):
        for i, m in enumerate(msgs):
            if m.get("role") != "assistant":
                continue
            prefix = _render(tokenizer, turn, msgs[:i], True)
            if prefix is None:
                continue
            t = store.get(turn_key(salt, prefix, m.get("content"), m.get("tool_calls")))
            if t is None:
                continue
            upto = _render(tokenizer, turn, msgs[: i + 1], False)
            if upto is None or not prompt.startswith(upto):
                continue
            start = len(os.path.commonprefix([prefix, upto]))
            if start < len(prefix):  # back to the end of the role line: "<think>" and "<tool_call>" share "<"
                start = prefix.rfind("\n", 0, start) + 1
            if spans and start < spans[-1][1]:
                continue
            tail = prefix[start:]  # generation-prompt text the history drops (an opened or empty <think>)
            if tail and not _tail_ok(tokenizer, prefix, spans[-1][1] if spans else 0, start, keep_reasoning):
                continue
            text = upto[start:]
            if not keep_reasoning and t.reasoning.strip() and t.reasoning.strip() not in text:
                continue  # the template dropped this turn's reasoning: keep its text (strip)
            end_text = _end_text(tokenizer, t.ids)
            marker = end_text if end_text is not None else getattr(tokenizer, "eos_token", None)
            k = text.rfind(marker) if marker else -1
            if k < 0:
                continue
            end = start + k + (len(marker) if end_text is not None else 0)
            ids = tuple(tokenizer.encode(tail, add_special_tokens=False)) + t.ids if tail else t.ids
            spans.append((start, end, ids))
    if not spans:
        return tokenizer.encode(prompt, add_special_tokens=False), 0
    return splice_encode(tokenizer, prompt, spans), len(spans)


def remember(store: TurnStore, turn: ChatTurn, salt: Optional[str], out, message: dict) -> None:
    """Keep the ids of a finished choice ``out`` (a ReqOutput) under the key its ``message`` (the parsed
    assistant message, as sent to the client) will have when a later prompt renders it. Not kept: aborts,
    and outputs trimmed at a stop string (their ids hold more than their text)."""
    fr = out.finished_reason
    if not store.capacity or kind(fr) not in ("stop", "length") or not out.output_ids:
        return
    if isinstance(fr, FinishStop) and isinstance(fr.matched, str):
        return
    hist = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        hist["tool_calls"] = message["tool_calls"]
    if not turn.template_tools:  # the history form the prompt of the next turn will hold
        hist = render_tool_history([hist])[0]
    key = turn_key(salt, turn.prompt, hist.get("content"), hist.get("tool_calls"))
    store.put(key, out.output_ids, message.get("reasoning_content") or "")
