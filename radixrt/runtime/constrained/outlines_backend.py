"""The outlines-core grammar backend: regex -> DFA -> per-state token sets (``Index``), walked by a ``Guide``.

Kinds: ``regex`` and ``json_schema`` (turned into a regex by ``outlines_core.json_schema``; whitespace
between JSON tokens is none by default, ``[ \\t\\n\\r]{0,N}`` with ``any_whitespace``; ``$ref`` recursion is
unrolled ``max_recursion_depth`` levels). ``ebnf`` and ``structural_tag`` are not supported.

The ``Vocabulary`` is built from the loaded tokenizer, never from a hub: each token string is mapped
back to its bytes with the GPT-2 byte-level table; special tokens are left out and EOS stands for an end
sentinel (see ``SENTINEL``). Index building is eager: its cost grows with the DFA size times the
vocabulary, so large schemas take seconds (a root ``{}`` about a minute) or are refused up front
(``max_regex_chars``) with a ValueError. Schemas are rewritten first (``schema_prep``, and each
``pattern`` is turned into a regex over the JSON-escaped text: outlines-core splices it in verbatim).
"""

from __future__ import annotations

import json

import outlines_core as oc
import torch

from .base import CompiledGrammar, GrammarBackend, RowMatcher, checked_spec, compile_error, reraise_fatal
from .json_strings import pattern_to_json_regex
from .schema_prep import prepare_schema, rewrite_local_refs, rewrite_patterns
from .schema_sound import make_sound
from .vocab import piece_bytes, special_token_ids

# outlines-core 0.2.14's JSON regexes deviate from RFC 8259; these textual fixes restore it:
# exponents without a sign (1e10, 1E5); \uXXXX escapes (a surrogate pair counts as one character, as
# JSON Schema's maxLength does); raw U+007F..U+009F, which JSON allows unescaped.
_HEX = "[0-9a-fA-F]"
_FIXES = (
    ("[eE][+-][0-9]+", "[eE][+-]?[0-9]+"),
    (
        '\\\\["\\\\/bfnrt]',
        '\\\\(["\\\\/bfnrt]|u([0-9a-cA-CefEF]{h}{{3}}|[dD][0-7]{h}{{2}}|'
        "[dD][89abAB]{h}{{2}}\\\\u[dD][c-fC-F]{h}{{2}}))".format(h=_HEX),
    ),
    ('[^"\\\\\\x00-\\x1F\\x7F-\\x9F]', '[^"\\\\\\x00-\\x1F]'),
)


# outlines-core 0.2.14 drops, from a final state, every token that leads to a non-final state: for
# "0(\\.5)?" the token "." is refused after "0" (so 0.5, 1e10 as root values were impossible). We keep the
# index free of final states inside the grammar by appending an end sentinel, U+10FFFF, that stands for
# EOS: the EOS id is mapped to its bytes, tokens that could start it are left out of the vocabulary, and
# EOS is allowed exactly where consuming the sentinel reaches a final state.
SENTINEL = "\U0010ffff"
_SENTINEL_BYTES = SENTINEL.encode("utf-8")
_SENTINEL_REGEX = r"\x{10FFFF}"


def build_vocabulary(tokenizer, vocab_size: int, eos_token_id: int, placeholder_id: int) -> oc.Vocabulary:
    """``outlines_core.Vocabulary`` of the byte strings of every ordinary token id ``< vocab_size``.

    Byte-level tokens are decoded with the inverse GPT-2 table (:mod:`.vocab`); a token with characters
    outside it (a non-byte-level tokenizer) falls back to its UTF-8 text. ``eos_token_id`` is mapped to
    the sentinel; tokens ending with a proper prefix of the sentinel's bytes (only plane-16 private-use
    characters start so) are left out. ``placeholder_id`` is what outlines-core is told the EOS is (never used).
    """
    skip = special_token_ids(tokenizer) | {eos_token_id}
    prefixes = tuple(_SENTINEL_BYTES[:k] for k in range(1, len(_SENTINEL_BYTES)))
    mapping: dict[bytes, list[int]] = {_SENTINEL_BYTES: [eos_token_id]}
    for text, tid in tokenizer.get_vocab().items():
        if tid in skip or tid >= vocab_size:
            continue
        raw = piece_bytes(text)
        if raw is None:  # a character outside the byte table: a non-byte-level (sentencepiece) entry
            raw = text.replace("\u2581", " ").encode("utf-8")
        if raw.endswith(prefixes) or _SENTINEL_BYTES in raw:
            continue
        mapping.setdefault(raw, []).append(tid)
    return oc.Vocabulary(placeholder_id, mapping)


class OutlinesMatcher(RowMatcher):
    """Wraps ``outlines_core.Guide``; rollback up to ``max_rollback`` tokens. Not thread-safe."""

    supports_rollback = True

    backend = "outlines"

    def __init__(self, index: oc.Index, eos_token_id: int, max_rollback: int):
        self._index = index
        self._guide = oc.Guide(index, max_rollback=max_rollback)
        self._eos = eos_token_id
        self._terminated = False

    def _write_row(self, target: torch.Tensor) -> None:
        self._guide.write_mask_into(target.data_ptr(), target.numel(), 4)
        word, bit = divmod(self._eos, 32)
        value = int(target[word]) & ~(1 << bit)  # the sentinel may be "content" too: decide EOS here
        if self.can_terminate():
            value |= 1 << bit
        target[word] = value - (1 << 32) if value >= 1 << 31 else value

    def accept_token(self, token_id: int) -> bool:
        if self._terminated:
            return False
        if token_id == self._eos:
            self._terminated = self.can_terminate()
            return self._terminated
        try:
            self._guide.advance(int(token_id), False)
        except (ValueError, OverflowError, TypeError):
            return False
        return True

    def can_terminate(self) -> bool:
        if self._terminated:
            return True
        nxt = self._index.get_next_state(self._guide.get_state(), self._eos)
        return nxt is not None and self._index.is_final_state(nxt)

    def rollback(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"rollback: n must be >= 0, got {n}")
        if n and self._terminated:  # the EOS was never fed to the guide
            self._terminated = False
            n -= 1
        if n:
            try:
                self._guide.rollback_state(n)
            except ValueError as e:
                raise ValueError(f"outlines: cannot roll back {n} tokens: {e}") from None


