"""Llama-family decoder (SmolLM2, Llama 2/3) in one readable file, gpt-fast style.

RMSNorm, rotary position embeddings (rotate-half form, as in transformers) with the config's
``rope_theta``, grouped-query attention through an :class:`AttentionBackend` over the paged KV pool,
SwiGLU MLP and optionally tied embeddings. Tokens of all requests in a step are packed along one
dimension (no padding): every tensor below is ``[num_tokens, ...]``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixrt.kernels.attention.base import AttentionBackend, KVCacheView


@dataclass
class LlamaArgs:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    max_position_embeddings: int

    @classmethod
    def from_hf(cls, cfg) -> "LlamaArgs":
        rope = getattr(cfg, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        rtype = rope.get("rope_type", "default")
        if rtype not in ("default", None):
            raise ValueError(f"rope_type {rtype!r} is not supported (only 'default')")
        return cls(cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers,
                   cfg.num_attention_heads, cfg.num_key_value_heads,
                   getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
                   float(theta), cfg.rms_norm_eps, bool(cfg.tie_word_embeddings), cfg.max_position_embeddings)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Rotary(nn.Module):
    """cos/sin tables ``[max_pos, head_dim]``, indexed by each token's position."""

    def __init__(self, head_dim: int, max_pos: int, theta: float):
        super().__init__()
        inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        freqs = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos().float(), persistent=False)
        self.register_buffer("sin", emb.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos = self.cos[positions].unsqueeze(1).to(x.dtype)   # [T, 1, D]
        sin = self.sin[positions].unsqueeze(1).to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, a: LlamaArgs, layer: int):
        super().__init__()
        self.layer, self.nh, self.nkv, self.hd = layer, a.num_heads, a.num_kv_heads, a.head_dim
        self.q_size, self.kv_size = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        # q, k and v fused into one matmul: one pass over the activations instead of three.
        self.qkv_proj = nn.Linear(a.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, a.hidden_size, bias=False)
        self.scale = a.head_dim ** -0.5

    def forward(self, x, positions, rotary: Rotary, attn: AttentionBackend, kv: KVCacheView):
        T = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = rotary(q.view(T, self.nh, self.hd), positions)
        k = rotary(k.view(T, self.nkv, self.hd), positions)
        o = attn.forward(q, k, v.view(T, self.nkv, self.hd), self.layer, kv, self.scale)
        return self.o_proj(o.reshape(T, self.q_size))


class MLP(nn.Module):
    def __init__(self, a: LlamaArgs):
        super().__init__()
        self.inter = a.intermediate_size
        self.gate_up_proj = nn.Linear(a.hidden_size, 2 * a.intermediate_size, bias=False)
        self.down_proj = nn.Linear(a.intermediate_size, a.hidden_size, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).split(self.inter, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, a: LlamaArgs, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.self_attn = Attention(a, layer)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.mlp = MLP(a)

    def forward(self, x, positions, rotary, attn, kv):
        x = x + self.self_attn(self.input_layernorm(x), positions, rotary, attn, kv)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(nn.Module):
    def __init__(self, a: LlamaArgs):
        super().__init__()
        self.args = a
        self.embed_tokens = nn.Embedding(a.vocab_size, a.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(a, i) for i in range(a.num_layers))
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.lm_head = None if a.tie_word_embeddings else nn.Linear(a.hidden_size, a.vocab_size, bias=False)
        self.rotary = Rotary(a.head_dim, a.max_position_embeddings, a.rope_theta)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend,
                kv: KVCacheView) -> torch.Tensor:
        """Run all layers. ``input_ids``/``positions``: ``[T]`` int64. Returns hidden ``[T, hidden]``.

        ``attn.plan(meta)`` must have been called for this step.
        """
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, positions, self.rotary, attn, kv)
        return self.norm(x)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[n, hidden]`` -> fp32 logits ``[n, vocab]``."""
        if self.lm_head is not None and not isinstance(self.lm_head, nn.Linear):
            return self.lm_head(hidden)  # a weight format swapped in by runtime/layers/quant.py
        w = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        if w.device.type != "cpu":
            return F.linear(hidden, w).float()
        # On CPU a [hidden, vocab] copy makes the skinny decode matmul ~2x faster than F.linear's
        # transposed read of the [vocab, hidden] matrix (measured: 5.2 vs 9.9 ms for SmolLM2's 113 MB).
        if getattr(self, "_lm_head_t", None) is None or self._lm_head_t.dtype != w.dtype:
            self._lm_head_t = w.t().contiguous()
        return (hidden @ self._lm_head_t).float()

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Load a transformers ``LlamaForCausalLM`` state dict, fusing q/k/v and gate/up.

        Raises:
            ValueError: a missing or unexpected tensor.
        """
        own: dict[str, torch.Tensor] = {}
        for i in range(self.args.num_layers):
            p = f"model.layers.{i}."
            own[f"layers.{i}.self_attn.qkv_proj.weight"] = torch.cat(
                [sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"], dim=0)
            own[f"layers.{i}.self_attn.o_proj.weight"] = sd[p + "self_attn.o_proj.weight"]
            own[f"layers.{i}.mlp.gate_up_proj.weight"] = torch.cat(
                [sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]], dim=0)
            own[f"layers.{i}.mlp.down_proj.weight"] = sd[p + "mlp.down_proj.weight"]
            for n in ("input_layernorm", "post_attention_layernorm"):
                own[f"layers.{i}.{n}.weight"] = sd[p + f"{n}.weight"]
        own["embed_tokens.weight"] = sd["model.embed_tokens.weight"]
        own["norm.weight"] = sd["model.norm.weight"]
        if self.lm_head is not None:
            own["lm_head.weight"] = sd["lm_head.weight"]
        missing, unexpected = self.load_state_dict(own, strict=False)
        missing = [m for m in missing if not m.startswith("rotary")]
        if missing or unexpected:
            raise ValueError(f"weights do not fit the Llama model: missing={missing} unexpected={unexpected}")
