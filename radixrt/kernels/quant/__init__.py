"""Products of fp32 activations with GGUF quantized weights, run in the file's own blocks (C++ AVX2, built at
first use by :mod:`..cpp`; products of 3 or more rows on AVX-512 VNNI tiles where the CPU has them, the same
bits: ``gemm512.h``), with a torch fallback.

Ops of the loaded library, ``torch.ops.radixrt_ggml`` (fp32 activations are quantized to int8 inside, per row,
as llama.cpp does):

- ``mm(x [M, K] fp32, w [N, K / block * type_size] uint8, ggml_type int) -> [M, N] fp32``: every type of
  :data:`TYPES`; ``w`` is exactly the GGUF tensor's bytes, one row of blocks per output channel
  (``ggml_mm.cpp``, kernels in ``legacy_blocks.cpp`` and ``kquants.cpp``). Batch-invariant: row ``i`` of the
  result is the same bits whatever ``M``, the row's position and the thread count.
- ``q4_1_mm(x [M, K] fp32, w [N, K / 32 * 20] uint8) -> [M, N] fp32`` (``ggml_gemv.cpp``)
- ``q8_0_mm(x [M, K] fp32, w [N, K / 32 * 34] uint8) -> [M, N] fp32``
- ``q4_1x8_mm(x [M, K] fp32, w [N / 8, K / 32 * 160] uint8) -> [M, N] fp32``: Q4_1 in the 8-row layout of
  ``runtime/layers/gguf_blocks.repack_q4_1_x8``

Algorithms: the block layouts of llama.cpp's ``ggml-common.h`` / ``dequantize_row_*`` (``ggml-quants.c``); the
activations quantized like ``quantize_row_q8_0`` / ``q8_1`` (per 32, legacy types) and ``quantize_row_q8_K``
(per 256 with per-16 sums, K-quants), and the integer dot products of ``ggml_vec_dot_<type>_q8_<...>``
(``ggml-cpu/arch/x86/quants.c``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from radixrt.kernels import cpp


class GGMLType(NamedTuple):
    """A GGUF weight type: gguf's ``GGMLQuantizationType`` number, elements per block, bytes per block."""

    name: str
    ggml_type: int
    block_size: int
    type_size: int


# gguf.constants.GGML_QUANT_SIZES for the types with a kernel
TYPES: dict[int, GGMLType] = {
    t.ggml_type: t
    for t in (
        GGMLType("Q4_0", 2, 32, 18),
        GGMLType("Q4_1", 3, 32, 20),
        GGMLType("Q5_0", 6, 32, 22),
        GGMLType("Q5_1", 7, 32, 24),
        GGMLType("Q8_0", 8, 32, 34),
        GGMLType("Q4_K", 12, 256, 144),
        GGMLType("Q5_K", 13, 256, 176),
        GGMLType("Q6_K", 14, 256, 210),
    )
}
SUPPORTED: tuple[str, ...] = tuple(t.name for t in TYPES.values())
BY_NAME: dict[str, GGMLType] = {t.name: t for t in TYPES.values()}


def ggml_gemv():
    """``torch.ops.radixrt_ggml`` once the library is built and loaded, or ``None`` where it cannot be
    built here (a warning says why); callers then use torch's int4 kernel."""
    return cpp.ops("radixrt_ggml")


def check(x: torch.Tensor, w: torch.Tensor, ggml_type: int) -> GGMLType:
    """The type of ``ggml_type`` after checking ``x``/``w`` as the C++ op does; raises ``ValueError`` with the
    same messages (an unknown type, x not fp32 2-D, K not a multiple of the block, w's shape or dtype)."""
    t = TYPES.get(int(ggml_type))
    if t is None:
        raise ValueError(
            f"radixrt_ggml.mm: no kernel for ggml type {ggml_type} (supported: "
            + ", ".join(f"{v.name}={k}" for k, v in TYPES.items())
            + ")"
        )
    if x.dtype != torch.float32 or x.dim() != 2:
        raise ValueError(
            f"radixrt_ggml.mm({t.name}): x must be a contiguous fp32 CPU tensor [M, K], got {x.dtype} {list(x.shape)}"
        )
    k = x.shape[1]
    if k % t.block_size:
        raise ValueError(f"radixrt_ggml.mm({t.name}): K = {k} is not a multiple of the block size {t.block_size}")
    row = k // t.block_size * t.type_size
    if w.dtype != torch.uint8 or w.dim() != 2 or w.shape[1] != row:
        raise ValueError(
            f"radixrt_ggml.mm({t.name}): w must be contiguous uint8 [N, K / {t.block_size} * "
            f"{t.type_size}] = [N, {row}] for K = {k}, got {w.dtype} {list(w.shape)}"
        )
    return t


def dequantize(w: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """GGUF blocks ``[N, K / block * type_size]`` uint8 -> fp32 ``[N, K]`` (``gguf.quants.dequantize``, the
    numpy port of llama.cpp's ``dequantize_row_*``)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    t = TYPES[int(ggml_type)]
    n = w.shape[0]
    k = w.shape[1] // t.type_size * t.block_size
    out = gguf_dequantize(np.ascontiguousarray(w.numpy()), GGMLQuantizationType(t.ggml_type))
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32).reshape(n, k))


def mm(x: torch.Tensor, w: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """``x [M, K]`` fp32 @ the weight whose GGUF bytes are ``w [N, K / block * type_size]`` uint8 -> ``[M, N]``
    fp32, ``ggml_type`` gguf's number (Q4_0=2, Q4_1=3, Q5_0=6, Q5_1=7, Q8_0=8, Q4_K=12, Q5_K=13, Q6_K=14).

    Through ``torch.ops.radixrt_ggml.mm`` (int8 activations, batch-invariant; raises ``RuntimeError`` on bad
    input) where the C++ library loads; else the fallback dequantizes ``w`` to fp32 and runs ``x @ w.T`` in
    fp32 activations (not int8: its results differ slightly from the kernel's; raises ``ValueError``).
    """
    ops = ggml_gemv()
    if ops is not None:
        return ops.mm(x.contiguous(), w.contiguous(), int(ggml_type))
    check(x, w, ggml_type)
    return x @ dequantize(w, ggml_type).T