class OutlinesCompiled(CompiledGrammar):
    def __init__(self, kind: str, regex: str, index: oc.Index, eos_token_id: int, max_rollback: int):
        self.kind = kind
        self.regex = regex  # without the end sentinel
        self._index = index
        self._eos = eos_token_id
        self._max_rollback = max_rollback

    def matcher(self) -> OutlinesMatcher:
        return OutlinesMatcher(self._index, self._eos, self._max_rollback)


def _strip_anchors(regex: str) -> str:
    """Drop a leading ``^`` and a trailing unescaped ``$`` (the whole output is matched anyway)."""
    if regex.startswith("^"):
        regex = regex[1:]
    if regex.endswith("$"):
        body = regex[:-1]
        if (len(body) - len(body.rstrip("\\"))) % 2 == 0:  # not an escaped "\$"
            regex = body
    return regex


class OutlinesBackend(GrammarBackend):
    """Compiles ``regex`` and ``json_schema`` with outlines-core; ``compile`` is thread-safe.

    Args:
        tokenizer: the loaded HF tokenizer.
        vocab_size: the model's vocab size (bitmask width ``ceil(vocab_size/32)``).
        eos_token_id: default ``tokenizer.eos_token_id``.
        whitespace_max: with ``any_whitespace``, at most this many whitespace chars between JSON tokens.
        max_recursion_depth: how deep recursive ``$ref`` is unrolled.
        max_rollback: how many tokens a matcher can roll back.
        max_regex_chars: larger derived regexes are refused (index building would take minutes or more).
    """

    name = "outlines"

    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        *,
        eos_token_id: int | None = None,
        whitespace_max: int = 8,
        max_recursion_depth: int = 3,
        max_rollback: int = 64,
        max_regex_chars: int = 100_000,
    ):
        self.vocab_size = int(vocab_size)
        self.eos_token_id = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
        self.whitespace_max = whitespace_max
        self.max_recursion_depth = max_recursion_depth
        self.max_rollback = max_rollback
        self.max_regex_chars = max_regex_chars
        spare = [*sorted(special_token_ids(tokenizer) - {self.eos_token_id}), *range(len(tokenizer), vocab_size)]
        if not spare:
            raise ValueError("outlines: the tokenizer has no spare token id to stand in for outlines-core's EOS")
        self.vocabulary = build_vocabulary(tokenizer, self.vocab_size, self.eos_token_id, spare[0])

    def schema_to_regex(self, text: str, any_whitespace: bool = False) -> str:
        """The regex outlines-core derives from a JSON schema text, with RFC 8259 fixes (see ``_FIXES``).

        Raises:
            ValueError: outlines-core does not support the schema.
        """
        ws = f"[ \\t\\n\\r]{{0,{self.whitespace_max}}}" if any_whitespace else ""
        regex = oc.json_schema.build_regex_from_schema(text, ws, self.max_recursion_depth)
        for old, new in _FIXES:
            regex = regex.replace(old, new)
        return regex

    def compile(self, kind: str, spec: str, any_whitespace: bool = False) -> OutlinesCompiled:
        """See :meth:`GrammarBackend.compile`. Raises ValueError("outlines: ...")."""
        if kind in ("ebnf", "structural_tag"):
            raise ValueError(f"outlines: {kind} is not supported by this backend; use --grammar-backend xgrammar")
        text = checked_spec(self.name, kind, spec)
        try:
            if kind == "json_schema":
                schema = make_sound(rewrite_local_refs(json.loads(text)), self.name)
                schema = rewrite_patterns(
                    prepare_schema(schema, expand_types=False, explicit_any=True), pattern_to_json_regex
                )
                text = json.dumps(schema, ensure_ascii=False)
            regex = self.schema_to_regex(text, any_whitespace) if kind == "json_schema" else text
        except BaseException as e:
            reraise_fatal(e)
            first = (str(e).strip().splitlines() or [""])[0]
            raise compile_error(self.name, kind, f"{type(e).__name__}: {first[:300]}") from None
        if len(regex) > self.max_regex_chars:
            raise compile_error(
                self.name,
                kind,
                f"the spec expands to a {len(regex)}-character regex (limit "
                f"{self.max_regex_chars}); use --grammar-backend xgrammar",
            )
        try:
            index = oc.Index(f"(?:{_strip_anchors(regex)}){_SENTINEL_REGEX}", self.vocabulary)
        except BaseException as e:
            reraise_fatal(e)
            msg = str(e)
            if len(msg) > 500:
                msg = msg[:500] + "..."
            raise compile_error(self.name, kind, f"cannot build the token index: {type(e).__name__}: {msg}") from None
        return OutlinesCompiled(kind, regex, index, self.eos_token_id, self.max_rollback)
