"""Pick a grammar backend by name. Kept apart from :mod:`.base`, which the backends import."""

from __future__ import annotations

from .base import GrammarBackend

BACKEND_CHOICES = ("xgrammar", "llguidance", "outlines", "none")


def create_backend(name: str | None, tokenizer, vocab_size: int, **kwargs) -> GrammarBackend | None:
    """Build the backend called ``name`` (``"llguidance"``, the default for None, chosen by measurement; ``"xgrammar"``;
    ``"outlines"``; ``"none"``).

    Args:
        tokenizer: the loaded Hugging Face tokenizer (never fetched from a hub).
        vocab_size: the model's vocab size (logits width), which may exceed ``len(tokenizer)``.
        kwargs: passed to the backend's constructor.

    Returns:
        The backend, or None for ``"none"``.

    Raises:
        ValueError: unknown ``name``; the message lists the choices.
    """
    key = "llguidance" if name is None else str(name).strip().lower()
    if key == "none":
        return None
    if key == "xgrammar":
        from .xgrammar_backend import XGrammarBackend

        return XGrammarBackend(tokenizer, vocab_size, **kwargs)
    if key == "llguidance":
        from .llguidance_backend import LLGuidanceBackend

        return LLGuidanceBackend(tokenizer, vocab_size, **kwargs)
    if key in ("outlines", "outlines_core", "outlines-core"):
        from .outlines_backend import OutlinesBackend

        return OutlinesBackend(tokenizer, vocab_size, **kwargs)
    raise ValueError(f"grammar_backend: unknown grammar backend {name!r}; choose one of {list(BACKEND_CHOICES)}")
