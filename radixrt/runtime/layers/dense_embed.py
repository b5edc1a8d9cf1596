"""Token embeddings held once in their own dtype (fp32, fp16 or bf16), rows widened to fp32 per step.

A tied LM head and its embedding share one copy: :class:`PanelEmbedding` reads its rows out of the head's
:class:`~radixrt.kernels.gemv.DenseWeight` panels (row ``r`` is column ``r % 32`` of panel ``r // 32``),
so a 2-byte model holds its vocabulary table once, not as a row table plus the head's panels.
"""

from __future__ import annotations

import torch
from torch import nn

from radixrt.kernels.gemv import PANEL, DenseWeight


class RowEmbedding(nn.Module):
    """``weight [vocab, hidden]`` fp32/fp16/bf16; input ``[T]`` int64, output ``[T, hidden]`` fp32."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.register_buffer("weight", weight.contiguous(), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight[ids.reshape(-1)].float()


class PanelEmbedding(nn.Module):
    """The rows of a head's ``DenseWeight [vocab, hidden]`` (no copy of the table); input ``[T]`` int64,
    output ``[T, hidden]`` fp32, exactly the stored values widened."""

    def __init__(self, head: DenseWeight):
        super().__init__()
        self.head = head
        self.vocab, self.hidden = head.shape

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.reshape(-1)
        h = self.head
        if h.panels is None:  # no C++ library: the plain [N, K] copy, read through its transpose
            return h.w_t.t()[ids].float()
        n, k = self.vocab, self.hidden
        full = n - n % PANEL
        out = torch.empty(ids.shape[0], k, dtype=torch.float32)
        inside = ids < full
        if bool(inside.any()):
            head = h.panels[: full * k].view(full // PANEL, k, PANEL)
            sel = ids[inside]
            out[inside] = head[sel // PANEL, :, sel % PANEL].float()
        if not bool(inside.all()):
            tail = h.panels[full * k :].view(k, n - full)
            out[~inside] = tail[:, ids[~inside] - full].t().float()
        return out
