"""The default grammar backend: xgrammar (pushdown automaton with precomputed token masks).

Kinds: ``json_schema`` (compact separators ``,``/``:`` unless ``any_whitespace``), ``regex``, ``ebnf``
(GBNF syntax, root rule ``root``) and ``structural_tag`` (JSON: xgrammar's ``{"type": "structural_tag",
"format": {...}}``; a bare format object ``{"type": "triggered_tags", ...}``; or SGLang's legacy
``{"structures": [{"begin", "schema", "end"}], "triggers": [...]}``).

JSON-schema grammars are post-processed by :mod:`.json_strings` so that strings with
``maxLength``/``minLength``/``pattern`` accept escapes and reject raw control characters.
"""

from __future__ import annotations

import json
import logging
import os

import torch
import xgrammar as xgr

from .base import (
    CompiledGrammar,
    GrammarBackend,
    GrammarMatcher,
    checked_spec,
    compile_error,
    fill_single_token,
    reraise_fatal,
)
from .json_strings import enforceable_pattern, fix_json_string_rules
from .schema_prep import prepare_schema, rewrite_local_refs, rewrite_patterns
from .schema_sound import make_sound
from .structural_tags import normalize_structural_tag
from .vocab import special_token_ids

logger = logging.getLogger(__name__)


def build_tokenizer_info(tokenizer, vocab_size: int, stop_token_ids: list[int]) -> xgr.TokenizerInfo:
    """xgrammar's view of the vocabulary, ``vocab_size`` wide (ids past the tokenizer are never allowed).

    The tokenizer's special tokens other than the stop tokens are blanked, which makes xgrammar treat
    them as special (never allowed by any grammar).
    """
    probe = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
    encoded = [""] * vocab_size
    for text, tid in tokenizer.get_vocab().items():
        if tid < vocab_size:
            encoded[tid] = text
    for tid in special_token_ids(tokenizer) - set(stop_token_ids):
        if tid < vocab_size:
            encoded[tid] = ""
    return xgr.TokenizerInfo(
        encoded,
        probe.vocab_type,
        vocab_size=vocab_size,
        stop_token_ids=stop_token_ids,
        add_prefix_space=probe.add_prefix_space,
    )


class XGrammarMatcher(GrammarMatcher):
    """Wraps ``xgrammar.GrammarMatcher``. Rollback is unlimited. Not thread-safe."""

    supports_rollback = True

    def __init__(self, compiled: xgr.CompiledGrammar, eos_token_id: int):
        self._m = xgr.GrammarMatcher(compiled)
        self._eos = eos_token_id

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """See :meth:`GrammarMatcher.fill_next_token_bitmask`. After termination the row allows EOS only.

        Raises:
            ValueError: ``bitmask`` is not a CPU int32 tensor of the right width.
        """
        if self._m.is_terminated():
            fill_single_token(bitmask, row, self._eos)
            return
        try:
            self._m.fill_next_token_bitmask(bitmask, row)
        except RuntimeError as e:
            raise ValueError(
                f"xgrammar: bad bitmask {tuple(bitmask.shape)} {bitmask.dtype} on {bitmask.device}: {e}"
            ) from None

    def accept_token(self, token_id: int) -> bool:
        return bool(self._m.accept_token(int(token_id)))

    def is_terminated(self) -> bool:
        return bool(self._m.is_terminated())

    def can_terminate(self) -> bool:
        return bool(self._m.is_terminated() or self._m.is_completed())

    def rollback(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"rollback: n must be >= 0, got {n}")
        if n:
            try:
                self._m.rollback(n)
            except RuntimeError as e:
                raise ValueError(f"xgrammar: cannot roll back {n} tokens: {e}") from None

    def find_jump_forward_string(self) -> str:
        """The text the grammar forces next (may be empty); for jump-forward decoding."""
        return self._m.find_jump_forward_string()


class XGrammarCompiled(CompiledGrammar):
    def __init__(self, kind: str, compiled: xgr.CompiledGrammar, eos_token_id: int):
        self.kind = kind
        self._compiled = compiled
        self._eos = eos_token_id

    def matcher(self) -> XGrammarMatcher:
        return XGrammarMatcher(self._compiled, self._eos)

    @property
    def memory_size_bytes(self) -> int:
        return self._compiled.memory_size_bytes


