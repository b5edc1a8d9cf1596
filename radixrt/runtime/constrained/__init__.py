"""Grammar-constrained decoding: llguidance (default), xgrammar and outlines-core behind one interface.

See :mod:`.base` for the per-step protocol and EOS semantics, :mod:`.cache` for off-thread compilation,
:mod:`.factory` to pick a backend by name, :mod:`.vocab` for special tokens and token bytes.
"""
from .base import (GRAMMAR_KINDS, JSON_OBJECT_SCHEMA, CompiledGrammar, GrammarBackend, GrammarMatcher,
                   allocate_token_bitmask, apply_token_bitmask_, choices_to_regex, validate_spec)
from .cache import CacheStats, GrammarCache
from .factory import BACKEND_CHOICES, create_backend

__all__ = [
    "BACKEND_CHOICES", "GRAMMAR_KINDS", "JSON_OBJECT_SCHEMA", "CompiledGrammar", "GrammarBackend",
    "GrammarMatcher", "allocate_token_bitmask", "apply_token_bitmask_", "choices_to_regex", "create_backend",
    "validate_spec", "CacheStats", "GrammarCache",
]
