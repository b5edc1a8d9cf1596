"""The llguidance grammar backend: an Earley parser over lazily built lexer DFAs, masks computed per token.

Kinds: ``json_schema`` (llguidance's own JSON-schema compiler; compact separators ``,``/``:`` unless
``any_whitespace``; keywords it does not implement are refused by name, e.g. ``Unimplemented keys:
["uniqueItems"]``, never dropped), ``regex`` (full match), ``ebnf`` (GBNF as xgrammar takes it, converted
with llguidance's ``gbnf_to_lark``, or Lark text with a ``start`` rule) and ``structural_tag`` (the xgrammar
spellings of :mod:`.xgrammar_backend`, lowered to Lark with lazy trigger lexemes, see :mod:`.llg_tags`).

Why it is here: on JSONSchemaBench's MaskBench llguidance accepts no instance the schema rejects, where
xgrammar and outlines-core do (guidance-ai/jsonschemabench); its mask costs tens of microseconds per token
with no per-grammar precompute, so compiling is milliseconds.

Matchers are ``LLMatcher`` copies of one per-grammar prototype (``deep_copy`` skips re-parsing the
grammar). ``accept_token`` uses ``try_consume_tokens`` so an illegal token leaves the state unchanged
(``consume_token`` would put the matcher in a sticky error state). Rollback is unlimited; the forced
bytes (``compute_ff_bytes``) serve jump-forward.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import llguidance as llg
import llguidance.hf
import numpy as np

from .base import CompiledGrammar, GrammarBackend, RowMatcher, checked_spec, compile_error, reraise_fatal
from .json_pointer import split_pointer
from .llg_tags import lowers_to_lark, structural_tag_lark
from .schema_prep import subschemas, rewrite_local_refs

if TYPE_CHECKING:
    import torch


def json_options(any_whitespace: bool) -> dict:
    """llguidance's JSON compile options for our whitespace rule (compact unless ``any_whitespace``)."""
    if any_whitespace:
        return {"whitespace_flexible": True, "json_allow_general_unicode_escapes": True}
    return {
        "whitespace_flexible": False,
        "item_separator": ",",
        "key_separator": ":",
        "json_allow_general_unicode_escapes": True,
    }


def strict(schema) -> None:
    """xgrammar's strict mode, in place: an object with ``properties`` and no word on extra keys gets
    ``additionalProperties: false`` (a subset of the schema, so still sound; generations keep to the declared
    keys instead of inventing more).

    Parts of an ``allOf`` (and the local ``$ref`` targets they name) and a node holding an ``allOf`` are left
    open: ``additionalProperties`` only sees its own object's ``properties``, so closing one part would forbid
    the keys another part requires and make the intersection unsatisfiable.
    """
    open_ids = _all_of_parts(schema)
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        if (
            isinstance(node.get("properties"), dict)
            and id(node) not in open_ids
            and "allOf" not in node
            and not any(k in node for k in ("additionalProperties", "patternProperties", "unevaluatedProperties"))
        ):
            node["additionalProperties"] = False
        stack.extend(sub for _, sub in subschemas(node))


def _all_of_parts(schema) -> set[int]:
    """ids of every ``allOf`` part of ``schema`` and of the local ``$ref`` targets they lead to (transitively)."""
    parts, stack = [], [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("allOf"), list):
                parts.extend(p for p in node["allOf"] if isinstance(p, dict))
            stack.extend(sub for _, sub in subschemas(node))
    seen: set[int] = set()
    while parts:
        part = parts.pop()
        if id(part) in seen:
            continue
        seen.add(id(part))
        ref = part.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            target = schema
            for key in split_pointer(ref[1:]):
                target = target.get(key) if isinstance(target, dict) else None
            if isinstance(target, dict):
                parts.append(target)
    return seen


