"""radixrt_ggml.mm over every supported GGUF type: agreement with gguf's dequantize + fp32 matmul, within the
int8-activation error and to fp32 rounding against the same int8 rounding done in torch; batch invariance
(M, row position, threads); the older Q4_1/Q8_0 ops; bad inputs."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from radixrt.kernels import quant
from radixrt.runtime.layers.gguf_blocks import repack_q4_1_x8

TYPES = list(quant.TYPES.values())
# byte offsets of each type's fp16 scales/minimums (ggml-common.h); the other bytes are random
F16_AT = {
    "Q4_0": [0],
    "Q4_1": [0, 2],
    "Q5_0": [0],
    "Q5_1": [0, 2],
    "Q8_0": [0],
    "Q4_K": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],
}
K = 512
N = 37  # not a multiple of any row tile (4, 2) nor of 8
MS = [1, 2, 3, 4, 5, 6, 7, 8, 64, 65, 130]


@pytest.fixture(scope="module")
def ops():
    """The built kernels. Skipped only where they cannot exist (a CPU without AVX2/FMA/F16C, or
    RADIXRT_DISABLE_CPP_KERNELS set: the torch fallback is tested below either way); a failed build on a
    capable CPU is a failure, not a skip."""
    from radixrt.kernels import cpp

    if not cpp.cpu_ok() or os.environ.get("RADIXRT_DISABLE_CPP_KERNELS"):
        pytest.skip("no AVX2/FMA/F16C, or RADIXRT_DISABLE_CPP_KERNELS is set: the C++ kernels cannot run here")
    ops = quant.ggml_gemv()
    assert ops is not None, "radixrt_cpu failed to build on a CPU that supports it (see the logged warning)"
    return ops


def random_blocks(t: quant.GGMLType, n: int, k: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, size=(n, k // t.block_size, t.type_size), dtype=np.uint8)
    for i, off in enumerate(F16_AT[t.name]):
        scale = 0.01 if t.block_size == 32 else 0.001
        v = rng.uniform(0.5, 1.5, size=b.shape[:2]) * scale * (1 if i == 0 else rng.choice([-1, 1], size=b.shape[:2]))
        b[..., off : off + 2] = v.astype(np.float16).view(np.uint8).reshape(*b.shape[:2], 2)
    return torch.from_numpy(b.reshape(n, -1))


def int8_rounded(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x with each block rounded as q8_act.h does (d = amax / 127, q = round-half-even(x * (1 / d))), and the
    per-element step d."""
    xb = x.reshape(x.shape[0], -1, block)
    d = xb.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    return (torch.round(xb * inv) * d).reshape(x.shape), d.expand_as(xb).reshape(x.shape)


@pytest.fixture(scope="module")
def case():
    x = torch.randn(max(MS), K, generator=torch.Generator().manual_seed(1)) * 2
    x[3, :40] = 0.0  # a zero block: scale 0
    return x, {t.name: random_blocks(t, N, K, 10 + t.ggml_type) for t in TYPES}


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_matches_dequantized_reference(ops, case, t):
    x, ws = case
    w = ws[t.name]
    wf = quant.dequantize(w, t.ggml_type).double()
    out = ops.mm(x, w, t.ggml_type)
    assert out.shape == (x.shape[0], N) and out.dtype == torch.float32
    xq, step = int8_rounded(x, t.block_size)
    # the same int8 activations in float64: only the kernel's fp32 rounding differs (relative to sum |terms|)
    exact = xq.double() @ wf.T
    mag = xq.double().abs() @ wf.abs().T
    assert ((out.double() - exact).abs() <= 2e-6 * mag + 1e-7).all()
    # fp32 activations: within the int8 rounding bound sum_k |w_k| d_k / 2
    ref = x.double() @ wf.T
    bound = (step.double() / 2) @ wf.abs().T
    assert ((out.double() - ref).abs() <= bound * 1.001 + 2e-6 * mag + 1e-7).all()
    assert (out.double() - ref).abs().max() > 0  # it does run on int8 activations


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_batch_invariant(ops, case, t):
    x, ws = case
    w = ws[t.name]
    full = ops.mm(x, w, t.ggml_type)
    for m in MS:
        assert torch.equal(ops.mm(x[:m].contiguous(), w, t.ggml_type), full[:m]), m
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(2))
    assert torch.equal(ops.mm(x[perm].contiguous(), w, t.ggml_type), full[perm])
    assert torch.equal(ops.mm(x[5:70].contiguous(), w, t.ggml_type), full[5:70])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.mm(x, w, t.ggml_type)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, full)
    # a weight row's output does not depend on the others (the tiles over N)
    assert torch.equal(ops.mm(x, w[7:30].contiguous(), t.ggml_type), full[:, 7:30])