class XGrammarBackend(GrammarBackend):
    """Compiles specs with ``xgrammar.GrammarCompiler``; ``compile`` is thread-safe.

    Args:
        tokenizer: the loaded HF tokenizer.
        vocab_size: the model's vocab size (bitmask width is ``ceil(vocab_size/32)``).
        stop_token_ids: tokens that end the grammar; default ``[tokenizer.eos_token_id]``.
        strict_mode: json_schema without ``additionalProperties``/``items`` constraints forbids extra
            properties/items (xgrammar's default; keeps generations to the declared shape).
        fix_string_escapes: post-process json_schema grammars (see :mod:`.json_strings`).
        max_threads: compiler threads (default: min(8, cpu count)).
        dynamic_compilation: build token-mask caches lazily on first use (a much faster compile,
            slower first masks: docs/measurements.md). Default False: all mask work happens in
            ``compile``, off the scheduler thread.
    """

    name = "xgrammar"

    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        *,
        stop_token_ids: list[int] | None = None,
        strict_mode: bool = True,
        fix_string_escapes: bool = True,
        max_threads: int | None = None,
        dynamic_compilation: bool = False,
    ):
        eos = tokenizer.eos_token_id
        self.stop_token_ids = list(stop_token_ids) if stop_token_ids else [eos]
        self.eos_token_id = self.stop_token_ids[0]
        self.vocab_size = int(vocab_size)
        self.strict_mode = strict_mode
        self.fix_string_escapes = fix_string_escapes
        self.tokenizer_info = build_tokenizer_info(tokenizer, self.vocab_size, self.stop_token_ids)
        threads = max_threads or max(1, min(8, os.cpu_count() or 1))
        # Compiled grammars are cached by GrammarCache; xgrammar's own cache would hold a second copy.
        self._compiler = xgr.GrammarCompiler(
            self.tokenizer_info,
            max_threads=threads,
            cache_enabled=False,
            enable_dynamic_compilation=dynamic_compilation,
        )

    def _json_schema(self, text: str, any_whitespace: bool) -> xgr.CompiledGrammar:
        # a pattern xgrammar cannot lower (lookaround) would be dropped silently: refuse it first
        # allOf folded, keywords xgrammar would drop refused (schema_sound), then typed (schema_prep)
        schema = make_sound(rewrite_local_refs(json.loads(text)), self.name)
        schema = rewrite_patterns(prepare_schema(schema), enforceable_pattern)
        text = json.dumps(schema, ensure_ascii=False)
        kw = dict(any_whitespace=any_whitespace, strict_mode=self.strict_mode)
        if not any_whitespace:
            kw["separators"] = (",", ":")
        if not self.fix_string_escapes:
            return self._compiler.compile_json_schema(text, **kw)
        grammar = xgr.Grammar.from_json_schema(text, **kw)
        try:
            fixed = xgr.Grammar.from_ebnf(fix_json_string_rules(str(grammar)))
        except BaseException as e:  # keep xgrammar's own grammar rather than failing the request
            reraise_fatal(e)
            logger.warning("xgrammar: string-escape fix not applied (%s); using xgrammar's grammar", e)
            fixed = grammar
        return self._compiler.compile_grammar(fixed)

    def compile(self, kind: str, spec: str, any_whitespace: bool = False) -> XGrammarCompiled:
        """See :meth:`GrammarBackend.compile`. Raises ValueError("xgrammar: cannot compile <kind>: ...")."""
        text = checked_spec(self.name, kind, spec)
        try:
            if kind == "json_schema":
                compiled = self._json_schema(text, any_whitespace)
            elif kind == "regex":
                compiled = self._compiler.compile_regex(text)
            elif kind == "ebnf":
                compiled = self._compiler.compile_grammar(text, root_rule_name="root")
            else:
                compiled = self._compiler.compile_structural_tag(normalize_structural_tag(text))
        except BaseException as e:  # RuntimeError/ValueError/InvalidJSONError/pydantic errors
            reraise_fatal(e)
            reason = str(e).strip().splitlines()
            msg = reason[-1] if reason else type(e).__name__
            if len(msg) > 500:
                msg = msg[:500] + "..."
            raise compile_error(self.name, kind, f"{type(e).__name__}: {msg}") from None
        return XGrammarCompiled(kind, compiled, self.eos_token_id)
