"""Drafting the rest of a word the model is copying from its prompt, across token boundaries.

A value copied from prose into JSON changes its tokens: "lives in Minsk" holds the token ` Minsk` (the word
with its space), the string `"city":"Minsk"` holds `"`, `M`, `ins`, `k`. No token n-gram of such a value
occurs in the prompt, so token-level lookup (ngram, the suffix indices) has nothing to draft, for every
extracted name, city or file path. Once the model has begun the word, its text does occur: the partial
word "M" begins the prompt's word "Minsk", so the rest of that word ("insk", tokenized on its own, as a
model continues a word it has begun) is the draft, with the next word where a space separates them ("Mei"
-> " Okafor": the verification keeps what the model copies).

Which word: the prompt's words that begin with the partial word, with its case (else ignoring case: "Chem"
begins "chemist"); the rest most of them share is drafted, the latest occurrence breaking ties, and nothing
when it is shared by fewer than ``min_prob`` of them (a one-letter start matches too many words to guess).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

TAIL_TOKENS = 4  # output tokens decoded to find the partial word
MAX_OCCURRENCES = 64  # word starts looked at per lookup (latest first), bounding the cost in a long prompt
MAX_WORD = 48  # characters of a prompt word drafted
PROMPT_TOKENS = 8192  # the prompt's last tokens searched (decoded once per request, on the scheduler thread)


class WordCopy:
    """Per request, the text of the prompt's last ``PROMPT_TOKENS`` tokens (decoded once); :meth:`draft`
    proposes the rest of the word the output ends inside.

    Args:
        tokenizer: a Hugging Face tokenizer (``decode``, and ``__call__`` returning ``input_ids``).
        min_prob: the least share of the candidate words that must agree on the rest.
    """

    def __init__(self, tokenizer: Any, min_prob: float = 0.1):
        self.tokenizer, self.min_prob = tokenizer, min_prob
        # rid -> (prompt text, its lower case; None where lowering changed the length, e.g. "İ")
        self._prompts: dict[str, tuple[str, str | None]] = {}

    def draft(self, req: Any, after: Sequence[int] = ()) -> list[int]:
        """Token ids of the rest of the prompt word that the output's last word begins ([] if none), the
        output followed by ``after``."""
        out = req.output_ids[-TAIL_TOKENS:] + list(after)
        if not out:
            return []
        tail = self._decode(out[-TAIL_TOKENS:])
        start = len(tail)
        while start > 0 and tail[start - 1].isalnum():
            start -= 1
        # the partial word must begin inside the tail (else it may be the end of a longer word)
        if start == len(tail) or (start == 0 and len(req.output_ids) + len(after) > TAIL_TOKENS) or "\ufffd" in tail:
            return []
        text, lower = self._prompt(req)
        part = tail[start:]
        rest = _rest(text, text, part, self.min_prob)
        if rest is None and lower is not None:
            rest = _rest(text, lower, part.lower(), self.min_prob)
        return self.tokenizer(rest, add_special_tokens=False)["input_ids"] if rest else []

    def finish(self, rid: str) -> None:
        self._prompts.pop(rid, None)

    def _prompt(self, req: Any) -> tuple[str, str | None]:
        got = self._prompts.get(req.rid)
        if got is None:
            text = self._decode(req.input_ids[-PROMPT_TOKENS:])
            lower = text.lower()
            got = self._prompts[req.rid] = (text, lower if len(lower) == len(text) else None)
        return got

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _word_end(text: str, j: int) -> int:
    k = j
    while k < len(text) and k - j < MAX_WORD and text[k].isalnum():
        k += 1
    return k


def _rest(text: str, hay: str, part: str, min_prob: float) -> str | None:
    """The rest of the words of ``text`` that begin with ``part`` where ``hay`` (``text`` or its lower case)
    holds it at a word start, with the word after each when a single space separates them (a name's
    surname): the one most of them share, if at least ``min_prob`` of them do. None when no word of ``hay``
    begins with ``part`` and goes on."""
    rests: list[str] = []
    end = len(hay)
    while len(rests) < MAX_OCCURRENCES:
        i = hay.rfind(part, 0, end)
        if i < 0:
            break
        end = i + len(part) - 1
        if i > 0 and hay[i - 1].isalnum():
            continue
        j = i + len(part)
        k = _word_end(text, j)
        if k + 1 < len(text) and text[k] == " " and text[k + 1].isalnum():  # and the word after it
            k = _word_end(text, k + 1)
        if k > j:
            rests.append(text[j:k])
    if not rests:
        return None
    counts = Counter(rests)
    best = max(counts.values())
    if best / len(rests) < min_prob:
        return ""
    return next(r for r in rests if counts[r] == best)  # rests run latest first: the latest of the most common