def _first_step_ok(m: llg.LLMatcher, vocab_size: int) -> bool:
    """False when the grammar is a dead end from the start: its first mask leaves llguidance in its error
    state (an empty regex such as ``[^\\s\\S]``, a rule that only recurses). Costs one mask (microseconds)."""
    if m.is_accepting():
        return True
    row = np.zeros((vocab_size + 31) // 32, dtype=np.int32)  # numpy: the HTTP process compiles without torch
    m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
    return not m.is_error()


class LLGuidanceMatcher(RowMatcher):
    """Wraps ``llguidance.LLMatcher``. Not thread-safe (one thread at a time; the batched fill in
    :mod:`.mask_fill` hands matchers to llguidance's executor only while no other call runs)."""

    supports_rollback = True

    backend = "llguidance"

    def __init__(self, m: llg.LLMatcher, eos_token_id: int):
        self.ll = m
        self._eos = eos_token_id
        self._terminated = False
        self._eos_recorded = False  # whether llguidance counted the accepted EOS (see rollback)

    def _write_row(self, target: torch.Tensor) -> None:
        self.ll.unsafe_compute_mask_ptr(target.data_ptr(), target.numel() * 4)

    def accept_token(self, token_id: int) -> bool:
        if self._terminated:
            return False
        token_id = int(token_id)
        if token_id == self._eos:
            self._terminated = bool(self.ll.is_accepting())
            if self._terminated:
                # a matcher that stopped by itself (nothing may follow) does not record the EOS: rollback must know
                self._eos_recorded = not self.ll.is_stopped()
                self.ll.consume_token(token_id)
            return self._terminated
        return self.ll.try_consume_tokens([token_id]) == 1

    def can_terminate(self) -> bool:
        return self._terminated or bool(self.ll.is_accepting())

    def dead_end(self) -> str | None:
        """llguidance's error once its parser has no way on (its mask then allows only EOS, which must not
        read as a proper end)."""
        if self._terminated or not self.ll.is_error():
            return None
        return self.ll.get_error() or "no token can continue the grammar"

    def rollback(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"rollback: n must be >= 0, got {n}")
        if n and self._terminated:
            self._terminated = False
            n -= 0 if self._eos_recorded else 1
        if n and not self.ll.rollback(n):
            raise ValueError(f"llguidance: cannot roll back {n} tokens: {self.ll.get_error()}")

    def batch_fill_matcher(self):
        return None if self._terminated else self.ll

    def find_jump_forward_string(self) -> str:
        """The text the grammar forces next (may be empty), cut to whole UTF-8 characters."""
        if self._terminated:
            return ""
        return self.ll.compute_ff_bytes().decode("utf-8", errors="ignore")

    def forced_tokens(self) -> list[int]:
        """The tokens the grammar forces next, as llguidance tokenizes them (may be empty): speculative
        decoding verifies them as a draft (scheduler/spec_step.py), so a non-canonical split only costs
        its acceptance."""
        if self._terminated or self.ll.is_error():
            return []
        return list(self.ll.compute_ff_tokens())


class LLGuidanceCompiled(CompiledGrammar):
    def __init__(self, kind: str, grammar: str, prototype: llg.LLMatcher, eos_token_id: int):
        self.kind = kind
        self.grammar = grammar  # llguidance's grammar text (JSON or Lark)
        self._proto = prototype
        self._eos = eos_token_id

    def matcher(self) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self._proto.deep_copy(), self._eos)


class LLGuidanceBackend(GrammarBackend):
    """Compiles specs with llguidance; ``compile`` is thread-safe (it drops the GIL while building).

    Args:
        tokenizer: the loaded HF fast tokenizer (llguidance reads its serialized Rust tokenizer).
        vocab_size: the model's vocab size (bitmask width ``ceil(vocab_size/32)``).
        eos_token_id: default ``tokenizer.eos_token_id``.
    """

    name = "llguidance"

    def __init__(self, tokenizer, vocab_size: int, *, eos_token_id: int | None = None):
        self.vocab_size = int(vocab_size)
        self.eos_token_id = tokenizer.eos_token_id if eos_token_id is None else int(eos_token_id)
        self._tokenizer, self._xgrammar = tokenizer, None
        self.ll_tokenizer = llguidance.hf.from_tokenizer(
            tokenizer, n_vocab=self.vocab_size, eos_token=self.eos_token_id
        )

    def grammar_text(self, kind: str, text: str, any_whitespace: bool = False) -> str:
        """llguidance's grammar for a validated spec (see the module doc for each kind)."""
        if kind == "json_schema":
            schema = rewrite_local_refs(json.loads(text))
            if isinstance(schema, bool):  # llguidance takes options only on an object schema
                if not schema:
                    raise ValueError("the schema `false` accepts no value")
                schema = {}
            strict(schema)
            return llg.LLMatcher.grammar_from_json_schema(schema, defaults=json_options(any_whitespace))
        if kind == "regex":
            return llg.LLMatcher.grammar_from_regex(text)
        if kind == "ebnf":
            from llguidance.gbnf_to_lark import any_to_lark

            return llg.LLMatcher.grammar_from_lark(any_to_lark(text))
        return llg.LLMatcher.grammar_from_lark(structural_tag_lark(text))

    def compile(self, kind: str, spec: str, any_whitespace: bool = False) -> LLGuidanceCompiled:
        """See :meth:`GrammarBackend.compile`. Raises ValueError("llguidance: cannot compile <kind>: ...")."""
        text = checked_spec(self.name, kind, spec)
        if kind == "structural_tag" and not lowers_to_lark(text):
            return self._xgrammar_backend().compile(kind, spec, any_whitespace)
        try:
            grammar = self.grammar_text(kind, text, any_whitespace)
            err = llg.LLMatcher.validate_grammar(grammar, self.ll_tokenizer)
            proto = None if err else llg.LLMatcher(self.ll_tokenizer, grammar, log_level=0)
            if proto is not None and proto.is_error():
                err = proto.get_error()
            elif proto is not None and not _first_step_ok(proto.deep_copy(), self.vocab_size):
                err = "the grammar accepts no string (no first token can start a match)"
        except BaseException as e:  # ValueError from our converters, GbnfToLarkError, pyo3 panics
            reraise_fatal(e)
            err = f"{type(e).__name__}: {e}"
        if err:
            msg = err.strip()
            raise compile_error(self.name, kind, msg[:500] + ("..." if len(msg) > 500 else "")) from None
        return LLGuidanceCompiled(kind, grammar, proto, self.eos_token_id)

    def _xgrammar_backend(self) -> GrammarBackend:
        """xgrammar, for the structural-tag formats :mod:`.llg_tags` does not lower (``const_string``,
        ``sequence``, ``or``, ``any_text``, ``grammar``, ...): xgrammar defines that format language, so it
        compiles them as written. Built on first use (its tokenizer info costs about a second)."""
        if self._xgrammar is None:
            from .xgrammar_backend import XGrammarBackend

            self._xgrammar = XGrammarBackend(self._tokenizer, self.vocab_size, stop_token_ids=[self.eos_token_id])
        return self._xgrammar
