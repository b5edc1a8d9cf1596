"""radixrt_ggml.mm at 1-24 activation rows (speculative verification, small-batch decode): the mid-row tiles
(``midrows512.h`` on AVX-512, 2 .. 16 or 20 rows) give every row the same bits as that row computed alone (the
decode tile), as the many-row tiles (``RADIXRT_GGML_MID_ROWS=0``) and as the AVX2 tiles
(``RADIXRT_DISABLE_AVX512=1``), with K and N that no tile divides; and agree with gguf's dequantize + fp32
matmul within the int8-activation bound."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from test_ggml_types import int8_rounded, ops, random_blocks  # noqa: F401 (ops: the fixture)

from radixrt.kernels import quant

TYPES = list(quant.TYPES.values())
ROWS = range(1, 25)  # past the mid-row tiles' 16 (K-quants: 20) into the many-row tiles
K32, K256 = 800, 768  # 25 blocks of 32 (odd), 3 super-blocks
N = 45  # no multiple of a tile's 2, 4 or 8 weight rows


def shape(t: quant.GGMLType) -> tuple[int, int]:
    return N, K256 if t.block_size == 256 else K32


@pytest.fixture(scope="module")
def cases():
    out = {}
    for t in TYPES:
        n, k = shape(t)
        x = torch.randn(max(ROWS) + 3, k, generator=torch.Generator().manual_seed(20 + t.ggml_type)) * 3
        x[2, : t.block_size] = 0.0  # a zero block: scale 0
        out[t.name] = (x, random_blocks(t, n, k, 30 + t.ggml_type))
    return out


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_rows_equal_rows_alone(ops, cases, t):  # noqa: F811
    """Rows 1..24 of a product, at any offset in x: each the bits of that row alone; threads 1 and 2."""
    x, w = cases[t.name]
    alone = torch.cat([ops.mm(x[i : i + 1].contiguous(), w, t.ggml_type) for i in range(x.shape[0])])
    threads = torch.get_num_threads()
    try:
        for nt in (1, 2):
            torch.set_num_threads(nt)
            for m in ROWS:
                for off in (0, 3):
                    out = ops.mm(x[off : off + m].contiguous(), w, t.ggml_type)
                    assert torch.equal(out, alone[off : off + m]), (nt, m, off)
    finally:
        torch.set_num_threads(threads)
    # a weight row's output does not depend on the rows beside it (tiles of 2 and 4 weight rows, odd tails)
    for m in (3, 5, 9, 16):
        assert torch.equal(ops.mm(x[:m].contiguous(), w[5:38].contiguous(), t.ggml_type), alone[:m, 5:38]), m


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_rows_match_dequantized_reference(ops, cases, t):  # noqa: F811
    """Each row count against gguf.quants.dequantize + fp32 matmul: to fp32 rounding with the same int8
    activations, and within the int8 rounding bound with the fp32 ones."""
    x, w = cases[t.name]
    wf = quant.dequantize(w, t.ggml_type).double()
    xq, step = int8_rounded(x, t.block_size)
    exact, mag = xq.double() @ wf.T, xq.double().abs() @ wf.abs().T
    ref, bound = x.double() @ wf.T, (step.double() / 2) @ wf.abs().T
    for m in ROWS:
        out = ops.mm(x[:m].contiguous(), w, t.ggml_type).double()
        assert ((out - exact[:m]).abs() <= 2e-6 * mag[:m] + 1e-7).all(), m
        err = (out - ref[:m]).abs()
        assert (err <= bound[:m] * 1.001 + 2e-6 * mag[:m] + 1e-7).all(), m
        assert err.max() > 0, m  # it does run on int8 activations


SCRIPT = """import sys, torch
from radixrt.kernels import quant
ops = quant.ggml_gemv()
c = torch.load(sys.argv[1])
out = {n: [ops.mm(x[:m].contiguous(), w, quant.BY_NAME[n].ggml_type) for m in range(1, 25)]
       for n, (x, w) in c.items()}
torch.save(out, sys.argv[2])
"""


@pytest.mark.parametrize(
    "env", [{"RADIXRT_GGML_MID_ROWS": "0"}, {"RADIXRT_DISABLE_AVX512": "1"}], ids=["many-row tiles", "avx2 tiles"]
)
def test_mid_rows_equal_other_tiles(ops, cases, tmp_path, env):  # noqa: F811
    """The same products in a process where 3+ rows run gemm512.h's tiles, or where every row count runs the
    AVX2 tiles (each setting is read once per process): the same bits at every row count and type. On a CPU
    without AVX-512 VNNI all three processes run the AVX2 tiles."""
    torch.save(cases, tmp_path / "cases.pt")
    subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "cases.pt"), str(tmp_path / "other.pt")],
        env=dict(os.environ, **env),
        check=True,
    )
    other = torch.load(tmp_path / "other.pt")
    for t in TYPES:
        x, w = cases[t.name]
        for m, ref in zip(ROWS, other[t.name]):
            assert torch.equal(ops.mm(x[:m].contiguous(), w, t.ggml_type), ref), (t.name, m)
