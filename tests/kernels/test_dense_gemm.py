"""radixrt_gemv.gemv and DenseWeight (radixrt/kernels/gemv): one dense kernel for every row count, fp32 / fp16 /
bf16 weights, batch-invariant to the bit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from kernel_util import _kernels_built, needs_cpp  # noqa: F401 - the autouse build check
from radixrt.kernels import cpp
from radixrt.kernels.gemv import DenseWeight, pack_panels, unpack_panels

G = torch.Generator().manual_seed(0)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
UNIT = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}  # unit roundoff


def gemv(x, w_p):
    return cpp.ops("radixrt_gemv").gemv(x, w_p)


def check_bound(y, x, w_src, w_dt):
    """``y`` against fp64 products: of the dtype's own values, within fp32's bound for a K-term FMA chain
    (gamma_K = K u / (1 - K u) times sum |x w|); of the fp32 source, within that plus the dtype's rounding."""
    k = x.shape[1]
    mag = x.double().abs() @ w_src.double().abs().t()
    gamma = k * UNIT[torch.float32] / (1 - k * UNIT[torch.float32])
    err = (y.double() - x.double() @ w_dt.double().t()).abs()
    assert (err <= gamma * (x.double().abs() @ w_dt.double().abs().t())).all(), err.max()
    err_src = (y.double() - x.double() @ w_src.double().t()).abs()
    assert (err_src <= (gamma + UNIT[w_dt.dtype]) * mag * 1.001).all(), err_src.max()


@needs_cpp
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k,n", [(300, 100), (40, 64), (5, 13)])  # ragged K (K blocks of 256) and N, tiny
def test_matches_fp64(dtype, k, n):
    """Every row count of the two drivers (1-2 rows stream, above packed 6-row blocks, ragged last block)."""
    w = torch.randn(n, k, generator=G)
    w_dt = w.to(dtype)
    w_p = pack_panels(w_dt)
    assert w_p.dtype == dtype and w_p.shape == (n * k,) and torch.equal(unpack_panels(w_p, n, k), w_dt)
    for m in [*range(1, 10), 64, 65, 513]:
        x = torch.randn(m, k, generator=G)
        y = gemv(x, w_p)
        assert y.shape == (m, n) and y.dtype == torch.float32
        check_bound(y, x, w, w_dt)


@needs_cpp
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_bit_identical_across_batches_positions_threads(dtype):
    """Row i is the same bits alone, among 513 rows, at another position and on 1 or 2 threads (a weight
    big enough that the product splits over threads; N and K ragged)."""
    k, n = 520, 1000
    w_p = pack_panels(torch.randn(n, k, generator=G).to(dtype))
    x = torch.randn(513, k, generator=G)
    want = gemv(x, w_p)
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            assert torch.equal(gemv(x, w_p), want)
            for m in [*range(1, 21), 64, 130]:  # streamed, 6-row and 12-row blocks, ragged last block
                assert torch.equal(gemv(x[:m].contiguous(), w_p), want[:m])
            for i in (0, 7, 200, 512):
                assert torch.equal(gemv(x[i : i + 1].contiguous(), w_p), want[i : i + 1])
            perm = torch.randperm(513, generator=G)
            assert torch.equal(gemv(x[perm].contiguous(), w_p), want[perm])
            sub = perm[:40]
            assert torch.equal(gemv(x[sub].contiguous(), w_p), want[sub])
    finally:
        torch.set_num_threads(threads)


AVX2_CHILD = """
import sys, torch
from radixrt.kernels import cpp
from radixrt.kernels.gemv import pack_panels
x, ws = torch.load(sys.argv[1])
torch.save([[cpp.ops("radixrt_gemv").gemv(x[:m].contiguous(), pack_panels(w)) for m in MS] for w in ws], sys.argv[2])
"""
MS = [*range(1, 21), 64, 130]


@needs_cpp
@pytest.mark.skipif("avx512f" not in open("/proc/cpuinfo").read(), reason="no AVX-512F: only the AVX2 tiles run")
@pytest.mark.parametrize("k,n", [(520, 1000), (300, 100), (2048, 64)])  # ragged K and N; K blocks of 256
def test_avx512_same_bits_as_avx2(k, n, tmp_path):
    """The AVX-512 tiles (12-row blocks, this process) give every row count the bits of the AVX2 tiles
    (6-row blocks, a process with RADIXRT_DISABLE_AVX512=1) and of 1-row decode, for fp32, fp16 and bf16."""
    x = torch.randn(130, k, generator=G)
    ws = [torch.randn(n, k, generator=G).to(dt) for dt in DTYPES]
    torch.save([x, ws], tmp_path / "in.pt")
    env = dict(os.environ, RADIXRT_DISABLE_AVX512="1")
    subprocess.run(
        [sys.executable, "-c", f"MS = {MS}\n" + AVX2_CHILD, str(tmp_path / "in.pt"), str(tmp_path / "out.pt")],
        env=env,
        check=True,
    )
    avx2 = torch.load(tmp_path / "out.pt")
    for w, want in zip(ws, avx2):
        w_p = pack_panels(w)
        one = torch.cat([gemv(x[i : i + 1].contiguous(), w_p) for i in range(130)])
        for m, y2 in zip(MS, want):
            y = gemv(x[:m].contiguous(), w_p)
            assert torch.equal(y, y2), (w.dtype, m)
            assert torch.equal(y, one[:m]), (w.dtype, m)


