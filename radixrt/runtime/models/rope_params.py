"""A config's rope parameters and the check that radixrt runs them, without torch.

Split from :mod:`.rope` so that the server's main process (which checks a model before it starts any child,
and never runs it) can refuse an unsupported rope without importing torch.
"""

from __future__ import annotations

ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rope_parameters(cfg) -> dict:
    """The config's rope dict (``rope_parameters`` in transformers 5, ``rope_scaling`` + ``rope_theta`` before)."""
    rope = dict(getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {})
    rope.setdefault("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    rope["rope_type"] = rope.get("rope_type") or rope.get("type") or "default"
    return rope


def check_rope(cfg) -> dict:
    """The config's rope dict, checked.

    Raises:
        ValueError: a ``rope_type`` outside :data:`ROPE_TYPES`, or ``partial_rotary_factor`` != 1.
    """
    rope = rope_parameters(cfg)
    rtype = rope["rope_type"]
    if rtype not in ROPE_TYPES:
        raise ValueError(f"rope_type {rtype!r} is not supported; supported: {list(ROPE_TYPES)}")
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial_rotary_factor != 1 is not supported")
    return rope
