"""Tensor parallelism over a GGUF file's own blocks: each rank reads only its slices of each tensor from
the memory map, in the file's format, as the layer-by-layer load goes (no whole-model fp32 state dict).

The layout is layers/parallel.py's (Megatron-LM, Shoeybi et al. 2019):

    qkv_proj     column-parallel  rank r: rows of its query heads, then of its KV heads (q, k, v parts)
    gate_up_proj column-parallel  rank r: rows [r*I/tp, (r+1)*I/tp) of gate and of up
    o_proj       row-parallel     rank r: input columns of its query heads; outputs all-reduced
    down_proj    row-parallel     rank r: input columns [r*I/tp, (r+1)*I/tp); outputs all-reduced
    embed/head   vocab-parallel   rank r: vocabulary rows vocab_range(r); lookups summed, logits gathered

A row slice of a block tensor is a slice of whole rows (a view of the map where the rows are the file's).
A column slice must start and end on a block boundary (32 values for Q4_0..Q8_0, 256 for the K-quants),
so that each rank's blocks are exactly the file's: the ranks' partial sums are then the single-device
blocks' products, summed in another order.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from radixrt.runtime.layers.parallel import TPGroup, kv_heads, q_heads, vocab_range
from radixrt.runtime.models.args import ModelArgs
from radixrt.runtime.models.gguf_weights import RawTensor


def _row_range(t: RawTensor, start: int, end: int) -> RawTensor:
    """Rows ``[start, end)`` of ``t`` (a view of its data)."""
    return RawTensor(t.name, t.type_name, t.type_id, (end - start,) + t.shape[1:], t.data[start:end], t.owned)


def _col_range(t: RawTensor, start: int, end: int, tp: int) -> RawTensor:
    """Input columns ``[start, end)`` of ``t`` (our own copy: each row keeps a run of its blocks).

    Raises:
        ValueError: ``start`` or ``end`` is not on a block boundary of ``t``'s type.
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(t.type_id)]
    if start % block or end % block:
        raise ValueError(f"--tp {tp}: {t.name} ({t.type_name}, blocks of {block} values) cannot be split at "
                         f"input columns [{start}, {end}): each rank's share must be whole blocks")
    if t.type_name in ("F32", "F16"):  # stored as items, the rest as bytes
        lo, hi = start, end
    else:
        lo, hi = start // block * size, end // block * size
    data = np.ascontiguousarray(t.data[:, lo:hi])
    return RawTensor(t.name, t.type_name, t.type_id, (t.shape[0], end - start), data, owned=True)


class TPSlices:
    """Which rows and columns of each GGUF tensor rank ``tp.rank`` of ``tp.size`` holds.

    Raises (at construction):
        ValueError: head counts, the intermediate size or the vocabulary that do not split over ``tp.size``.
    """

    def __init__(self, margs: ModelArgs, tp: TPGroup):
        self.tp, hd = tp, margs.head_dim
        qh = q_heads(tp.rank, tp.size, margs.num_heads)
        kh = kv_heads(tp.rank, tp.size, margs.num_kv_heads)
        self.num_heads, self.num_kv_heads = len(qh), len(kh)
        self.q = (qh[0] * hd, (qh[-1] + 1) * hd)  # heads are contiguous runs (layers/parallel.py)
        self.kv = (kh[0] * hd, (kh[-1] + 1) * hd)
        inter = margs.intermediate_size
        if inter % tp.size:
            raise ValueError(f"tp={tp.size} must divide intermediate_size={inter}")
        self.inter_size = inter // tp.size
        self.inter = (tp.rank * self.inter_size, (tp.rank + 1) * self.inter_size)
        self.vocab = vocab_range(tp.rank, tp.size, margs.vocab_size)
        self.vocab_sizes = [e - s for s, e in (vocab_range(i, tp.size, margs.vocab_size) for i in range(tp.size))]

    def projection(self, module: str, weights: list[RawTensor], biases: list[RawTensor] | None):
        """This rank's ``(weights, biases)`` of one fused projection (``gguf_weights.PROJECTIONS`` order).
        A row-parallel bias stays on rank 0 only, so that the all-reduce counts it once."""
        def rows(parts, ranges):
            return None if parts is None else [_row_range(p, *r) for p, r in zip(parts, ranges)]

        if module == "self_attn.qkv_proj":
            ranges = [self.q, self.kv, self.kv]
            return rows(weights, ranges), rows(biases, ranges)
        if module == "mlp.gate_up_proj":
            return rows(weights, [self.inter] * 2), rows(biases, [self.inter] * 2)
        cols = self.q if module == "self_attn.o_proj" else self.inter
        bias = biases if self.tp.rank == 0 else None
        return [_col_range(weights[0], *cols, self.tp.size)], bias

    def vocab_rows(self, t: RawTensor) -> RawTensor:
        """The embedding's or head's rows of this rank's vocabulary range."""
        return _row_range(t, *self.vocab)


class RowParallel(nn.Module):
    """``y = all_reduce(inner(x_r))``: a projection over this rank's input columns, in any format."""

    def __init__(self, inner: nn.Module, tp: TPGroup):
        super().__init__()
        self.inner, self.tp = inner, tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.inner(x))


class VocabShard(nn.Module):
    """An embedding over vocabulary rows ``[start, end)`` (any format); other ids give zeros; the ranks'
    lookups are summed. Input ``[T]`` int64, output ``[T, hidden]`` fp32."""

    def __init__(self, inner: nn.Module, start: int, end: int, tp: TPGroup):
        super().__init__()
        self.inner, self.start, self.end, self.tp = inner, start, end, tp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mine = (ids >= self.start) & (ids < self.end)
        out = self.inner(torch.where(mine, ids - self.start, 0))
        return self.tp.all_reduce(out * mine.unsqueeze(-1).to(out.dtype))


def finish(model: nn.Module, slices: TPSlices) -> nn.Module:
    """Tell ``model`` (assembled from this rank's slices) its local head counts and intermediate size, and
    gather the logits shards, so every rank samples from the same full ``[n, vocab]`` logits."""
    tp = slices.tp
    for layer in model.layers:
        attn = layer.self_attn
        attn.nh, attn.nkv = slices.num_heads, slices.num_kv_heads
        attn.q_size, attn.kv_size = attn.nh * attn.hd, attn.nkv * attn.hd
        layer.mlp.inter = slices.inter_size
    head = model.lm_head
    sizes = slices.vocab_sizes

    @torch.inference_mode()
    def compute_logits(hidden: torch.Tensor) -> torch.Tensor:
        """``[n, hidden]`` -> fp32 logits ``[n, vocab]``, identical on every rank."""
        return tp.all_gather_last(head(hidden).float(), sizes)

    model.compute_logits = compute_logits  # instance attribute: shadows the single-device method
    model.tp = tp
    return model
