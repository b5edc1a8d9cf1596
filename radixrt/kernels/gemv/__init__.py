"""fp32 products ``x @ w.T`` of a projection, in the layout that wins at the step's row count.

- Up to :data:`MAX_ROWS` rows, radixrt's C++ GEMV (``fp32_gemv.cpp``) over the weight repacked once into
  column panels (:func:`pack_panels`): each thread reads one contiguous range of the weight, which is all a
  memory-bound product needs. BLAS pays for packing the weight on every call and, on a VM, for waking its
  threads.
- More rows, oneDNN's inner product (``torch.ops.mkldnn._linear_pointwise``) over a copy packed once into its
  own blocked layout (``torch.ops.mkldnn._reorder_linear_weight``, what inductor's CPU freezing pass
  does).
- Without the C++ library or oneDNN, ``x @ w_t``.

Measured on SmolLM2's whole-model projections (30 layers x 4 + the LM head, 121 distinct weights, so none
is in cache; 2 cores; ms, panel GEMV vs oneDNN, one run): rows 1: 15.1 vs 29.7, 4: 21.3 vs 31.2, 6: 24.6 vs
27.8, 8: 29.5 vs 30.2, 12: 35.5 vs 35.7. Earlier, oneDNN vs ``x @ w_t``: rows 8: 29.9 vs 77.0, 32: 58.6 vs
118.0, 64: 100.9 vs 160.1, 256: 365.7 vs 493.4, 1024: 1427.2 vs 1789.3.
"""
from __future__ import annotations

import torch

from radixrt.kernels import cpp

# Rows up to which the C++ GEMV runs (at 8 it ties oneDNN, figures above).
MAX_ROWS = 8
PANEL = 32  # output columns per panel, as in fp32_gemv.cpp


def onednn_ok() -> bool:
    """True where torch has oneDNN (every x86 CPU build does)."""
    return torch.backends.mkldnn.is_available()


def pack_panels(w: torch.Tensor) -> torch.Tensor:
    """``w [N, K]`` fp32 -> ``[N * K]`` fp32: panels of :data:`PANEL` rows of ``w`` (output columns), each
    stored transposed ``[K, PANEL]``, one after another; the last ``[K, N % PANEL]`` when ``N`` is ragged."""
    n, k = w.shape
    full = n - n % PANEL
    head = w[:full].reshape(full // PANEL, PANEL, k).transpose(1, 2).reshape(-1)
    return torch.cat([head, w[full:].t().reshape(-1)]).contiguous()


def unpack_panels(w_p: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The inverse of :func:`pack_panels`: ``[N * K]`` -> ``[N, K]``."""
    full = n - n % PANEL
    head = w_p[:full * k].reshape(full // PANEL, k, PANEL).transpose(1, 2).reshape(full, k)
    return torch.cat([head, w_p[full * k:].reshape(k, n - full).t()])


class DenseWeight:
    """An fp32 CPU weight ``[N, K]`` in the layouts its products run from.

    Attributes:
        shape: ``(N, K)``.
        panels: ``[N * K]`` fp32, the GEMV's layout (:func:`pack_panels`), with ``gemv=True`` and the C++
            library; else ``None``.
        packed: oneDNN's blocked copy (an opaque ``torch._mkldnn`` tensor of shape ``[N, K]``), or ``None``.
        w_t: ``[K, N]`` fp32 for ``x @ w_t``, only where neither of the others covers a row count.

    ``gemv=False`` (a quantized module, whose own kernel takes every row count the GEMV would) keeps one
    fp32 copy, the packed one; ``gemv=True`` keeps two: the fp32 format pays twice the weight memory for the
    GEMV at a few rows and oneDNN above.
    """

    def __init__(self, weight: torch.Tensor, gemv: bool = True):
        w = weight.detach().float().contiguous()
        self.shape = tuple(w.shape)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w) if onednn_ok() else None
        self.panels = pack_panels(w) if gemv and cpp.ops("radixrt_gemv") is not None else None
        self.w_t = w.t().contiguous() if self.packed is None else None

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x [M, K]`` fp32 -> ``x @ w.T + bias`` ``[M, N]`` fp32."""
        how, w = self.kernel(x.shape[0])
        if how == "onednn":
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), w, bias, "none", [], "")
        y = cpp.ops("radixrt_gemv").gemv(x.contiguous(), w) if how == "gemv" else x @ w
        return y if bias is None else y + bias

    def kernel(self, rows: int) -> tuple[str, torch.Tensor]:
        """``(how, weight)`` of a product of ``rows`` rows: ``"gemv"`` with ``panels``, ``"onednn"`` with
        ``packed``, or ``"dense_t"`` with ``w_t`` (for ``radixrt_layer.decode_layer``)."""
        if self.panels is not None and rows <= MAX_ROWS:
            return "gemv", self.panels
        if self.packed is not None:
            return "onednn", self.packed
        return "dense_t", self.w_t

    def dense(self) -> torch.Tensor:
        """The values ``[N, K]`` fp32 (a copy out of a packed layout when ``w_t`` is gone)."""
        if self.w_t is not None:
            return self.w_t.t()
        return self.packed.to_dense() if self.packed is not None else unpack_panels(self.panels, *self.shape)
