"""The x16 layouts (radixrt/kernels/quant/x16_layout.h) and their tiles: the repack is a rearrangement of the
file's bytes (C++ = numpy, and dequantizing either gives gguf.quants.dequantize's values), and every path gives
exactly the arithmetic the header documents (x16.mm_twin) whatever the row count: the AVX-512 VNNI tiles, the
AVX2 tiles (a second process with RADIXRT_DISABLE_AVX512=1), T = 1, 3 and 16 rows, a row alone or among others.
Q4_0 in its x16 layout gives the bits of Q4_0 in the file's blocks (q4_0_lanes.h's arithmetic)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from radixrt.kernels import quant
from radixrt.kernels.quant import x16
from test_ggml_types import int8_rounded, random_blocks

NAMES = list(x16.LAYOUTS)
K = 512
N = 48  # three groups of 16 rows
MS = [1, 3, 16, 21]  # 21: three passes of 7 rows on AVX-512, six of 3-4 on AVX2


@pytest.fixture(scope="module")
def ops():
    from radixrt.kernels import cpp

    if not cpp.cpu_ok():
        pytest.skip("no AVX2/FMA/F16C: the C++ kernels cannot run here")
    ops = quant.ggml_gemv()
    assert ops is not None, f"radixrt_cpu failed to build on a CPU that supports it: {cpp.build_error()}"
    return ops


@pytest.fixture(scope="module")
def case():
    x = torch.randn(max(MS), K, generator=torch.Generator().manual_seed(5)) * 2
    x[2, :256] = 0.0  # a zero activation block: scale 0
    blocks = {n: random_blocks(quant.BY_NAME[n], N, K, 30 + i) for i, n in enumerate(NAMES)}
    return x, blocks


@pytest.mark.parametrize("name", NAMES)
def test_repack_is_the_files_bytes_rearranged(ops, case, name):
    _, blocks = case
    w = blocks[name]
    lay = x16.LAYOUTS[name]
    wx = x16.repack(w, name)
    assert wx.shape == (N // 16, K // lay.qk * lay.bytes) and wx.dtype == torch.uint8
    assert np.array_equal(wx.numpy(), x16.repack_np(w.numpy(), name))
    assert torch.equal(x16.dequantize(wx, name), quant.dequantize(w, quant.BY_NAME[name].ggml_type))


@pytest.mark.parametrize("name", NAMES)
def test_bits_are_the_documented_arithmetic_at_every_row_count(ops, case, name):
    """T = 1, 3, 16 and 21 rows: each equals the twin bit for bit, and each row equals that row alone."""
    x, blocks = case
    wx = x16.repack(blocks[name], name)
    tid = quant.BY_NAME[name].ggml_type | x16.X16
    alone = [ops.mm(x[i : i + 1].contiguous(), wx, tid) for i in range(max(MS))]
    for m in MS:
        got = ops.mm(x[:m].contiguous(), wx, tid)
        assert torch.equal(got, x16.mm_twin(x[:m], wx, name)), (name, m)
        assert torch.equal(got, torch.cat(alone[:m])), (name, m)
    assert torch.equal(alone[2][0, :], ops.mm(x[2:3].contiguous(), wx, tid)[0])


@pytest.mark.parametrize("name", [n for n in NAMES if x16.LAYOUTS[n].qk == 32])
def test_32_blocks_beyond_the_amx_batches(ops, name):
    """The 32-element types at K = 352 (11 blocks): AMX multiplies 4 blocks per batch, the last 3 run the
    VNNI fold; the same bits as the twin at every row count."""
    k = 352
    w = random_blocks(quant.BY_NAME[name], 32, k, 77)
    wx = x16.repack(w, name)
    tid = quant.BY_NAME[name].ggml_type | x16.X16
    x = torch.randn(17, k, generator=torch.Generator().manual_seed(8))
    for m in (1, 4, 17):
        assert torch.equal(ops.mm(x[:m].contiguous(), wx, tid), x16.mm_twin(x[:m], wx, name)), (name, m)


def test_q4_0_keeps_the_bits_of_the_files_blocks(ops, case):
    """Q4_0's x16 fold is q4_0_lanes.h's (S = sum q y - 8 Y, fma(S, d dy)): switching a Q4_0 weight to its
    x16 layout changes no output bit, at T = 1, 3, 16 and 21 (this process's instruction set; the AVX2 tiles in
    test_every_instruction_set_gives_the_same_bits)."""
    x, blocks = case
    wx = x16.repack(blocks["Q4_0"], "Q4_0")
    for m in MS:
        xm = x[:m].contiguous()
        assert torch.equal(ops.mm(xm, wx, 2 | x16.X16), ops.mm(xm, blocks["Q4_0"], 2)), m


@pytest.mark.parametrize("name", NAMES)
def test_error_is_the_int8_activations(ops, case, name):
    """Against the fp64 product of gguf.quants.dequantize's weight: the same int8 activations give the
    result to fp32 rounding (1e-5 of the sum of |terms|); the fp32 activations differ by at most the int8
    rounding, half a step d = amax / 127 per element (d per 256 for the K-quants, per 32 for Q8_0)."""
    x, blocks = case
    t = quant.BY_NAME[name]
    w = quant.dequantize(blocks[name], t.ggml_type).double()
    got = ops.mm(x.contiguous(), x16.repack(blocks[name], name), t.ggml_type | x16.X16).double()
    xq, step = int8_rounded(x, t.block_size)
    exact = xq.double() @ w.T
    scale = xq.double().abs() @ w.abs().T
    assert ((got - exact).abs() <= 1e-5 * scale + 1e-30).all()
    bound = (step.double() / 2) @ w.abs().T
    assert ((got - x.double() @ w.T).abs() <= bound * 1.001 + 1e-5 * scale).all()


def _flags() -> str:
    return open("/proc/cpuinfo").read()


def _amx_granted() -> bool:
    """Whether Linux grants this process AMX's tile data (arch_prctl ARCH_REQ_XCOMP_PERM, x86-64 syscall 158)."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True).syscall(158, 0x1023, 18) == 0


