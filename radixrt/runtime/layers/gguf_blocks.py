"""Legacy GGUF blocks in torch: Q4_1 made from fp32, Q4_0 rewritten as Q4_1, Q4_1's 8-row layout, dequantization.

Block formats (llama.cpp ``ggml-common.h``), 32 weights along the input dimension per block:

- Q4_1, 20 bytes: fp16 scale ``d``, fp16 minimum ``m``, 16 bytes of nibbles. Weight ``j`` is the low nibble of
  byte ``j`` and weight ``j + 16`` the high nibble; its value is ``q * d + m``.
- Q4_0, 18 bytes: fp16 ``d`` and the nibbles; value ``(q - 8) * d``. Rewritten here as Q4_1 with
  ``m = -8 d`` (exact: a power-of-two multiple of an fp16 stays an fp16).
- Q8_0, 34 bytes: fp16 ``d`` and 32 int8; value ``q * d``.

"""

from __future__ import annotations

import numpy as np
import torch

QK = 32
BLOCK_BYTES = {"Q4_1": 20, "Q4_0": 18, "Q8_0": 34}


def q4_0_to_q4_1(raw: np.ndarray) -> np.ndarray:
    """``[N, nb * 18]`` uint8 Q4_0 -> ``[N, nb * 20]`` uint8 Q4_1 holding the same values."""
    n, nb = raw.shape[0], raw.shape[1] // 18
    b = raw.reshape(n, nb, 18)
    d = b[..., :2].copy().view(np.float16)
    out = np.empty((n, nb, 20), dtype=np.uint8)
    out[..., :2] = b[..., :2]
    out[..., 2:4] = (d * np.float16(-8)).view(np.uint8)
    out[..., 4:] = b[..., 2:]
    return out.reshape(n, nb * 20)


def quantize_q4_1(w: torch.Tensor) -> torch.Tensor:
    """fp32 ``[N, K]`` (K a multiple of 32) -> Q4_1 blocks ``[N, K / 32 * 20]`` uint8.

    Per block: ``m = min``, ``d = (max - min) / 15``, ``q = round((w - m) / d)`` clamped to 0..15, as
    llama.cpp's ``quantize_row_q4_1_ref``.
    """
    n, k = w.shape
    if k % QK:
        raise ValueError(f"Q4_1 needs an input dimension divisible by {QK}, got {k}")
    b = w.detach().float().reshape(n, k // QK, QK)
    lo, hi = b.amin(-1), b.amax(-1)
    d = ((hi - lo) / 15).half()
    m = lo.half()
    inv = torch.where(d.float() > 0, 1.0 / d.float(), torch.zeros_like(lo))
    q = ((b - m.float()[..., None]) * inv[..., None]).round().clamp(0, 15).to(torch.uint8)
    qs = q[..., :16] | (q[..., 16:] << 4)
    hdr = torch.stack([d, m], dim=-1).view(torch.uint8).reshape(n, k // QK, 4)
    return torch.cat([hdr, qs], dim=-1).reshape(n, k // QK * 20).contiguous()


def repack_q4_1_x8(raw: torch.Tensor) -> torch.Tensor:
    """Q4_1 blocks ``[N, nb * 20]`` (N a multiple of 8) -> the kernel's 8-row layout ``[N / 8, nb * 160]`` uint8.

    Per group of 8 rows and block: 4 chunks of 32 bytes (chunk ``k``: bytes ``4k..4k+3`` of the nibbles of
    each of the 8 rows in turn), then the 8 fp16 ``d``, then the 8 fp16 ``m``: the same bytes, reordered so
    that one 32-byte load feeds 8 rows (``q4_1x8_mm`` in ``kernels/quant/ggml_gemv.cpp``).

    Raises:
        ValueError: N not a multiple of 8.
    """
    n, nb = raw.shape[0], raw.shape[1] // 20
    if n % 8:
        raise ValueError(f"the 8-row Q4_1 layout needs a multiple of 8 rows, got {n}")
    b = raw.reshape(n // 8, 8, nb, 20).permute(0, 2, 1, 3)  # [G, nb, 8 rows, 20]
    qs = b[..., 4:].reshape(n // 8, nb, 8, 4, 4).transpose(2, 3)  # [G, nb, 4 chunks, 8 rows, 4]
    d, m = b[..., 0:2], b[..., 2:4]  # [G, nb, 8, 2]
    out = torch.cat([qs.reshape(n // 8, nb, 128), d.reshape(n // 8, nb, 16), m.reshape(n // 8, nb, 16)], -1)
    return out.reshape(n // 8, nb * 160).contiguous()


def dequantize(kind: str, raw: torch.Tensor) -> torch.Tensor:
    """Q4_1 or Q8_0 blocks ``[N, nb * bytes]`` uint8 -> fp32 ``[N, nb * 32]`` (the exact stored values)."""
    n = raw.shape[0]
    nb = raw.shape[1] // BLOCK_BYTES[kind]
    b = raw.reshape(n, nb, BLOCK_BYTES[kind])
    d = b[..., :2].contiguous().view(torch.float16).float()
    if kind == "Q8_0":
        return (b[..., 2:].contiguous().view(torch.int8).float() * d).reshape(n, nb * QK)
    m = b[..., 2:4].contiguous().view(torch.float16).float()
    qs = b[..., 4:]
    q = torch.cat([qs & 15, qs >> 4], dim=-1).float()
    return (q * d + m).reshape(n, nb * QK)
