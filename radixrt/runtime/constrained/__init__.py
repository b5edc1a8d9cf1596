"""Grammar-constrained decoding: xgrammar (default) and outlines-core behind one interface.

See :mod:`.base` for the per-step protocol and EOS semantics, :mod:`.cache` for off-thread compilation.
"""
from .base import (BACKEND_CHOICES, GRAMMAR_KINDS, JSON_OBJECT_SCHEMA, CompiledGrammar, GrammarBackend,
                   GrammarMatcher, allocate_token_bitmask, apply_token_bitmask_, choices_to_regex,
                   create_backend, validate_spec)
from .cache import CacheStats, GrammarCache

__all__ = [
    "BACKEND_CHOICES", "GRAMMAR_KINDS", "JSON_OBJECT_SCHEMA", "CompiledGrammar", "GrammarBackend",
    "GrammarMatcher", "allocate_token_bitmask", "apply_token_bitmask_", "choices_to_regex", "create_backend",
    "validate_spec", "CacheStats", "GrammarCache",
]