def test_large_k_ragged_n(ops):
    """K over the cache-blocking group, N odd, a shape with several threads' chunks."""
    for name in ("Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q6_K"):
        t = quant.BY_NAME[name]
        w = random_blocks(t, 203, 4096, 3)
        x = torch.randn(9, 4096, generator=torch.Generator().manual_seed(4))
        out = ops.mm(x, w, t.ggml_type)
        xq, _ = int8_rounded(x, t.block_size)
        wf = quant.dequantize(w, t.ggml_type).double()
        mag = xq.double().abs() @ wf.abs().T
        assert ((out.double() - xq.double() @ wf.T).abs() <= 2e-6 * mag + 1e-7).all()
        assert torch.equal(ops.mm(x[4:5].contiguous(), w, t.ggml_type), out[4:5])


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_decode_rows_many_chunks(ops, t):
    """1-2 rows (the decode tiles: gemv512.h on AVX-512, the AVX2 streaming tiles elsewhere) over a weight
    split into many threads' chunks with odd tails (N = 301): the int8-activation reference within fp32
    rounding, and the same bits as those rows inside a 9-row product (the many-row tiles)."""
    w = random_blocks(t, 301, 1024, 5 + t.ggml_type)
    x = torch.randn(9, 1024, generator=torch.Generator().manual_seed(6))
    wf = quant.dequantize(w, t.ggml_type).double()
    xq, _ = int8_rounded(x, t.block_size)
    many = ops.mm(x, w, t.ggml_type)
    for rows in (slice(0, 1), slice(3, 5), slice(8, 9)):
        out = ops.mm(x[rows].contiguous(), w, t.ggml_type)
        exact = xq[rows].double() @ wf.T
        mag = xq[rows].double().abs() @ wf.abs().T
        assert ((out.double() - exact).abs() <= 2e-6 * mag + 1e-7).all(), rows
        assert torch.equal(out, many[rows]), rows


