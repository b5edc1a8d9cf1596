"""Projections and embeddings held in a GGUF file's own blocks, with no fp32 copy.

Every row count runs the one block kernel of the weight's type (:func:`radixrt.kernels.quant.mm`: int8
activations per row, a fixed reduction order), so a row's result does not depend on the rows beside it:
a cache hit and a miss, alone or batched, give the same greedy tokens.
"""

from __future__ import annotations

import torch
from torch import nn

from radixrt.kernels import layer as layer_kernels
from radixrt.runtime.layers import ggml_ops as ggml
from radixrt.runtime.layers.projection import Projection


class GGMLLinear(Projection):
    """``y = x @ W.T (+ bias)`` over ``W`` in GGUF blocks.

    A type with an x16 layout (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) and a multiple of 16 rows is
    repacked into it once, here (:func:`radixrt.runtime.layers.ggml_ops.use_x16`; our own copy in huge pages, and
    the file's pages are left to the page cache): a product of T rows then streams the weight once for all T rows
    (:mod:`radixrt.kernels.quant.x16`). Either layout gives a row the same bits whatever the other rows.

    Args:
        type_name: the ggml type (one of :data:`radixrt.kernels.quant.SUPPORTED`).
        blocks: ``[out, in / block * type_size]`` uint8, the file's bytes (one row per output channel).
        in_features: ``in``.
        bias: ``[out]`` fp32 or None.
        x16: repack into the x16 layout; ``None`` (default): where :func:`~.ggml_ops.use_x16` says so.

    Input ``[M, in]`` fp32, output ``[M, out]`` fp32, for any ``M``. Raises ValueError: an unknown type, or
    ``blocks`` not of that type's shape.
    """

    def __init__(
        self, type_name: str, blocks: torch.Tensor, in_features: int, bias: torch.Tensor | None, x16: bool | None = None
    ):
        super().__init__()
        self.type_name, self.type_id = type_name, ggml.type_id(type_name)
        self.in_features, self.out_features = in_features, blocks.shape[0]
        ggml.check_blocks(blocks, type_name, in_features)
        self.x16 = ggml.use_x16(type_name, blocks.shape[0]) if x16 is None else x16
        if self.x16:
            blocks, self.type_id = ggml.x16.repack(blocks, type_name), self.type_id | ggml.X16
        self.register_buffer("blocks", blocks.contiguous(), persistent=False)
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = ggml.mm(x.contiguous(), self.blocks, self.type_id)
        return y if self.bias is None else y + self.bias

    def kernel_weight(self, rows: int) -> tuple[int, torch.Tensor] | None:
        """``(kind, weight)`` for ``radixrt_layer.decode_layer``: the same product at every row count;
        ``None`` with a bias or without the C++ kernels."""
        if self.bias is not None or not ggml.has_kernels():
            return None
        return layer_kernels.GGML_BASE + self.type_id, self.blocks

    def weight_fp32(self) -> torch.Tensor:
        """The weight dequantized, fp32 ``[out, in]`` (for references and checks; either layout)."""
        return ggml.dequantize(self.blocks, self.type_name, self.in_features, self.x16)

    @property
    def nbytes(self) -> int:
        return self.blocks.numel() + (0 if self.bias is None else self.bias.numel() * 4)


class ConcatLinear(Projection):
    """One fused projection whose parts are stored in different types (a Q4_K_M file's ``attn_v`` in Q6_K
    beside Q4_K ``attn_q``/``attn_k``): each part's product, concatenated along the output."""

    def __init__(self, parts: list[Projection]):
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)

    def kernel_parts(self, rows: int) -> list[tuple[int, torch.Tensor]] | None:
        """Each part's ``(kind, weight)`` for ``radixrt_layer.decode_layer`` (which concatenates them as
        :meth:`forward` does); ``None`` if a part has none."""
        kw = [p.kernel_weight(rows) for p in self.parts]
        return None if any(k is None for k in kw) else kw

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


class GGMLEmbedding(nn.Module):
    """Token embeddings in GGUF blocks: a step dequantizes only the rows of its tokens, as llama.cpp's
    ``get_rows`` does (a Llama-3 vocabulary of 128k tokens is 1 GiB in fp32 at 1B, 2 GiB at 8B).

    ``blocks``: ``[vocab, hidden / block * type_size]`` uint8. Input ``[T]`` int64, output ``[T, hidden]`` fp32.
    """

    def __init__(self, type_name: str, blocks: torch.Tensor, hidden: int):
        super().__init__()
        self.type_name, self.hidden = type_name, hidden
        ggml.check_blocks(blocks, type_name, hidden)
        self.register_buffer("blocks", blocks.contiguous(), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return ggml.dequantize_rows(self.blocks[ids.reshape(-1)], self.type_name, self.hidden)

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()
