"""fp32 products ``x @ w.T`` of a projection, in the layout that wins at the step's row count.

- Up to :data:`MAX_ROWS` rows, radixrt's C++ GEMV (``fp32_gemv.cpp``) over the weight stored transposed
  (``w_t [K, N]``, row-major): one sequential read of the weight, which is all a memory-bound product needs.
  BLAS pays for packing the weight on every call and, on a VM, for waking its threads.
- More rows, oneDNN's inner product (``torch.ops.mkldnn._linear_pointwise``) over a copy packed once into its
  own blocked layout (``torch.ops.mkldnn._reorder_linear_weight``, what inductor's CPU freezing pass
  does). Measured on SmolLM2's whole-model projections (30 layers x 4 + the LM head, distinct weights, 2
  cores; ms, oneDNN vs ``x @ w_t``): rows 8: 29.9 vs 77.0, 32: 58.6 vs 118.0, 64: 100.9 vs 160.1,
  256: 365.7 vs 493.4, 1024: 1427.2 vs 1789.3. At 1-2 rows the GEMV wins (22-23 vs 28-32 ms).
- Without the C++ library or oneDNN, ``x @ w_t``.
"""
from __future__ import annotations

import torch

from radixrt.kernels import cpp

# Rows up to which the C++ GEMV runs (at 4 rows it ties oneDNN: 27.1 vs 24.1, 28.1 vs 29.5 ms in two runs).
MAX_ROWS = 4


def uses_kernel(rows: int) -> bool:
    """True where a product of ``rows`` fp32 CPU rows runs the C++ GEMV."""
    return rows <= MAX_ROWS and cpp.ops("radixrt_gemv") is not None


def onednn_ok() -> bool:
    """True where torch has oneDNN (every x86 CPU build does)."""
    return torch.backends.mkldnn.is_available()


def matmul_t(x: torch.Tensor, w_t: torch.Tensor) -> torch.Tensor:
    """``x [M, K] @ w_t [K, N]`` -> ``[M, N]`` (fp32 on the CPU through the C++ GEMV when M <= MAX_ROWS)."""
    ops = cpp.ops("radixrt_gemv")
    if (ops is not None and x.shape[0] <= MAX_ROWS and x.is_cpu and x.dtype == torch.float32
            and w_t.dtype == torch.float32 and x.dim() == 2 and w_t.is_contiguous()):
        return ops.gemv_t(x.contiguous(), w_t)
    return x @ w_t


class DenseWeight:
    """An fp32 CPU weight ``[N, K]`` in the layouts its products run from.

    Attributes:
        shape: ``(N, K)``.
        w_t: ``[K, N]`` fp32 for the GEMV (``gemv=True``) and the fallback; ``None`` when neither runs.
        packed: oneDNN's blocked copy (an opaque ``torch._mkldnn`` tensor of shape ``[N, K]``), or ``None``.

    ``gemv=False`` (a quantized module, whose own kernel takes every row count the GEMV would) keeps one
    fp32 copy, the packed one; ``gemv=True`` keeps both: the fp32 format pays twice the weight memory for the
    GEMV at batch 1 and oneDNN above.
    """

    def __init__(self, weight: torch.Tensor, gemv: bool = True):
        w = weight.detach().float().contiguous()
        self.shape = tuple(w.shape)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w) if onednn_ok() else None
        self.w_t = w.t().contiguous() if gemv or self.packed is None else None

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x [M, K]`` fp32 -> ``x @ w.T + bias`` ``[M, N]`` fp32."""
        how, w = self.kernel(x.shape[0])
        if how == "onednn":
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), w, bias, "none", [], "")
        y = matmul_t(x, w)
        return y if bias is None else y + bias

    def kernel(self, rows: int) -> tuple[str, torch.Tensor]:
        """``(how, weight)`` of a product of ``rows`` rows: ``"gemv_t"`` / ``"dense_t"`` with ``w_t``, or
        ``"onednn"`` with ``packed`` (for ``radixrt_layer.decode_layer``)."""
        if self.packed is not None and (self.w_t is None or not uses_kernel(rows)):
            return "onednn", self.packed
        return ("gemv_t" if uses_kernel(rows) else "dense_t"), self.w_t

    def dense(self) -> torch.Tensor:
        """The values ``[N, K]`` fp32 (a copy out of the packed layout when ``w_t`` is gone)."""
        return self.w_t.t() if self.w_t is not None else self.packed.to_dense()
