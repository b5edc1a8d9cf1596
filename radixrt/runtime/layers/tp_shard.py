"""Shard a loaded ``LlamaForCausalLM`` for one tensor-parallel rank (layout: see layers/parallel.py).

Called once after the full weights are loaded on CPU and before the model moves to its device: each rank
keeps (copies of) its slices, so the full tensors can be freed. The model's attention modules are told
their local head counts; ``compute_logits`` is replaced by one that all-gathers the vocab shards.
"""

from __future__ import annotations

import torch
from torch import nn

from radixrt.runtime.layers.parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    TPGroup,
    VocabParallelEmbedding,
    inter_share,
    kv_heads,
    q_heads,
    vocab_range,
)


def local_heads(num_heads: int, num_kv_heads: int, tp: int) -> tuple[int, int]:
    """(query heads, KV heads) one rank holds; the KV pool is sized with the second.

    Raises:
        ValueError: the head counts do not split over ``tp`` ranks.
    """
    return len(q_heads(0, tp, num_heads)), len(kv_heads(0, tp, num_kv_heads))


def _rows(w: torch.Tensor, heads: list[int], head_dim: int) -> torch.Tensor:
    """Rows of ``w`` ``[n_heads * head_dim, in]`` belonging to ``heads``."""
    return w.view(-1, head_dim, w.shape[-1])[heads].reshape(-1, w.shape[-1])


def _linear(m: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    if type(m) is not nn.Linear:
        raise ValueError(
            f"tensor parallelism shards nn.Linear layers only, got {type(m).__name__} "
            "(quantized layers are not supported with --tp)"
        )
    return m.weight.detach(), None if m.bias is None else m.bias.detach()


def shard_model(model: nn.Module, tp: TPGroup) -> nn.Module:
    """Swap ``model``'s layers (a ``LlamaForCausalLM``) for rank ``tp.rank``'s parallel ones, in place.

    Raises:
        ValueError: head counts that do not split over ``tp.size``, or a layer that is not ``nn.Linear``.
    """
    if tp.size == 1:
        return model
    for layer in model.layers:
        shard_layer(layer, model.args, tp)
    return shard_vocab(model, tp)


def shard_layer(layer: nn.Module, a, tp: TPGroup) -> nn.Module:
    """Swap one ``DecoderLayer``'s projections (``a``: the model's ``ModelArgs``) for rank ``tp.rank``'s
    parallel ones, in place: what a layer-by-layer load calls before the next layer is read.

    Raises:
        ValueError: as :func:`shard_model`.
    """
    r, n = tp.rank, tp.size
    qh, kh = q_heads(r, n, a.num_heads), kv_heads(r, n, a.num_kv_heads)
    hd = a.head_dim
    attn, mlp = layer.self_attn, layer.mlp
    w, b = _linear(attn.qkv_proj)
    q_size, kv_size = a.num_heads * hd, a.num_kv_heads * hd
    wq, wk, wv = w.split([q_size, kv_size, kv_size])
    parts = [_rows(wq, qh, hd), _rows(wk, kh, hd), _rows(wv, kh, hd)]
    bias = None
    if b is not None:
        bq, bk, bv = b.split([q_size, kv_size, kv_size])
        bias = torch.cat(
            [_rows(bq[:, None], qh, hd)[:, 0], _rows(bk[:, None], kh, hd)[:, 0], _rows(bv[:, None], kh, hd)[:, 0]]
        )
    attn.qkv_proj = ColumnParallelLinear(torch.cat(parts), bias)
    w, b = _linear(attn.o_proj)
    cols = w.view(w.shape[0], a.num_heads, hd)[:, qh].reshape(w.shape[0], -1)
    attn.o_proj = RowParallelLinear(cols, b, tp)
    attn.nh, attn.nkv = len(qh), len(kh)
    attn.q_size, attn.kv_size = len(qh) * hd, len(kh) * hd

    w, b = _linear(mlp.gate_up_proj)
    inter, per = mlp.inter, inter_share(mlp.inter, n)
    sl = slice(r * per, (r + 1) * per)
    gate, up = w.split(inter)
    gb = None if b is None else torch.cat([b[:inter][sl], b[inter:][sl]])
    mlp.gate_up_proj = ColumnParallelLinear(torch.cat([gate[sl], up[sl]]), gb)
    w, b = _linear(mlp.down_proj)
    mlp.down_proj = RowParallelLinear(w[:, sl], b, tp)
    mlp.inter = per
    return layer


def shard_vocab(model: nn.Module, tp: TPGroup) -> nn.Module:
    """Keep rank ``tp.rank``'s vocabulary rows of the embedding and ``lm_head`` (copies: the whole tensors
    can be freed), and replace ``compute_logits`` by one that all-gathers the shards."""
    a, r, n = model.args, tp.rank, tp.size
    start, end = vocab_range(r, n, a.vocab_size)
    sizes = [e - s for s, e in (vocab_range(i, n, a.vocab_size) for i in range(n))]
    model.embed_tokens = VocabParallelEmbedding(model.embed_tokens.weight.detach(), start, end, tp)
    if model.lm_head is not None:
        head_w, _ = _linear(model.lm_head)
        model.lm_head = VocabParallelEmbedding(head_w, start, end, tp)  # holds the rows; never called
    head = model.embed_tokens if model.lm_head is None else model.lm_head

    @torch.inference_mode()
    def compute_logits(hidden: torch.Tensor) -> torch.Tensor:
        """``[n, hidden]`` -> fp32 logits ``[n, vocab]``, identical on every rank."""
        shard = torch.nn.functional.linear(hidden, head.weight).float()
        return tp.all_gather_last(shard, sizes)

    model.compute_logits = compute_logits  # instance attribute: shadows the single-device method
    model.tp = tp
    return model
