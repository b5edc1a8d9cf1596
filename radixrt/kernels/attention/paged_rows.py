"""Which query rows of a step the C++ paged kernel (``paged_cpu.cpp``) attends, and over which tokens.

Decode rows and short extends (at most :data:`SHORT_EXTEND` new tokens: a jump-forward splice, a
continuation's new tokens after a cache hit) go to the kernel, which reads their KV through the page table:
no gather, no padding, one call per layer for all of them. Longer extends (prefill chunks) keep one SDPA
call each, whose blocked GEMMs win once a request brings many query rows.

Row ``j`` of a request with ``q_len`` new tokens and ``kv_len`` tokens sees ``[start, kv_len - q_len + j +
1)``; ``start`` is the row's ``suffix_start`` for a decode row in a shared-prefix group (the groups' ranges
are attended by the cascade levels, cascade.py), else 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from radixrt.kernels.attention.metadata import AttentionMetadata

# The longest extend the kernel takes. Its cost grows with q_len x kv_len dot products, SDPA's with one
# gather of the context plus a blocked GEMM. Measured per layer on SmolLM2 (9 q / 3 kv heads x 64), 2 cores,
# kernel vs SDPA in us: kv 300: q16 272/756, q32 606/1002, q64 986/2117; kv 1000: q32 1995/3033, q64
# 3849/4723, q128 7694/6862; kv 3000: q32 5978/7605, q64 12936/11297. The kernel wins up to 32 everywhere.
SHORT_EXTEND = 32


@dataclass
class RowPlan:
    """Index tensors of the kernel's rows, decode rows first (their order is ``plan_decode``'s).

    Attributes:
        rows: int64 ``[R]`` token rows of the step's packed q.
        page_ptr: int64 ``[R]`` offset of the row's request's first page in ``kv_indices``.
        start, end: int64 ``[R]`` the visible token range of each row.
        decode_reqs: int64 ``[num_decode]`` batch rows of the decode rows: the first ``num_decode`` rows.
        covers_all: True when the rows are every token of the step, in order (no SDPA call, no scatter).
        long_extends: batch rows of the extends left to SDPA.
    """

    rows: torch.Tensor
    page_ptr: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor
    decode_reqs: torch.Tensor
    covers_all: bool
    long_extends: list[int]

    @property
    def num_decode(self) -> int:
        return self.decode_reqs.shape[0]


def plan_rows(meta: AttentionMetadata, suffix_starts: list[int] | None) -> RowPlan:
    """Vectorized over tokens: no Python loop over rows or pages (one over requests only for the few
    long extends)."""
    ql = torch.tensor(meta.q_lens, dtype=torch.int64)
    kv = torch.tensor(meta.kv_lens, dtype=torch.int64)
    indptr = meta.kv_indptr.long().cpu()
    start_req = torch.tensor(suffix_starts, dtype=torch.int64) if suffix_starts else torch.zeros_like(ql)
    if max(meta.q_lens) == 1:
        B = ql.shape[0]
        return RowPlan(torch.arange(B), indptr[:-1], start_req, kv, torch.arange(B), True, [])
    T = int(ql.sum())
    req = torch.repeat_interleave(torch.arange(ql.shape[0]), ql)              # [T] request of each token
    first = torch.cumsum(ql, 0) - ql
    j = torch.arange(T) - first[req]
    end = kv[req] - ql[req] + j + 1
    decode = (ql == 1)[req]
    short = ((ql > 1) & (ql <= SHORT_EXTEND))[req]
    rows = torch.cat([decode.nonzero().squeeze(1), short.nonzero().squeeze(1)])
    r = req[rows]
    start = torch.where(ql[r] == 1, start_req[r], torch.zeros_like(r))
    long_extends = (ql > SHORT_EXTEND).nonzero().squeeze(1).tolist()          # a few requests at most
    covers_all = not long_extends and not bool(short.any() and decode.any())
    return RowPlan(rows, indptr[r], start, end[rows], (ql == 1).nonzero().squeeze(1), covers_all, long_extends)
