"""The Llama-layout decoder (Llama 2/3.x, SmolLM2, Mistral, Qwen2/2.5, Qwen3) in one file, gpt-fast style.

RMSNorm, rotary position embeddings (:mod:`.rope`), grouped-query attention through an
:class:`AttentionBackend` over the paged KV pool, SwiGLU MLP and optionally tied embeddings. The residual
stream is carried beside each layer's output and added inside the next norm (``add_rms_norm``), and the
small elementwise ops are fused (:mod:`radixrt.kernels.fused`: C++ on an fp32 CPU, torch elsewhere). The families
differ only in the switches of :class:`~radixrt.runtime.models.args.ModelArgs`: q/k/v biases (Qwen2) and
per-head q/k RMSNorm (Qwen3). Tokens of all requests in a step are packed along one dimension (no
padding): every tensor below is ``[num_tokens, ...]``. When the C++ attention kernels run a step (an fp32
pool on the CPU: any step) each layer runs as one C++ op instead (:mod:`radixrt.kernels.layer`): the same
ops in the same order, without the Python between them.

The projections stay plain ``nn.Linear`` attributes named ``qkv_proj``, ``o_proj``, ``gate_up_proj`` and
``down_proj`` so that they can be swapped for quantized modules after loading.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from radixrt.kernels import fused, gemv
from radixrt.kernels.attention.base import AttentionBackend, KVCacheView, scales
from radixrt.kernels.layer import CONT, layer_ops
from radixrt.runtime.layers.projection import Projection
from radixrt.runtime.models.args import ModelArgs
from radixrt.runtime.models.rope import Rotary


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused.rms_norm(x, self.weight, self.eps)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual += x`` (in place), then the norm of the sum."""
        return fused.add_rms_norm(x, residual, self.weight, self.eps)


@dataclass(frozen=True)
class LayerWeights:
    """One layer's own arguments of ``radixrt_layer.decode_layer`` at a row count."""

    ln1: torch.Tensor  # input_layernorm weight [hidden] fp32
    ln2: torch.Tensor  # post_attention_layernorm weight [hidden] fp32
    eps: float  # both norms' epsilon
    kinds: list[int]  # how each of qkv, o, gate_up, down multiplies (kernels/layer constants;
    #                            a projection in parts: one per part, | CONT after the first)
    weights: list[torch.Tensor]  # the weights, each in its kind's layout


@dataclass(frozen=True)
class FusedStep:
    """What every layer's ``decode_layer`` call shares in one step; ``step(i, w, x, residual)`` runs layer i."""

    op: Callable  # torch.ops.radixrt_layer.decode_layer
    cos: torch.Tensor  # the step's rotary tables [T, head_dim / 2] fp32
    sin: torch.Tensor
    num_heads: int
    num_kv_heads: int
    scale: float  # head_dim ** -0.5
    pools: list  # per layer: flat K, V pools [slots, num_kv_heads, head_dim] and their int8
    #                            scales [slots, num_kv_heads] (empty tensors for a float pool)
    attn_args: tuple  # the backend's kernel_args(): slots written, rows and blocks attended

    def __call__(self, i: int, w: LayerWeights, x: torch.Tensor, residual: torch.Tensor | None):
        return self.op(
            x,
            residual,
            w.ln1,
            w.ln2,
            w.eps,
            w.kinds,
            w.weights,
            self.cos,
            self.sin,
            self.num_heads,
            self.num_kv_heads,
            self.scale,
            *self.pools[i],
            *self.attn_args,
        )


class Attention(nn.Module):
    def __init__(self, a: ModelArgs, layer: int):
        super().__init__()
        self.layer, self.nh, self.nkv, self.hd = layer, a.num_heads, a.num_kv_heads, a.head_dim
        self.q_size, self.kv_size = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        # q, k and v fused into one matmul: one pass over the activations instead of three.
        self.qkv_proj = nn.Linear(a.hidden_size, self.q_size + 2 * self.kv_size, bias=a.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, a.hidden_size, bias=a.o_bias)
        self.scale = a.head_dim**-0.5
        # Qwen3 normalises every q and k head over head_dim before RoPE (keeps attention logits bounded)
        self.q_norm = RMSNorm(a.head_dim, a.rms_norm_eps) if a.qk_norm else None
        self.k_norm = RMSNorm(a.head_dim, a.rms_norm_eps) if a.qk_norm else None

    def forward(self, x, rope: tuple[torch.Tensor, torch.Tensor], attn: AttentionBackend, kv: KVCacheView):
        """``rope``: the step's ``(cos, sin)`` tables (:meth:`Rotary.tables`)."""
        T = x.shape[0]
        qkv = self.qkv_proj(x)
        v = qkv[:, self.q_size + self.kv_size :].view(T, self.nkv, self.hd)
        if self.q_norm is None:  # q and k heads rotated in one call, in place in the qkv output
            qk = fused.rope_(qkv[:, : self.q_size + self.kv_size].view(T, self.nh + self.nkv, self.hd), *rope)
            q, k = qk[:, : self.nh], qk[:, self.nh :]
        else:
            q = self.q_norm(qkv[:, : self.q_size].reshape(T * self.nh, self.hd)).view(T, self.nh, self.hd)
            k = self.k_norm(qkv[:, self.q_size : self.q_size + self.kv_size].reshape(T * self.nkv, self.hd))
            q, k = fused.rope_(q, *rope), fused.rope_(k.view(T, self.nkv, self.hd), *rope)
        o = attn.forward(q, k, v, self.layer, kv, self.scale)
        return self.o_proj(o.reshape(T, self.q_size))