def test_avx512_tiles_equal_avx2_tiles(ops, case, tmp_path):
    """Where the CPU has AVX-512 VNNI, products of >= 3 rows run gemm512.h's tiles, of 2 rows gemv512.h's
    (Q6_K: the AVX2 tile), of 1 row gemv512.h's only with RADIXRT_GGML_DECODE512=1: the same bits as the AVX2 tiles
    (RADIXRT_DISABLE_AVX512=1, read once per process, so a second process), at every row count
    and type; elsewhere both processes run the AVX2 tiles."""
    import subprocess
    import sys

    x, ws = case
    torch.save({"x": x, "ws": ws}, tmp_path / "case.pt")
    script = (
        "import sys, torch\nfrom radixrt.kernels import quant\nops = quant.ggml_gemv()\n"
        "c = torch.load(sys.argv[1])\nout = {}\n"
        "for t in quant.TYPES.values():\n"
        "    w = c['ws'][t.name]\n"
        "    out[t.name] = [ops.mm(c['x'][:m].contiguous(), w, t.ggml_type) for m in (1, 2, 3, 8, 65, 130)]\n"
        "out['enabled'] = ops.gemm512_enabled()\ntorch.save(out, sys.argv[2])\n"
    )
    env = dict(os.environ, RADIXRT_DISABLE_AVX512="1")
    subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "case.pt"), str(tmp_path / "avx2.pt")], env=env, check=True
    )
    avx2 = torch.load(tmp_path / "avx2.pt")
    assert avx2["enabled"] is False
    # 1 row runs the AVX2 tile by default; gemv512.h's 1-row tiles only with RADIXRT_GGML_DECODE512=1
    env = dict(os.environ, RADIXRT_GGML_DECODE512="1")
    subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "case.pt"), str(tmp_path / "d512.pt")], env=env, check=True
    )
    d512 = torch.load(tmp_path / "d512.pt")
    flags = open("/proc/cpuinfo").read()
    assert ops.gemm512_enabled() == all(
        f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni")
    )
    for t in TYPES:
        for m, ref, other in zip((1, 2, 3, 8, 65, 130), avx2[t.name], d512[t.name]):
            assert torch.equal(ops.mm(x[:m].contiguous(), ws[t.name], t.ggml_type), ref), (t.name, m)
            assert torch.equal(other, ref), (t.name, m)


def test_older_ops_agree(ops, case):
    x, ws = case
    q41, q80 = ws["Q4_1"], ws["Q8_0"]
    # same int8 activations and block arithmetic: the same bits
    assert torch.equal(ops.q4_1_mm(x, q41), ops.mm(x, q41, 3))
    assert torch.equal(ops.q8_0_mm(x, q80), ops.mm(x, q80, 8))
    w8 = q41[:32].contiguous()
    torch.testing.assert_close(ops.q4_1x8_mm(x, repack_q4_1_x8(w8)), ops.mm(x, w8, 3), rtol=1e-5, atol=1e-5)


def test_bad_inputs(ops, case):
    x, ws = case
    w = ws["Q4_K"]
    with pytest.raises(RuntimeError, match=r"no kernel for ggml type 10 \(supported: Q4_0=2"):
        ops.mm(x, w, 10)  # Q2_K
    with pytest.raises(RuntimeError, match=r"Q4_K\): x must be a contiguous fp32"):
        ops.mm(x.double(), w, 12)
    with pytest.raises(RuntimeError, match=r"Q4_K\): K = 288 is not a multiple of the block size 256"):
        ops.mm(torch.zeros(1, 288), w, 12)
    with pytest.raises(RuntimeError, match=r"Q4_K\): w must be contiguous uint8 \[N, K / 256 \* 144\] = \[N, 288\]"):
        ops.mm(x, w[:, :144].contiguous(), 12)
    with pytest.raises(RuntimeError, match=r"Q8_0\): w must be contiguous uint8"):
        ops.mm(x, ws["Q8_0"].view(torch.int8), 8)
    assert ops.mm(x[:0], w, 12).shape == (0, N)


def test_fallback_matches(ops, case, monkeypatch):
    """The torch path (no C++ library): dequantize + fp32 matmul, same shapes, errors as ValueError."""
    x, ws = case
    monkeypatch.setattr(quant, "ggml_gemv", lambda: None)
    for t in TYPES:
        out = quant.mm(x[:3], ws[t.name], t.ggml_type)
        torch.testing.assert_close(out, x[:3] @ quant.dequantize(ws[t.name], t.ggml_type).T)
        # the kernel differs by its int8 activations only (bounded in test_matches_dequantized_reference)
        assert (out - ops.mm(x[:3].contiguous(), ws[t.name], t.ggml_type)).abs().max() <= 0.03 * out.abs().max()
    with pytest.raises(ValueError, match="K = 288 is not a multiple"):
        quant.mm(torch.zeros(1, 288), ws["Q4_K"], 12)
    with pytest.raises(ValueError, match="no kernel for ggml type 10"):
        quant.mm(x, ws["Q4_K"], 10)
