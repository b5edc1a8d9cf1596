"""The decoder's shape and per-family options, read from a transformers config.

Llama, Mistral, Qwen2 and Qwen3 share one layout (RMSNorm, RoPE, GQA attention, SwiGLU MLP); they differ
only in the switches of :class:`Family`:

- llama (Llama 2/3.x, SmolLM2): biases per the config's ``attention_bias``; rope default, linear,
  llama3 or yarn;
- mistral: no biases; a ``sliding_window`` caps the context length (no sliding-window kernel, so only
  contexts the window covers entirely are served);
- qwen2 (Qwen2, Qwen2.5): q/k/v biases, none on o_proj;
- qwen3: RMSNorm over each q and k head (``q_norm``/``k_norm``) before RoPE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from radixrt.runtime.models.rope_params import check_rope

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Family:
    arch: str  # transformers architecture name
    qkv_bias: Optional[bool]  # None: the config's ``attention_bias``
    qk_norm: bool  # Qwen3: q_norm/k_norm over head_dim


FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaForCausalLM", None, False),
    "mistral": Family("MistralForCausalLM", False, False),
    "qwen2": Family("Qwen2ForCausalLM", True, False),
    "qwen3": Family("Qwen3ForCausalLM", None, True),
}
SUPPORTED_ARCHS = tuple(f.arch for f in FAMILIES.values())


def family(cfg) -> Family:
    """The :class:`Family` of a transformers config.

    Raises:
        ValueError: an unsupported ``model_type``; the message lists the supported architectures.
    """
    fam = FAMILIES.get(getattr(cfg, "model_type", None))
    if fam is None:
        mt = getattr(cfg, "model_type", None)
        archs = getattr(cfg, "architectures", None)
        what = f"architecture {archs[0]!r} (model_type {mt!r})" if archs else f"model_type {mt!r}"
        raise ValueError(f"{what} is not supported; Supported: {list(SUPPORTED_ARCHS)}")
    return fam


@dataclass
class ModelArgs:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    max_position_embeddings: int  # tokens; capped by a sliding window (full attention inside it)
    inv_freq: torch.Tensor  # [head_dim // 2] fp32
    rope_scaling: float = 1.0  # multiplies cos/sin (YaRN)
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    model_type: str = "llama"

    @staticmethod
    def check(cfg) -> None:
        """What :meth:`from_hf` refuses, without torch (the server's main process checks a model with it).

        Raises:
            ValueError: an unsupported architecture or rope type.
        """
        family(cfg)
        check_rope(cfg)

    @classmethod
    def from_hf(cls, cfg) -> "ModelArgs":
        """Raises ValueError for an unsupported architecture or rope type."""
        from radixrt.runtime.models.rope import inv_freq  # torch: only where a model is built

        fam = family(cfg)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        freqs, scaling = inv_freq(cfg, head_dim)
        attn_bias = bool(getattr(cfg, "attention_bias", False))
        max_pos = cfg.max_position_embeddings
        window = getattr(cfg, "sliding_window", None)
        if window:  # no sliding-window kernel: serve only contexts where the window covers everything
            max_pos = min(max_pos, window)
        return cls(
            cfg.vocab_size,
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.num_hidden_layers,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            head_dim,
            cfg.rms_norm_eps,
            bool(getattr(cfg, "tie_word_embeddings", False)),
            max_pos,
            freqs,
            scaling,
            qkv_bias=attn_bias if fam.qkv_bias is None else fam.qkv_bias,
            o_bias=attn_bias and fam.qkv_bias is None,
            mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
            qk_norm=fam.qk_norm,
            model_type=cfg.model_type,
        )
