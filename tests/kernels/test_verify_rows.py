"""A speculative verification row (a request's k + 1 new tokens after a long cached context) through the C++
block kernel: the same bits as those tokens decoded one at a time by the paged kernel, alone or beside 15
other requests, on 1 or 2 threads, at every KV dtype (SmolLM2's GQA: 9 query heads on 3 KV heads). Its cost
(each K/V chunk read once for all (k + 1) x 3 queries of a KV head) is measured by benchmarks/verify_rows.py.
"""

from __future__ import annotations

import random

import pytest
import torch

from radixrt.kernels.attention.base import write_kv
from radixrt.kernels.attention.metadata import AttentionMetadata
from kernel_util import _kernels_built, needs_cpp  # noqa: F401 - the autouse build check
from radixrt.kernels.attention.torch_native import TorchNativeBackend
from radixrt.runtime.mem.kv_pool import KV_DTYPES, KVPool

pytestmark = needs_cpp  # a failed build on a capable CPU fails (_kernels_built), never skips
HQ, HKV, D, P = 9, 3, 64, 16
SCALE = D**-0.5
PAGES = 420


def _pool(dtype: str, seed: int) -> KVPool:
    """Every slot filled with seeded random K/V (rounded to the pool's type)."""
    pool = KVPool(PAGES, P, 1, HKV, D, KV_DTYPES[dtype])
    g = torch.Generator().manual_seed(seed)
    n = PAGES * P
    write_kv(pool, 0, torch.arange(n), torch.randn(n, HKV, D, generator=g), torch.randn(n, HKV, D, generator=g))
    return pool


def _step(pool, reqs, q, k, v) -> torch.Tensor:
    """reqs: [(page table, q_len, kv_len)]; returns the step's attention output [T, HQ, D]."""
    be = TorchNativeBackend("cpu", kernel=True, kv_dtype=pool.dtype)
    be.plan(AttentionMetadata.build(*map(list, zip(*reqs)), P))
    return be.forward(q, k, v, 0, pool, SCALE)


def _verify(dtype: str, context: int, T: int, mode: str) -> torch.Tensor:
    """Request 0 (pages 0..) appends T tokens after ``context`` cached ones; ``mode``: 'row' (one step,
    the verification row), 'decode' (T steps of one token), 'batch' (the row beside 15 others of mixed
    q_len). Returns request 0's [T, HQ, D]."""
    g = torch.Generator().manual_seed(context * 100 + T)
    q, k, v = (torch.randn(T, h, D, generator=g) for h in (HQ, HKV, HKV))
    pool = _pool(dtype, 1)
    table = list(range(-(-(context + T) // P)))
    if mode == "decode":
        return torch.cat(
            [_step(pool, [(table, 1, context + j + 1)], q[j : j + 1], k[j : j + 1], v[j : j + 1]) for j in range(T)]
        )
    reqs, others = [(table, T, context + T)], []
    if mode == "batch":
        rng, free = random.Random(T), list(range(len(table), PAGES))
        for _ in range(15):
            kv = rng.randint(20, 300)
            ql = rng.choice([1, 1, rng.randint(2, 10)])
            reqs.append(([free.pop() for _ in range(-(-kv // P))], ql, kv))
            others.append(ql)
    n = sum(others)
    oq, ok, ov = (torch.randn(n, h, D, generator=g) for h in (HQ, HKV, HKV))
    return _step(pool, reqs, torch.cat([q, oq]), torch.cat([k, ok]), torch.cat([v, ov]))[:T]


@pytest.mark.parametrize("dtype", list(KV_DTYPES))
def test_verification_row_is_bit_identical_to_its_decode_rows(dtype):
    """Context lengths across the 64-token chunks (the row's own tokens in one or two chunks), k + 1 from 2
    to 33 (one or two register blocks of rows; 33 x 3 rows: two items per KV head)."""
    threads = torch.get_num_threads()
    try:
        for context, T in ((1, 2), (62, 3), (64, 9), (700, 5), (1000, 17), (2300, 25), (2271, 33)):
            want = _verify(dtype, context, T, "decode")
            for nt in (1, 2):
                torch.set_num_threads(nt)
                for mode in ("row", "batch"):
                    assert torch.equal(_verify(dtype, context, T, mode), want), (context, T, nt, mode)
            torch.set_num_threads(threads)
    finally:
        torch.set_num_threads(threads)