def test_every_instruction_set_gives_the_same_bits(ops, case, tmp_path):
    """The same products in processes that pick other tiles (the choice is read once per process): the
    AVX2 tiles (RADIXRT_DISABLE_AVX512=1), the AVX-512 VNNI tiles at every row count
    (RADIXRT_X16_AMX_MIN_ROWS=0), and the default (AMX from 9 rows where the CPU and the OS allow it). Each
    process says which ran; where the CPU lacks a feature the process runs the next one down, as asserted."""
    x, blocks = case
    packed = {n: x16.repack(blocks[n], n) for n in NAMES}
    torch.save({"x": x, "w": packed, "q4_0": blocks["Q4_0"]}, tmp_path / "case.pt")
    script = (
        "import sys, torch\nfrom radixrt.kernels import quant\nops = quant.ggml_gemv()\n"
        "c = torch.load(sys.argv[1])\nout = {'isa': [ops.x16_isa(m) for m in (1, 3, 16, 21)]}\n"
        "for n, w in c['w'].items():\n"
        "    out[n] = [ops.mm(c['x'][:m].contiguous(), w, quant.BY_NAME[n].ggml_type | 256) for m in (1, 3, 16, 21)]\n"
        "out['Q4_0 blocks'] = [ops.mm(c['x'][:m].contiguous(), c['q4_0'], 2) for m in (1, 3, 16, 21)]\n"
        "torch.save(out, sys.argv[2])\n"
    )
    flags = _flags()
    vnni = all(f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"))
    amx = vnni and "amx_int8" in flags and "amx_tile" in flags and _amx_granted()
    wide = "avx512" if vnni else "avx2"
    runs = {
        "avx2": ({"RADIXRT_DISABLE_AVX512": "1"}, ["avx2"] * 4),
        "vnni": ({"RADIXRT_X16_AMX_MIN_ROWS": "0"}, [wide] * 4),
        "default": ({}, [wide, wide] + ["amx" if amx else wide] * 2),
    }
    outs = {}
    for name, (extra, isa) in runs.items():
        env = {k: v for k, v in os.environ.items() if k not in ("RADIXRT_DISABLE_AVX512", "RADIXRT_X16_AMX_MIN_ROWS")}
        path = tmp_path / f"{name}.pt"
        subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / "case.pt"), str(path)], env={**env, **extra}, check=True
        )
        outs[name] = torch.load(path)
        assert outs[name]["isa"] == isa, name
    for n in NAMES:
        for i, m in enumerate(MS):
            ref = x16.mm_twin(x[:m], packed[n], n)
            for name in runs:
                assert torch.equal(outs[name][n][i], ref), (name, n, m)
                if n == "Q4_0":  # the file's blocks on that instruction set: the same bits as the x16 layout
                    assert torch.equal(outs[name]["Q4_0 blocks"][i], ref), (name, "Q4_0 blocks", m)