class MLP(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.inter = a.intermediate_size
        self.gate_up_proj = nn.Linear(a.hidden_size, 2 * a.intermediate_size, bias=a.mlp_bias)
        self.down_proj = nn.Linear(a.intermediate_size, a.hidden_size, bias=a.mlp_bias)

    def forward(self, x):
        return self.down_proj(fused.silu_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, a: ModelArgs, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.self_attn = Attention(a, layer)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.mlp = MLP(a)

    def forward(self, x, residual, rope, attn, kv):
        """``x``: the previous layer's output, not yet in ``residual`` (the stream, updated in place); for
        the first layer the embeddings, with ``residual`` None. Returns ``(output, residual)``."""
        if residual is None:
            h, residual = self.input_layernorm(x), x
        else:
            h = self.input_layernorm.add(x, residual)
        h = self.post_attention_layernorm.add(self.self_attn(h, rope, attn, kv), residual)
        return self.mlp(h), residual

    def fused_args(self, rows: int) -> LayerWeights | None:
        """The layer's own arguments of ``radixrt_layer.decode_layer`` (:mod:`radixrt.kernels.layer`) at
        ``rows`` tokens; ``None`` where that op cannot run this layer
        (per-head q/k norms, a bias, a weight format without a C++ kernel). Cached per row count."""
        cache = self.__dict__.setdefault("_fused", {})
        if rows not in cache:
            a, m = self.self_attn, self.mlp
            parts = [_kernel_parts(lin, rows) for lin in (a.qkv_proj, a.o_proj, m.gate_up_proj, m.down_proj)]
            ok = a.q_norm is None and all(p is not None for p in parts)
            kinds = [k | (CONT if j else 0) for p in parts if ok for j, (k, _) in enumerate(p)]
            cache[rows] = (
                LayerWeights(
                    self.input_layernorm.weight,
                    self.post_attention_layernorm.weight,
                    self.input_layernorm.eps,
                    kinds,
                    [w for p in parts for _, w in p],
                )
                if ok
                else None
            )
        return cache[rows]


def _kernel_parts(lin: nn.Module, rows: int) -> list[tuple[int, torch.Tensor]] | None:
    """``lin``'s ``(kind, weight)`` parts for ``decode_layer`` at ``rows`` rows (one unless stored in parts of
    different types), or ``None`` where the op cannot run it."""
    return lin.kernel_parts(rows) if isinstance(lin, Projection) else None  # torch's own modules: none


class LlamaForCausalLM(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.args = a
        self.embed_tokens = nn.Embedding(a.vocab_size, a.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(a, i) for i in range(a.num_layers))
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.lm_head = None if a.tie_word_embeddings else nn.Linear(a.hidden_size, a.vocab_size, bias=False)
        self.rotary = Rotary(a.inv_freq, a.max_position_embeddings, a.rope_scaling)
        self._pools: tuple = (None, None)  # (pool, its layers' flat views for decode_layer), made once per pool
        self._head: gemv.DenseWeight | None = None  # an fp32 head's panels, made at its first use

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend, kv: KVCacheView
    ) -> torch.Tensor:
        """Run all layers. ``input_ids``/``positions``: ``[T]`` int64. Returns hidden ``[T, hidden]``.

        ``attn.plan(meta)`` must have been called for this step.
        """
        x, residual = self.embed_tokens(input_ids), None
        rope = self.rotary.tables(positions, x.dtype)  # once per step, not per layer
        step = self._fused_step(attn, kv, rope, x)
        for i, layer in enumerate(self.layers):
            weights = step and layer.fused_args(x.shape[0])
            if weights:  # the whole layer in one C++ op: same kernels, same bits, no Python per op
                x, residual = step(i, weights, x, residual)
            else:
                x, residual = layer(x, residual, rope, attn, kv)
        return self.norm.add(x, residual)

    def _fused_step(self, attn: AttentionBackend, kv: KVCacheView, rope, x: torch.Tensor) -> FusedStep | None:
        """The step's shared arguments of ``radixrt_layer.decode_layer``, or ``None`` when this step runs
        layer by layer: no C++ library,
        not fp32 on the CPU, or a backend without the C++ attention kernels (``kernel_args``)."""
        ops = layer_ops() if x.is_cpu and x.dtype == torch.float32 else None
        args = attn.kernel_args() if ops is not None else None
        if args is None:
            return None
        a = self.layers[0].self_attn
        if self._pools[0] is not kv:  # flat [slots, Hkv, D] views, made once per pool
            none = torch.zeros(0)
            self._pools = (
                kv,
                [
                    (
                        kv.k_buffer(i).view(-1, a.nkv, a.hd),
                        kv.v_buffer(i).view(-1, a.nkv, a.hd),
                        *(none if s is None else s.view(-1, a.nkv) for s in scales(kv, i)),
                    )
                    for i in range(len(self.layers))
                ],
            )
        return FusedStep(
            ops.decode_layer, rope[0].squeeze(1), rope[1].squeeze(1), a.nh, a.nkv, a.scale, self._pools[1], tuple(args)
        )

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[n, hidden]`` -> fp32 logits ``[n, vocab]``."""
        if self.lm_head is not None and not isinstance(self.lm_head, nn.Linear):
            return self.lm_head(hidden)  # a weight format swapped in by runtime/layers/quant.py
        w = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        if w.device.type != "cpu" or w.dtype != torch.float32:
            return F.linear(hidden, w).float()
        if self._head is None:  # the C++ GEMV at a few rows, oneDNN above (kernels/gemv)
            self._head = gemv.DenseWeight(w)
        return self._head(hidden)

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Load a transformers ``{Llama,Mistral,Qwen2,Qwen3}ForCausalLM`` state dict, fusing q/k/v and gate/up.

        Raises:
            ValueError: a missing or unexpected tensor.
        """
        a, own = self.args, {}
        for i in range(a.num_layers):
            own.update({f"layers.{i}.{k}": v for k, v in fuse_hf(hf_names(a, i), sd.__getitem__, a).items()})
        own.update(fuse_hf(hf_names(a, None), sd.__getitem__, a))
        missing, unexpected = self.load_state_dict(own, strict=False)
        missing = [m for m in missing if not m.startswith("rotary")]
        if missing or unexpected:
            raise ValueError(f"weights do not fit the {a.model_type} model: missing={missing} unexpected={unexpected}")


def hf_names(a: ModelArgs, layer: int | None) -> dict[str, list[str]]:
    """Our parameter names -> the transformers tensors each one is made of (row-concatenated: q/k/v and
    gate/up are fused). ``layer`` i: the names of ``layers.{i}`` relative to it; None: the model's own
    (embedding, final norm, and ``lm_head`` unless tied)."""
    if layer is None:
        out = {"embed_tokens.weight": ["model.embed_tokens.weight"], "norm.weight": ["model.norm.weight"]}
        if not a.tie_word_embeddings:
            out["lm_head.weight"] = ["lm_head.weight"]
        return out
    p, out = f"model.layers.{layer}.", {}
    for kind in ["weight"] + (["bias"] if a.qkv_bias else []):
        out[f"self_attn.qkv_proj.{kind}"] = [p + f"self_attn.{n}_proj.{kind}" for n in "qkv"]
    for kind in ["weight"] + (["bias"] if a.o_bias else []):
        out[f"self_attn.o_proj.{kind}"] = [p + f"self_attn.o_proj.{kind}"]
    for kind in ["weight"] + (["bias"] if a.mlp_bias else []):
        out[f"mlp.gate_up_proj.{kind}"] = [p + f"mlp.gate_proj.{kind}", p + f"mlp.up_proj.{kind}"]
        out[f"mlp.down_proj.{kind}"] = [p + f"mlp.down_proj.{kind}"]
    norms = ["input_layernorm", "post_attention_layernorm"]
    norms += ["self_attn.q_norm", "self_attn.k_norm"] if a.qk_norm else []
    out.update({f"{n}.weight": [p + f"{n}.weight"] for n in norms})
    return out


def fuse_hf(names: dict[str, list[str]], get: Callable[[str], torch.Tensor], a: ModelArgs) -> dict[str, torch.Tensor]:
    """``{our name: tensor}`` for :func:`hf_names`' ``names``, each read by ``get(transformers name)``.

    Raises:
        ValueError: ``get`` raised KeyError (the message names the missing tensor).
    """
    own = {}
    for dst, parts in names.items():
        try:
            own[dst] = torch.cat([get(n) for n in parts], dim=0) if len(parts) > 1 else get(parts[0])
        except KeyError as e:
            raise ValueError(f"weights do not fit the {a.model_type} model: missing {e.args[0]}") from None
    return own
