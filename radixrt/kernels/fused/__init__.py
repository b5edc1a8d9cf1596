"""Fused elementwise ops of a decoder layer: the C++ AVX2 kernels (``fused_cpu.cpp``) for fp32 CPU tensors,
the same arithmetic in torch for anything else (GPU, bf16, or where the library cannot be built).

At decode batch sizes each tensor here is a few hundred floats, so the cost of a step's small ops is the
number of ops: one fused call replaces two to six ATen calls per use (vLLM's ``fused_add_rms_norm``,
``silu_and_mul`` and ``rotary_embedding`` are the GPU counterparts).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixrt.kernels import cpp


def _native(x: torch.Tensor):
    return cpp.ops("radixrt_fused") if x.is_cpu and x.dtype == torch.float32 else None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x [M, H]`` normalized by the root mean square of each row, times ``weight [H]``; ``[M, H]``."""
    ops = _native(x)
    if ops is None or x.dim() != 2 or x.stride(1) != 1:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return ops.rms_norm(x, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``residual += x`` in place (the residual stream, ``[M, H]`` contiguous); returns
    ``rms_norm(residual, weight, eps)``."""
    ops = _native(x)
    if ops is None or x.dim() != 2 or x.stride(1) != 1 or not residual.is_contiguous():
        residual.add_(x)
        return F.rms_norm(residual, (residual.shape[-1],), weight, eps)
    return ops.add_rms_norm(x, residual, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``[M, 2I]`` (gate then up) -> ``silu(gate) * up`` ``[M, I]`` (SwiGLU)."""
    ops = _native(gate_up)
    if ops is None or gate_up.dim() != 2 or gate_up.stride(1) != 1:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up
    return ops.silu_mul(gate_up)


def rope_(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [T, heads, D]`` in place by the rotate-half RoPE (``x * cos + roll(x, D/2) * sin_signed``,
    tables ``[T, 1, D]`` from ``Rotary.tables``); returns ``x``."""
    ops = _native(x)
    if ops is None or x.stride(-1) != 1 or x.shape[-1] % 16:
        x.copy_(x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * sin_signed)
        return x
    ops.rope_(x, cos.squeeze(1), sin_signed.squeeze(1))
    return x


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """``logits [B, V]`` -> int64 ``[B]``, ``torch.argmax(logits, -1)`` (first index on ties, a NaN wins),
    in one thread per row: torch splits a single row's scan over its OpenMP threads."""
    ops = _native(logits)
    if ops is None or logits.dim() != 2 or logits.stride(1) != 1:
        return logits.argmax(-1)
    return ops.argmax(logits)
