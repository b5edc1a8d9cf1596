"""A C++ AVX2 GEMV over GGUF Q4_1 / Q8_0 blocks (``ggml_gemv.cpp``), built at first use (:mod:`..cpp`).

Ops of the loaded library, ``torch.ops.radixrt_ggml`` (fp32 activations are quantized per 32-block to
int8 inside, as llama.cpp does):

- ``q4_1_mm(x [M, K] fp32, w [N, K / 32 * 20] uint8) -> [M, N] fp32``
- ``q8_0_mm(x [M, K] fp32, w [N, K / 32 * 34] uint8) -> [M, N] fp32``
- ``q4_1x8_mm(x [M, K] fp32, w [N / 8, K / 32 * 160] uint8) -> [M, N] fp32``: Q4_1 in the 8-row layout of
  ``runtime/layers/gguf_blocks.repack_q4_1_x8``
"""
from __future__ import annotations

from radixrt.kernels import cpp


def ggml_gemv():
    """``torch.ops.radixrt_ggml`` once the library is built and loaded, or ``None`` where it cannot be
    built here (a warning says why); callers then use torch's int4 kernel."""
    return cpp.ops("radixrt_ggml")
