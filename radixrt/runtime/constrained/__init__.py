"""Grammar-constrained decoding: llguidance (default), xgrammar and outlines-core behind one interface.

See :mod:`.base` for the per-step protocol and EOS semantics, :mod:`.cache` for off-thread compilation,
:mod:`.factory` to pick a backend by name, :mod:`.vocab` for special tokens and token bytes.
"""

from typing import TYPE_CHECKING

from radixrt.lazy import lazy_getattr

if TYPE_CHECKING:
    from .base import (
        GRAMMAR_KINDS,
        JSON_OBJECT_SCHEMA,
        CompiledGrammar,
        GrammarBackend,
        GrammarMatcher,
        allocate_token_bitmask,
        apply_token_bitmask_,
        choices_to_regex,
        validate_spec,
    )
    from .cache import CacheStats, GrammarCache
    from .factory import BACKEND_CHOICES, create_backend

# Lazy (PEP 562): the server's main process reads ``vocab`` (token bytes) and must not load torch (``base``).
_WHERE = {
    "GRAMMAR_KINDS": "radixrt.runtime.constrained.base",
    "JSON_OBJECT_SCHEMA": "radixrt.runtime.constrained.base",
    "CompiledGrammar": "radixrt.runtime.constrained.base",
    "GrammarBackend": "radixrt.runtime.constrained.base",
    "GrammarMatcher": "radixrt.runtime.constrained.base",
    "allocate_token_bitmask": "radixrt.runtime.constrained.base",
    "apply_token_bitmask_": "radixrt.runtime.constrained.base",
    "choices_to_regex": "radixrt.runtime.constrained.base",
    "validate_spec": "radixrt.runtime.constrained.base",
    "CacheStats": "radixrt.runtime.constrained.cache",
    "GrammarCache": "radixrt.runtime.constrained.cache",
    "BACKEND_CHOICES": "radixrt.runtime.constrained.factory",
    "create_backend": "radixrt.runtime.constrained.factory",
}


__getattr__ = lazy_getattr(__name__, _WHERE)


__all__ = [
    "BACKEND_CHOICES",
    "GRAMMAR_KINDS",
    "JSON_OBJECT_SCHEMA",
    "CompiledGrammar",
    "GrammarBackend",
    "GrammarMatcher",
    "allocate_token_bitmask",
    "apply_token_bitmask_",
    "choices_to_regex",
    "create_backend",
    "validate_spec",
    "CacheStats",
    "GrammarCache",
]
