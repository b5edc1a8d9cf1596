"""The fused CPU ops (kernels/fused) equal the torch ops they replace, and fall back to torch elsewhere."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixrt.kernels import cpp, fused
from radixrt.runtime.models.rope import Rotary

G = torch.Generator().manual_seed(0)


def test_library_builds_here():
    assert cpp.ops("radixrt_fused") is not None, "the C++ kernels must build on this AVX2 machine"


@pytest.mark.parametrize("m,h", [(1, 576), (5, 576), (3, 40)])
def test_rms_norm_and_add(m, h):
    x, r, w = torch.randn(m, h, generator=G), torch.randn(m, h, generator=G), torch.randn(h, generator=G)
    ref = F.rms_norm(x, (h,), w, 1e-5)
    torch.testing.assert_close(fused.rms_norm(x, w, 1e-5), ref, rtol=2e-6, atol=2e-6)
    r2 = r.clone()
    out = fused.add_rms_norm(x, r2, w, 1e-5)
    assert torch.equal(r2, r + x)  # the residual stream is updated in place, exactly
    torch.testing.assert_close(out, F.rms_norm(r + x, (h,), w, 1e-5), rtol=2e-6, atol=2e-6)
    strided = torch.randn(m, 2 * h, generator=G)[:, :h]  # a view with a row stride
    torch.testing.assert_close(
        fused.rms_norm(strided, w, 1e-5), F.rms_norm(strided, (h,), w, 1e-5), rtol=2e-6, atol=2e-6
    )


@pytest.mark.parametrize("m,i", [(1, 1536), (4, 1536), (2, 20)])
def test_silu_mul(m, i):
    gu = torch.randn(m, 2 * i, generator=G) * 6
    ref = F.silu(gu[:, :i]) * gu[:, i:]
    torch.testing.assert_close(fused.silu_mul(gu), ref, rtol=1e-6, atol=1e-6)


def test_rope_in_place_equals_rotate_half():
    rot = Rotary(1.0 / (10000 ** (torch.arange(0, 64, 2).float() / 64)), 4096)
    pos = torch.tensor([0, 5, 100, 4000, 7])
    cos, sin = rot.tables(pos, torch.float32)
    qkv = torch.randn(5, 15 * 64, generator=G)
    x = qkv[:, : 12 * 64].view(5, 12, 64)  # q and k heads of a qkv output: row stride 15 * 64
    half = torch.cat([-x[..., 32:], x[..., :32]], -1)
    ref = x * cos + half * (sin * torch.cat([-torch.ones(32), torch.ones(32)]))  # HF: x cos + rotate_half(x) sin
    out = fused.rope_(x, cos, sin)
    assert out.data_ptr() == qkv.data_ptr()
    torch.testing.assert_close(x, ref, rtol=0, atol=0)  # same roundings as transformers: bit-identical
    assert torch.equal(qkv[:, 12 * 64 :], qkv[:, 12 * 64 :].clone())


def test_argmax_follows_torch():
    """Greedy sampling's argmax: torch.argmax's index on random rows, on ties (the first), on a row with NaNs
    (the first NaN), on an all -inf row, on a ragged width and a strided row."""
    x = torch.randn(5, 49157, generator=G)
    x[1, 7] = x[1, 9000] = 1e4  # a tie: the first wins
    x[2, 40000] = x[2, 41000] = float("nan")
    x[2, 5] = 1e9
    x[3] = float("-inf")
    x[4, 49156] = 1e5  # in the tail past the last full 8 lanes
    want = x.argmax(-1).tolist()
    assert want[1:] == [7, 40000, 0, 49156]
    assert fused.argmax(x).tolist() == want
    assert fused.argmax(x[:, :40000]).tolist() == x[:, :40000].argmax(-1).tolist()  # rows 49157 apart
    assert fused.argmax(x[1:2]).tolist() == [7]


def test_other_dtypes_take_the_torch_path():
    x, w = torch.randn(2, 64, generator=G).bfloat16(), torch.randn(64, generator=G).bfloat16()
    assert torch.equal(fused.rms_norm(x, w, 1e-5), F.rms_norm(x, (64,), w, 1e-5))
    gu = torch.randn(2, 128, generator=G).bfloat16()
    assert torch.equal(fused.silu_mul(gu), F.silu(gu[:, :64]) * gu[:, 64:])
    r = x.clone()
    out = fused.add_rms_norm(x, r, w, 1e-5)
    assert torch.equal(r, x + x) and torch.equal(out, F.rms_norm(x + x, (64,), w, 1e-5))


@pytest.mark.parametrize("m,k,n", [(1, 576, 960), (3, 1536, 576), (8, 576, 3072), (2, 37, 70), (5, 5, 13), (1, 64, 40)])
def test_fp32_gemv_matches_matmul(m, k, n):
    """The C++ panel kernel behind ``--quantization none`` (ragged K and N, a weight narrower than one panel,
    an odd row count); it runs every row count (issue 26: no oneDNN copy). A row's result is the same bits
    whatever rows run beside it."""
    from radixrt.kernels.gemv import DenseWeight, pack_panels, unpack_panels

    assert cpp.ops("radixrt_gemv") is not None
    x, w = torch.randn(m, k, generator=G), torch.randn(n, k, generator=G)
    w_p = pack_panels(w)
    assert w_p.shape == (n * k,) and torch.equal(unpack_panels(w_p, n, k), w)
    y = cpp.ops("radixrt_gemv").gemv(x, w_p)
    # one FMA chain per output in k order: fp32 rounding of up to K terms of size ~1 (outputs ~sqrt(K))
    torch.testing.assert_close(y, (x.double() @ w.t().double()).float(), rtol=1e-5, atol=1e-3)
    for i in range(m):
        assert torch.equal(cpp.ops("radixrt_gemv").gemv(x[i : i + 1].contiguous(), w_p), y[i : i + 1])
    d = DenseWeight(w)
    assert d.kernel(m)[0] == "gemv" and d.kernel(9)[0] == "gemv" and torch.equal(d(x), y)
    with pytest.raises(RuntimeError, match="w_p must be fp32"):
        cpp.ops("radixrt_gemv").gemv(torch.randn(1, k + 1), w_p)


def test_kernel_thread_pool_callers():
    """The kernels' own thread pool (kernels/parallel.h) under every kind of caller: threads calling at once
    (one holds the pool, the others run torch's OpenMP split), a forked child (the parent's workers do not
    exist there: it builds its own pool), a change of torch's thread count. Every result is the same bits."""
    import os
    import threading
    from radixrt.kernels.gemv import pack_panels

    g = cpp.ops("radixrt_gemv")
    x, w = torch.randn(3, 576, generator=G), torch.randn(3072, 576, generator=G)
    w_p = pack_panels(w)
    want = g.gemv(x, w_p)
    torch.testing.assert_close(want, x @ w.t(), rtol=1e-5, atol=1e-4)
    got, errors = [], []

    def call():
        try:
            for _ in range(50):
                got.append(g.gemv(x, w_p))
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(got) == 200 and all(torch.equal(y, want) for y in got)
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if its products are right
        ok = all(torch.equal(g.gemv(x, w_p), want) for _ in range(20))
        os._exit(0 if ok else 1)
    assert os.waitpid(pid, 0)[1] == 0
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(g.gemv(x, w_p), want)
    finally:
        torch.set_num_threads(n)
    assert torch.equal(g.gemv(x, w_p), want)


def test_build_is_keyed_by_the_kernels_contents(monkeypatch, tmp_path):
    """The library builds from copies of the sources in a directory named by their hash: checkouts with the
    same kernels share it; a changed kernel gets a new one."""
    import os

    d = cpp.build_dir()
    assert os.path.isfile(os.path.join(d, "src", "layer", "decoder_cpu.cpp"))
    changed = tmp_path / "ggml_gemv.cpp"
    changed.write_text(open(cpp.SOURCES[0]).read() + "\n// changed\n")
    monkeypatch.setattr(cpp, "SOURCES", [str(changed)] + cpp.SOURCES[1:])
    assert cpp.build_dir() != d
