"""Rotary position embeddings: the inverse frequencies of a config's ``rope_type`` and the cos/sin tables.

Supported ``rope_type`` values: ``default``, ``linear`` (position interpolation, kaiokendev), ``llama3``
(Llama 3.1's wavelength-banded scaling) and ``yarn`` (Peng et al. 2023, arXiv:2309.00071). ``default``,
``linear`` and ``llama3`` are computed here with the same torch ops in the same order as transformers'
``ROPE_INIT_FUNCTIONS`` (equal bit for bit, tests/models/test_light_meta.py), so that a GGUF served by the
scheduler process needs no transformers import; ``yarn`` takes its frequencies from transformers. ``dynamic``
and ``longrope`` are refused because their frequencies change with the sequence length at run time, which a
fixed table cannot express.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from radixrt.runtime.models.rope_params import ROPE_TYPES, check_rope, rope_parameters  # noqa: F401 (re-exported)


def inv_freq(cfg, head_dim: int) -> tuple[torch.Tensor, float]:
    """``(inv_freq [head_dim // 2] fp32, attention_scaling)`` for the config's rope.

    ``attention_scaling`` multiplies cos and sin (YaRN's mscale; 1.0 otherwise).

    Raises:
        ValueError: a ``rope_type`` outside :data:`ROPE_TYPES`, or ``partial_rotary_factor`` != 1.
    """
    rope = check_rope(cfg)
    rtype = rope["rope_type"]
    if rtype in ("default", "linear", "llama3"):
        # fp32 arithmetic in the same order as transformers, so greedy tokens match it exactly
        exps = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        freqs = 1.0 / (float(rope["rope_theta"]) ** exps)
        if rtype == "linear":
            freqs /= rope["factor"]
        elif rtype == "llama3":
            freqs = _llama3(freqs, rope, cfg.max_position_embeddings)
        return freqs, 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    freqs, scaling = ROPE_INIT_FUNCTIONS[rtype](cfg, torch.device("cpu"))
    return freqs.float(), float(scaling)


def _llama3(inv: torch.Tensor, rope: dict, max_pos: int) -> torch.Tensor:
    """Llama 3.1's banded scaling of ``inv`` (transformers' ``_compute_llama3_parameters``, op for op):
    wavelengths above ``original_max_position_embeddings / low_freq_factor`` divided by ``factor``, below
    ``/ high_freq_factor`` kept, a linear blend between."""
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope.get("original_max_position_embeddings", max_pos)
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class Rotary(nn.Module):
    """cos/sin tables ``[max_pos, head_dim]`` fp32, indexed by each token's position (rotate-half form).

    ``sin`` is stored with its first half negated, so that ``rotate_half(x) * sin`` is
    ``roll(x, D/2) * sin``: one op fewer per call, and bit-identical (a sign flip is exact).
    """

    def __init__(self, inv: torch.Tensor, max_pos: int, scaling: float = 1.0):
        super().__init__()
        # the current default device (meta inside ``with torch.device("meta")``: a model made there to be
        # filled by a loader allocates no table; 131072 positions are ~200 MB of transient fp32 at Llama 3)
        inv = inv.to(torch.empty(0).device)
        if inv.device.type == "meta":  # shapes only: ops on meta tensors run torch's Python references,
            # whose first call imports torch._dynamo (~1.7 s of a cold start)
            shape = (max_pos, 2 * inv.shape[0])
            self.register_buffer("cos", torch.empty(shape), persistent=False)
            self.register_buffer("sin_signed", torch.empty(shape), persistent=False)
            return
        freqs = torch.arange(max_pos, dtype=torch.float32, device=inv.device)[:, None] * inv.float()[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        sin = emb.sin() * scaling
        sin[:, : sin.shape[1] // 2] *= -1
        self.register_buffer("cos", emb.cos() * scaling, persistent=False)
        self.register_buffer("sin_signed", sin, persistent=False)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` ``[T, 1, head_dim]`` in ``dtype`` for ``positions [T]`` int64: gathered once per
        step and shared by every layer."""
        return self.cos[positions].unsqueeze(1).to(dtype), self.sin_signed[positions].unsqueeze(1).to(dtype)