@needs_cpp
def test_bad_input_raises():
    w_p = pack_panels(torch.randn(64, 48, generator=G))
    with pytest.raises(RuntimeError, match=r"x must be fp32 \[M, K\] contiguous, got Half"):
        gemv(torch.randn(2, 48).half(), w_p)
    with pytest.raises(RuntimeError, match="x must be fp32"):
        gemv(torch.randn(48), w_p)
    with pytest.raises(RuntimeError, match="x must be fp32"):
        gemv(torch.randn(48, 2).t(), w_p)
    with pytest.raises(RuntimeError, match="w_p must be fp32, fp16 or bf16 .* got Double"):
        gemv(torch.randn(2, 48), w_p.double())
    with pytest.raises(
        RuntimeError, match=r"the panel layout of a \[N, K\] weight; got Float \[3072\] for x \[2, 50\]"
    ):
        gemv(torch.randn(2, 50), w_p)
    with pytest.raises(RuntimeError, match="w_p must be"):
        gemv(torch.randn(2, 48), w_p.reshape(64, 48))
    assert gemv(torch.randn(0, 48), w_p).shape == (0, 64)


@needs_cpp
@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_weight_one_copy(dtype):
    """One copy, in the weight's own dtype (or the one forced), every row count through the one kernel."""
    w = torch.randn(70, 40, generator=G).to(dtype)
    d = DenseWeight(w)
    assert d.dtype == dtype and d.panels.dtype == dtype and d.w_t is None and d.shape == (70, 40)
    assert d.nbytes == 70 * 40 * w.element_size()
    assert d.kernel(1) == ("gemv", d.panels) and d.kernel(1000)[0] == "gemv" and d.kernel(1000)[1] is d.panels
    assert d.dense().dtype == torch.float32 and torch.equal(d.dense(), w.float())
    x, bias = torch.randn(9, 40, generator=G), torch.randn(70, generator=G)
    assert torch.equal(d(x), gemv(x, d.panels)) and torch.equal(d(x, bias), gemv(x, d.panels) + bias)
    forced = DenseWeight(w.float(), torch.bfloat16)
    assert forced.dtype == torch.bfloat16 and forced.nbytes == 70 * 40 * 2
    assert torch.equal(forced.dense(), w.float().bfloat16().float())
    assert DenseWeight(w, True).dtype == dtype and DenseWeight(w, gemv=False).panels.dtype == dtype  # old flag
    with pytest.raises(ValueError, match=r"x must be fp32 \[M, 40\], got torch.float16 \(9, 40\)"):
        d(x.half())
    with pytest.raises(ValueError, match=r"x must be fp32 \[M, 40\], got torch.float32 \(9, 41\)"):
        d(torch.randn(9, 41))
    with pytest.raises(ValueError, match="weight must be .N, K. fp32, fp16 or bf16"):
        DenseWeight(torch.ones(4, 4, dtype=torch.int8))
    with pytest.raises(ValueError, match="dtype=torch.float64"):
        DenseWeight(w, torch.float64)
    with pytest.raises(ValueError, match=r"got torch.float32 \(4,\)"):
        DenseWeight(torch.ones(4))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_weight_torch_path(dtype, monkeypatch):
    """Without the C++ library: ``x @ w_t`` in fp32 over the one stored copy."""
    monkeypatch.setattr(cpp, "ops", lambda namespace: None)
    w = torch.randn(70, 300, generator=G)
    d = DenseWeight(w.to(dtype))
    assert d.panels is None and d.w_t.dtype == dtype and d.w_t.shape == (300, 70) and d.kernel(5)[0] == "dense_t"
    assert d.nbytes == 70 * 300 * d.w_t.element_size() and torch.equal(d.dense(), w.to(dtype).float())
    x = torch.randn(5, 300, generator=G)
    y = d(x)
    assert y.dtype == torch.float32 and y.shape == (5, 70)
    torch.testing.assert_close(y, x @ w.to(dtype).float().t(), rtol=0, atol=0)
