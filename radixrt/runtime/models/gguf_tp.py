"""Tensor parallelism over a GGUF file's own blocks: each rank reads only its slices of each tensor from
the memory map, in the file's format, as the layer-by-layer load goes (no whole-model fp32 state dict).

Every projection is split by output rows, so every output value is computed by one rank with exactly the
one-device arithmetic (the same blocks, the same int8 activation blocks, the same reduction order):

    qkv_proj     rank r: rows of its query heads, then of its KV heads (q, k, v parts); outputs stay sharded
    gate_up_proj rank r: rows [r*I/tp, (r+1)*I/tp) of gate and of up; outputs stay sharded
    o_proj       rank r: rows [r*H/tp, ...) of the hidden size, over the whole input, which is first
    down_proj    all-gathered from the ranks' shards; the output shards are all-gathered again
    embed/head   rank r: vocabulary rows vocab_range(r); lookups summed (one rank adds a non-zero), logits
                 gathered

Megatron-LM (Shoeybi et al. 2019) splits ``o_proj``/``down_proj`` by input columns and all-reduces partial
sums instead: one collective, not two, but the sums then add in another order than one device's, and with
int8 activations (a value near a rounding boundary of amax / 127 flips) greedy tokens drift from one
device's and with the batch (gloo's ring reduces each element in an order that depends on the tensor's
size). Gathering keeps ``--tp N`` bit-identical to ``--tp 1`` and batch-invariant at every format. Every
split is by whole rows (views of the map), so no block is ever cut.
"""

from __future__ import annotations

import torch
from torch import nn

from radixrt.runtime.layers.parallel import TPGroup, inter_share, kv_heads, q_heads, vocab_range
from radixrt.runtime.models.args import ModelArgs
from radixrt.runtime.models.gguf_weights import RawTensor


def _row_range(t: RawTensor, start: int, end: int) -> RawTensor:
    """Rows ``[start, end)`` of ``t`` (a view of its data)."""
    return RawTensor(t.name, t.type_name, t.type_id, (end - start,) + t.shape[1:], t.data[start:end], t.owned)


class TPSlices:
    """Which rows of each GGUF tensor rank ``tp.rank`` of ``tp.size`` holds.

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
        self.inter_size = inter_share(margs.intermediate_size, tp.size)
        self.inter = (tp.rank * self.inter_size, (tp.rank + 1) * self.inter_size)
        self.hidden = vocab_range(tp.rank, tp.size, margs.hidden_size)  # the same near-even split
        self.hidden_sizes = _sizes(tp.size, margs.hidden_size)
        self.q_sizes = [len(q_heads(i, tp.size, margs.num_heads)) * hd for i in range(tp.size)]
        self.inter_sizes = [self.inter_size] * tp.size
        self.vocab = vocab_range(tp.rank, tp.size, margs.vocab_size)
        self.vocab_sizes = _sizes(tp.size, margs.vocab_size)

    def projection(self, module: str, weights: list[RawTensor], biases: list[RawTensor] | None):
        """This rank's output rows ``(weights, biases)`` of one fused projection (``gguf_weights.PROJECTIONS``
        order)."""
        if module == "self_attn.qkv_proj":
            ranges = [self.q, self.kv, self.kv]
        elif module == "mlp.gate_up_proj":
            ranges = [self.inter] * 2
        else:  # o_proj, down_proj: rows of the hidden size (their whole input is gathered first)
            ranges = [self.hidden]
        return (
            [_row_range(p, *r) for p, r in zip(weights, ranges)],
            None if biases is None else [_row_range(b, *r) for b, r in zip(biases, ranges)],
        )

    def gathered(self, module: str, inner: nn.Module) -> nn.Module:
        """``o_proj`` / ``down_proj`` over this rank's output rows, between the two all-gathers."""
        ins = self.q_sizes if module == "self_attn.o_proj" else self.inter_sizes
        return GatherLinear(inner, ins, self.hidden_sizes, self.tp)

    def vocab_rows(self, t: RawTensor) -> RawTensor:
        """The embedding's or head's rows of this rank's vocabulary range."""
        return _row_range(t, *self.vocab)


def _sizes(tp: int, n: int) -> list[int]:
    return [e - s for s, e in (vocab_range(i, tp, n) for i in range(tp))]


class GatherLinear(nn.Module):
    """``y = gather(inner(gather(x_r)))``: the ranks' input shards ``[T, ins[r]]`` joined into the whole
    input, this rank's output rows computed on it (any format), the output shards ``[T, outs[r]]`` joined."""

    def __init__(self, inner: nn.Module, ins: list[int], outs: list[int], tp: TPGroup):
        super().__init__()
        self.inner, self.ins, self.outs, self.tp = inner, ins, outs, tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_gather_last(self.inner(self.tp.all_gather_last(x.contiguous(), self.ins)), self.outs)


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
