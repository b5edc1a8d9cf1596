"""KV pools of every element type (fp32, fp16, bf16, int8 with a scale per token and head) through the C++
kernels and the torch path, against an fp32 reference on the dequantized pages; and the fixed reduction
order: a row's attention output has the same bits as a decode row, as an extend row, in any chunking of its
prefill, and in any batch.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from radixrt.kernels.attention.base import quantize_int8, read_kv
from radixrt.kernels.attention.metadata import AttentionMetadata
from kernel_util import _kernels_built, needs_cpp  # noqa: F401 - the autouse build check
from radixrt.kernels.attention.torch_native import TorchNativeBackend
from radixrt.runtime.mem.kv_pool import KV_DTYPES, KVPool

HQ, HKV, D, P = 8, 2, 64, 16  # GQA: 4 query heads per KV head
SCALE = D**-0.5
DTYPES = list(KV_DTYPES)
needs_kernels = needs_cpp  # a failed build on a capable CPU fails (_kernels_built), never skips


def _pool(dtype: str, pages: int = 64) -> KVPool:
    return KVPool(pages, P, 1, HKV, D, KV_DTYPES[dtype])


def _reference(pool: KVPool, tables, q_lens, kv_lens, q) -> torch.Tensor:
    """Per-request causal SDPA in fp32 over the pool's dequantized K/V."""
    k = read_kv(pool.k[0], pool.k_scale(0), torch.float32).view(-1, HKV, D)
    v = read_kv(pool.v[0], pool.v_scale(0), torch.float32).view(-1, HKV, D)
    out, at = [], 0
    for table, n, kv in zip(tables, q_lens, kv_lens):
        slots = (torch.tensor(table)[:, None] * P + torch.arange(P)).reshape(-1)[:kv]
        mask = torch.arange(kv)[None, :] <= torch.arange(n)[:, None] + (kv - n)
        o = F.scaled_dot_product_attention(
            q[at : at + n].transpose(0, 1),
            k[slots].transpose(0, 1),
            v[slots].transpose(0, 1),
            attn_mask=mask,
            scale=SCALE,
            enable_gqa=True,
        )
        out.append(o.transpose(0, 1))
        at += n
    return torch.cat(out)


def _step(pool, tables, q_lens, kv_lens, q, k, v, kernel: bool) -> torch.Tensor:
    be = TorchNativeBackend("cpu", kernel=kernel, kv_dtype=pool.dtype)
    be.plan(AttentionMetadata.build(tables, q_lens, kv_lens, P))
    return be.forward(q, k, v, 0, pool, SCALE)


# Ragged lengths across page (16) and chunk (64) boundaries; decode rows and extends (with cached prefixes).
CASES = [(1, 1), (1, 15), (1, 17), (1, 64), (1, 65), (1, 130), (5, 5), (16, 16), (7, 70), (40, 129), (3, 200)]


@pytest.mark.parametrize("kernel", [pytest.param(True, marks=needs_kernels), False], ids=["cpp", "torch"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_matches_fp32_on_dequantized_pages(dtype, kernel):
    rng, g = random.Random(1), torch.Generator().manual_seed(1)
    pool = _pool(dtype)
    pages = list(range(64))
    rng.shuffle(pages)
    tables = [[pages.pop() for _ in range(-(-kv // P))] for _, kv in CASES]
    q_lens, kv_lens = [c[0] for c in CASES], [c[1] for c in CASES]
    for name in ("k", "v"):  # the cached prefixes: random values written through the pool's own rounding
        full = torch.randn(64 * P, HKV, D, generator=g)
        if dtype == "int8":
            qx, sx = quantize_int8(full)
            getattr(pool, name)[0].view(-1, HKV, D).copy_(qx)
            getattr(pool, f"{name}_scales")[0].view(-1, HKV).copy_(sx)
        else:
            getattr(pool, name)[0].view(-1, HKV, D).copy_(full)
    T = sum(q_lens)
    q, k, v = (torch.randn(T, h, D, generator=g) for h in (HQ, HKV, HKV))
    out = _step(pool, tables, q_lens, kv_lens, q, k, v, kernel)
    err = (out - _reference(pool, tables, q_lens, kv_lens, q)).abs().max().item()
    assert err < 2e-5, err


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_writes_the_bytes_of_the_torch_path(dtype):
    """The C++ write rounds as ``write_kv`` does (fp16/bf16 round-to-nearest-even; int8's scale and codes)."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (
        torch.randn(40, HQ, D, generator=g),
        torch.randn(40, HKV, D, generator=g) * 3,
        torch.randn(40, HKV, D, generator=g),
    )
    k[5] = 0.0  # an all-zero vector: scale 0
    a, b = _pool(dtype, 4), _pool(dtype, 4)
    _step(a, [[0, 1, 2]], [40], [40], q, k, v, kernel=True)
    _step(b, [[0, 1, 2]], [40], [40], q, k, v, kernel=False)
    assert torch.equal(a.k[0], b.k[0]) and torch.equal(a.v[0], b.v[0])
    if dtype == "int8":
        assert torch.equal(a.k_scales[0], b.k_scales[0]) and torch.equal(a.v_scales[0], b.v_scales[0])
        assert a.k_scales[0].view(-1, HKV)[5].tolist() == [0.0, 0.0]


def _sequence(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, HQ, D, generator=g), torch.randn(n, HKV, D, generator=g), torch.randn(n, HKV, D, generator=g)


def _run_chunked(dtype: str, n: int, chunk: int, others: int = 0) -> torch.Tensor:
    """One request's n tokens in steps of ``chunk`` (1: decode rows), each step beside ``others`` requests
    of random lengths (their own extends and decodes); returns the request's rows ``[n, HQ, D]``."""
    q, k, v = _sequence(n, 7)
    pool = _pool(dtype, 128)
    table = list(range(60, 60 + -(-n // P)))
    rng = random.Random(chunk * 31 + others)
    extra = [(list(range(i * 5, i * 5 + 5)), rng.randint(1, 70)) for i in range(others)]  # 5 pages each
    done, out = 0, []
    while done < n:
        c = min(chunk, n - done)
        tables, q_lens, kv_lens = [table], [c], [done + c]
        for t, total in extra:
            ql = rng.choice([1, rng.randint(1, 9)])
            tables.append(t)
            q_lens.append(min(ql, total))
            kv_lens.append(total)
        T = sum(q_lens)
        oq, ok, ov = _sequence(T - c, done + 1000 * c)
        o = _step(
            pool,
            tables,
            q_lens,
            kv_lens,
            torch.cat([q[done : done + c], oq]),
            torch.cat([k[done : done + c], ok]),
            torch.cat([v[done : done + c], ov]),
            kernel=True,
        )
        out.append(o[:c])
        done += c
    return torch.cat(out)


@needs_kernels
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16", "int8"])
def test_rows_are_bit_identical_in_any_chunking_and_batch(dtype):
    """Prefilled at once (the block kernel), in chunks of 7, 16 and 64 (a cached prefix plus an extend), one
    token at a time (the paged kernel's decode rows), and beside 7 other requests: the same bits."""
    n = 150
    once = _run_chunked(dtype, n, n)
    for chunk, others in ((1, 0), (7, 0), (16, 0), (64, 0), (n, 7), (1, 7), (16, 7)):
        assert torch.equal(_run_chunked(dtype, n, chunk, others), once), (chunk, others)
