"""fp32 ``x @ w_t`` for decode-sized batches (``fp32_gemv.cpp``), ``torch.matmul`` otherwise.

The weight is stored transposed (``w_t [K, N]``, row-major) by the callers (``Fp32Linear``, the LM head),
which makes the product one sequential read of the weight: at a few rows a memory-bound GEMV, where BLAS
sgemm pays for packing and, on a VM, for waking its threads on every call.
"""
from __future__ import annotations

import torch

from radixrt.kernels import cpp

# Rows up to which the C++ GEMV runs; more rows are a GEMM, where BLAS's blocking wins (measured with
# benchmarks/bench_quant.py --formats none, SmolLM2's whole-model projections on 2 cores).
MAX_ROWS = 4


def matmul_t(x: torch.Tensor, w_t: torch.Tensor) -> torch.Tensor:
    """``x [M, K] @ w_t [K, N]`` -> ``[M, N]`` (fp32 on the CPU through the C++ GEMV when M <= MAX_ROWS)."""
    ops = cpp.ops("radixrt_gemv")
    if (ops is not None and x.shape[0] <= MAX_ROWS and x.is_cpu and x.dtype == torch.float32
            and w_t.dtype == torch.float32 and x.dim() == 2 and w_t.is_contiguous()):
        return ops.gemv_t(x.contiguous(), w_t)
    return x @ w_t