def test_bad_input_names_the_problem(ops, case):
    x, blocks = case
    wx = x16.repack(blocks["Q4_K"], "Q4_K")
    with pytest.raises(RuntimeError, match=r"x16\): w must be contiguous uint8 \[N / 16, K / 256 \* 2368\]"):
        ops.mm(x[:, :256].contiguous(), wx, 12 | 256)
    with pytest.raises(RuntimeError, match=r"no x16 layout for ggml type 10 \(Q4_0=2, Q4_1=3, Q5_0=6, Q5_1=7, Q8_0=8"):
        ops.mm(x, wx, 10 | 256)
    with pytest.raises(ValueError, match="N a multiple of 16"):
        x16.repack(blocks["Q4_K"][:40], "Q4_K")
    with pytest.raises(ValueError, match="no x16 layout for ggml type 'Q2_K'"):
        x16.repack(blocks["Q4_K"], "Q2_K")
    with pytest.raises(RuntimeError, match=r"out must be contiguous uint8 \[3, 4736\]"):
        ops.x16_repack(blocks["Q4_K"], 12, torch.empty(3, 10, dtype=torch.uint8))
    assert not x16.can_repack("Q4_K", 40) and x16.can_repack("Q6_K", 32) and not x16.can_repack("F16", 32)
    assert x16.can_repack("Q4_1", 16) and not x16.can_repack("Q5_1", 24)


@pytest.mark.parametrize("name", list(x16.LEGACY))
def test_bad_input_legacy(ops, case, name):
    """The legacy types' shapes in the errors: K not a multiple of 32, a weight of another K, a short repack out."""
    x, blocks = case
    lay, tid = x16.LAYOUTS[name], quant.BY_NAME[name].ggml_type
    wx = x16.repack(blocks[name], name)
    with pytest.raises(RuntimeError, match=rf"{name} x16\): K = 40 is not a multiple of the block size 32"):
        ops.mm(x[:, :40].contiguous(), wx, tid | 256)
    with pytest.raises(RuntimeError, match=rf"w must be contiguous uint8 \[N / 16, K / 32 \* {lay.bytes}\]"):
        ops.mm(x[:, :256].contiguous(), wx, tid | 256)
    with pytest.raises(RuntimeError, match=rf"out must be contiguous uint8 \[3, {K // 32 * lay.bytes}\]"):
        ops.x16_repack(blocks[name], tid, torch.empty(3, 10, dtype=torch.uint8))
    with pytest.raises(
        RuntimeError, match=rf"x16_repack\({name}\): w must be contiguous uint8 \[N, K / 32 \* {lay.gguf}\]"
    ):
        ops.x16_repack(blocks[name][:40], tid, torch.empty(3, K // 32 * lay.bytes, dtype=torch.uint8))


def _round32(v) -> np.float32:
    """The fp32 nearest to the Fraction v, ties to even: the reference for one rounding."""
    from fractions import Fraction

    r = np.float32(float(v))
    cands = [r, np.nextafter(r, np.float32(np.inf)), np.nextafter(r, np.float32(-np.inf))]
    err = [abs(Fraction(float(c)) - v) for c in cands]
    best = min(err)
    ties = [c for c, e in zip(cands, err) if e == best]
    return min(ties, key=lambda c: int(np.array(c).view(np.uint32)) & 1)


def test_fma32_rounds_once():
    """The twin's fma rounds a * b + c once, as the hardware's does; products that land a sum exactly on an
    fp32 midpoint in float64 (ties broken by the exact remainder) are the hard cases."""
    from fractions import Fraction

    rng = np.random.default_rng(3)
    a = rng.uniform(0.5, 1, 4000).astype(np.float32)
    b = (rng.uniform(0.5, 1, 4000) * 2.0**-24).astype(np.float32)
    c = np.where(rng.random(4000) < 0.5, np.float32(1.0), rng.uniform(-4, 4, 4000).astype(np.float32))
    # near-ties: a * b = 2^-24 (1 - k^2 2^-46) and c = 1 + 2^-23 (odd): the float64 sum rounds onto the fp32
    # midpoint 1 + 3 2^-24, where ties-to-even goes up, while the exact sum lies below it
    k = rng.integers(1, 8, 1000).astype(np.float32)
    a[:1000] = np.float32(1.0) + np.float32(2.0**-23) * k
    b[:1000] = np.float32(2.0**-24) * (np.float32(1.0) - np.float32(2.0**-23) * k)
    c[:1000] = np.float32(1.0) + np.float32(2.0**-23)
    got = x16.fma32(a, b, c)
    want = np.array(
        [_round32(Fraction(float(p)) * Fraction(float(q)) + Fraction(float(r))) for p, q, r in zip(a, b, c)]
    )
    assert np.array_equal(got, want.astype(np.float32))
    naive = (a.astype(np.float64) * b + c).astype(np.float32)
    assert (naive != want).any()  # the cases above do reach the double-rounding trap
