"""Jump-forward decoding: when the grammar forces the next text, append its tokens for one extend step.

A JSON schema forces its keys and punctuation: after ``{"`` nothing but ``customer_identification_number":``
may follow. Decoding that one token per forward pass wastes passes; instead the forced text is tokenized and
appended to the output at once, and the next step computes it as an extend chunk (LMSYS, "Fast JSON Decoding
with Compressed Finite State Machine", 2024; xgrammar's ``find_jump_forward_string``).

Retokenization. SGLang shipped this and removed it, in part for boundary bugs (sgl-project/sglang#2045:
stray characters such as ``">`` at the start of forced strings; #2025: changed whitespace and values). The
cause is tokens that no tokenizer would produce where generated and forced text meet. The rules here:
1. The token sampled this step (not yet sent, its KV not yet computed) is decoded and joined with the forced
   text, and the two are tokenized together, so a boundary such as ``{`` + ``"name`` becomes ``{"`` + ``name``
   as the tokenizer writes it. Earlier tokens were already streamed and are never rewritten.
2. The last pre-tokenizer word of the joined text is held back (MLC-LLM's "skip prefix tokens", PR #2551):
   what follows could merge with it, so the model decodes it under the grammar mask as usual.
3. The kept tokens must decode to exactly the joined text's prefix, re-encode to themselves, and be accepted
   by the matcher; otherwise nothing changes. A head token that is a partial UTF-8 character is never joined.
"""

from __future__ import annotations

from typing import Any

from radixrt.runtime.scheduler.request import Req


def forced_tokens(tokenizer: Any, head_id: int, forced: str) -> list[int] | None:
    """Canonical tokens for ``decode(head_id) + forced`` minus its last pre-tokenizer word.

    Returns:
        Token ids whose text is a prefix of the joined text (the first replaces ``head_id``), or None when
        they would add nothing or fail the round-trip checks.
    """
    head = tokenizer.decode([head_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    if not head or "\ufffd" in head:
        return None
    text = head + forced
    cut = _last_word_start(tokenizer, text)
    if cut <= len(head):
        return None
    enc = tokenizer(text[:cut], add_special_tokens=False)["input_ids"]
    if len(enc) < 2:
        return None
    back = tokenizer.decode(enc, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    if back != text[:cut] or tokenizer(back, add_special_tokens=False)["input_ids"] != enc:
        return None
    return enc


def _last_word_start(tokenizer: Any, text: str) -> int:
    """Character offset where the last pre-tokenizer word of ``text`` starts (0 if unknown)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    pre = getattr(backend, "pre_tokenizer", None)
    if pre is None:
        return 0
    words = pre.pre_tokenize_str(text)
    return words[-1][1][0] if words else 0


def try_jump_forward(req: Req, tokenizer: Any, room: int) -> int:
    """Replace ``req``'s just-sampled token by the grammar's forced tokens (see the module docstring).

    Args:
        req: a request whose last output token was sampled this step and whose ``grammar`` has accepted it.
        room: the most output tokens this may add (max_new_tokens and context length left).

    Returns:
        Output tokens added (0: nothing changed). The request's ``extend_len`` grows by as much, so the
        scheduler computes them in one extend step.
    """
    m = req.grammar
    if room < 1 or m.is_terminated():
        return 0
    forced = m.find_jump_forward_string()
    if not forced:
        return 0
    head = req.output_ids[-1]
    toks = forced_tokens(tokenizer, head, forced)
    if toks is None:
        return 0
    toks = toks[: room + 1]
    if len(toks) < 2:
        return 0
    m.rollback(1)
    for i, t in enumerate(toks):
        if not m.accept_token(t):  # not what the grammar forces after all: restore the sampled token
            m.rollback(i)
            m.accept_token(head)
            return 0
    req.output_ids[-1:] = toks
    return len(toks) - 1
