"""A tokenizer's vocabulary as bytes: which ids are control (special) tokens, and each token's exact bytes.

One rule, shared by the grammar backends (which never allow a control token) and the OpenAI server (which
reports each token's bytes in logprobs):

- **special** = ``tokenizer.all_special_ids`` plus every added token flagged ``special``. For the default
  SmolLM2 tokenizer that is ids 0..16 (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``,
  ``<repo_name>`` ... ``<empty_output>``). Their bytes are their text as written.
- Every other id, an added token *not* flagged special included (a tool tag a user added), is ordinary
  text: grammars may match it, and in a byte-level BPE vocabulary its entry is byte-level spelling, which
  is also how the tokenizer's own ByteLevel decoder reads it (``tok.decode`` of an added ``"naïve"`` gives
  the bytes ``na\xefve``, as xgrammar's vocabulary does).

Byte-level BPE vocabularies (GPT-2, Llama 3, SmolLM2) spell each byte with a printable stand-in
character; :func:`byte_decoder` inverts that table (source: GPT-2's ``encoder.py``, ``bytes_to_unicode``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional


def special_token_ids(tokenizer) -> set[int]:
    """Ids of the tokenizer's control tokens (``<|im_start|>``, ``<repo_name>``, ...); see the module rule.

    Grammars never allow them (the stop token is handled separately): their text is not what the
    detokenizer prints, so letting a grammar match ``<|im_start|>`` literally would let the model emit a
    control token the parser counts as text.
    """
    ids = {int(t) for t in (getattr(tokenizer, "all_special_ids", None) or [])}
    for tid, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(added, "special", False):
            ids.add(int(tid))
    return ids


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode``: printable stand-in character -> byte value (256 entries).

    Printable Latin-1 bytes stand for themselves; the other 68 bytes map to U+0100 onwards in order.
    """
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def piece_bytes(piece: str) -> Optional[bytes]:
    """The bytes a byte-level vocabulary entry spells, or None if a character is outside the table."""
    table = byte_decoder()
    try:
        return bytes(table[ch] for ch in piece)
    except KeyError:
        return None
