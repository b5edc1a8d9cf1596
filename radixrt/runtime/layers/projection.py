"""What a projection module declares to the one-op decoder layer (``radixrt_layer.decode_layer``): callers read
these methods instead of probing modules for them."""

from __future__ import annotations

import torch
from torch import nn


class Projection(nn.Module):
    """A linear layer radixrt built (a weight format of :mod:`radixrt.runtime.layers`).

    - :meth:`kernel_weight`: the ``(kind, weight)`` that ``decode_layer`` runs for ``rows`` activation rows
      (``radixrt.kernels.layer`` kinds), or None where it cannot (a bias, no C++ kernels); default None.
    - :meth:`kernel_parts`: the same as a list of parts whose outputs are concatenated (one part unless the
      weight is stored in parts of different types); default ``[kernel_weight(rows)]``.
    - :attr:`nbytes`: bytes of the weights it holds.
    """

    def kernel_weight(self, rows: int) -> tuple[int, torch.Tensor] | None:
        return None

    def kernel_parts(self, rows: int) -> list[tuple[int, torch.Tensor]] | None:
        kw = self.kernel_weight(rows)
        return None if kw is None else [kw]

    @property
    def nbytes(self) -> int:
        return 0
