"""Q4_0's arithmetic (q4_0_lanes.h): per output, over the 32-blocks in order, acc = fma(float(S_b),
float(d_w * d_x), acc) from 0, S_b the block's exact integer dot product of (q - 8) and the int8 activations.
Every path (AVX-512 decode tiles for M <= 8, the scratch-panel prefill tiles above, the AVX2 tiles) must give
exactly these bits; test_ggml_types.py checks the paths against each other and the error bounds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixrt.kernels import quant
from test_ggml_types import int8_rounded, random_blocks

K = 256
N = 21  # one full 16-row panel and a ragged one (5 rows); 2 full 8-row AVX2 tiles and a ragged one


def emulate(x: torch.Tensor, w: torch.Tensor) -> np.ndarray:
    """The documented arithmetic in numpy. The activations as q8_act.h rounds them (int8_rounded: step d =
    amax / 127 in fp32); the fp32 FMA as float64 (S_b * p is exact there: 16 + 24 bits) rounded to fp32."""
    m, n, nb = x.shape[0], w.shape[0], K // 32
    xb = x.reshape(m, nb, 32)
    d = (xb.abs().amax(-1) / 127).numpy().astype(np.float32)  # [M, nb]
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    y = np.rint(xb.numpy() * inv[..., None]).astype(np.int64)  # [M, nb, 32]
    blk = w.numpy().reshape(n, nb, 18)
    dw = blk[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)  # [N, nb]
    qs = blk[..., 2:].astype(np.int64)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1) - 8  # [N, nb, 32]
    s = np.einsum("mbj,nbj->mnb", y, q).astype(np.float64)  # exact block sums
    acc = np.zeros((m, n), np.float32)
    for b in range(nb):
        p = (dw[None, :, b] * d[:, None, b]).astype(np.float32)  # rounded once, fp32
        acc = (s[:, :, b] * p.astype(np.float64) + acc.astype(np.float64)).astype(np.float32)
    return acc


@pytest.fixture(scope="module")
def ops():
    from radixrt.kernels import cpp

    if not cpp.cpu_ok():
        pytest.skip("no AVX2/FMA/F16C: the C++ kernels cannot run here")
    ops = quant.ggml_gemv()
    assert ops is not None, "radixrt_cpu failed to build on a CPU that supports it"
    return ops


@pytest.mark.parametrize("m", [1, 2, 5, 8, 9, 20])
def test_q4_0_bits_are_the_documented_arithmetic(ops, m):
    t = quant.BY_NAME["Q4_0"]
    w = random_blocks(t, N, K, 41)
    x = torch.randn(m, K, generator=torch.Generator().manual_seed(42)) * 3
    x[0, 32:64] = 0.0  # a zero activation block: d = 0
    want = emulate(x, w)
    got = ops.mm(x, w, t.ggml_type).numpy()
    assert np.array_equal(got, want), np.abs(got - want).max()
    # and the activations really are those int8 ones (the emulation's rounding matches q8_act.h)
    xq, _ = int8_rounded(x, 32)
    ref = xq.double() @ quant.dequantize(w, t.ggml_type).double().T
    assert np.abs(got - ref.numpy()).max() <= 1e-4 * np.abs(ref.numpy()).max()
