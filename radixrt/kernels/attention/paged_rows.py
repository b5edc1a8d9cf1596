"""Which query rows of a step the C++ CPU kernels attend, and over which tokens.

Every row of a step goes to the paged kernel (``paged_cpu.cpp``), which writes the step's K/V into the pool
and attends each row's own range through the page table: a decode row's ``[suffix_start, kv_len)``
(``suffix_start`` is the end of its deepest shared-prefix group, else 0); an extend row's range there is
empty. The rest goes to the block kernel (``cascade_cpu.cpp``) as *blocks*, many rows against the same
tokens, which it attends as small GEMMs and merges into the paged kernel's output by log-sum-exp:

- each shared-prefix group: its decode rows against tokens ``[start, end)`` (cascade levels);
- each extend (prefill chunk, jump-forward splice): its ``q_len`` rows against ``[0, kv_len)``, causal:
  row ``j`` sees ``[0, kv_len - q_len + j + 1)``.

No gather, no padding, one call of each kernel per layer for the whole step.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import torch

from radixrt.kernels.attention.metadata import AttentionMetadata
from radixrt.kernels.attention.prefix_groups import PrefixGroups


@dataclass
class RowPlan:
    """Index tensors of one step's rows, decode rows first (in batch order), then extend rows (in token
    order).

    Attributes:
        rows: int64 ``[R]`` token rows of the step's packed q (every token once).
        page_ptr: int64 ``[R]`` offset of the row's request's first page in ``kv_indices``.
        start, end: int64 ``[R]`` the range the paged kernel attends (tokens; empty for extend rows).
        decode_reqs: int64 ``[num_decode]`` batch rows of the decode rows: the first ``num_decode`` rows.
        covers_all: True when ``rows`` are the step's tokens in order (its output needs no scatter).
        blocks: int64 ``[Nb, 6]`` the block kernel's blocks: (member begin, member end) into ``members``,
            the offset of the block's pages in ``kv_indices``, its tokens ``[start, end)``, causal (0/1).
        members: int64 ``[M]`` rows (indices into ``rows``) of the blocks' members.
    """

    rows: torch.Tensor
    page_ptr: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor
    decode_reqs: torch.Tensor
    covers_all: bool
    blocks: torch.Tensor
    members: torch.Tensor

    @property
    def num_decode(self) -> int:
        return self.decode_reqs.shape[0]


_NO_BLOCKS = torch.zeros(0, 6, dtype=torch.int64)  # read-only: no kernel writes blocks or members
_NO_MEMBERS = torch.zeros(0, dtype=torch.int64)


def plan_rows(meta: AttentionMetadata, groups: PrefixGroups | None) -> RowPlan:
    """Vectorized over tokens: no Python loop over rows or pages (one over groups only)."""
    kv = torch.tensor(meta.kv_lens, dtype=torch.int64)
    indptr = meta.kv_indptr.long().cpu()
    B = kv.shape[0]
    start_req = torch.tensor(groups.suffix_starts, dtype=torch.int64) if groups else torch.zeros_like(kv)
    if max(meta.q_lens) == 1:  # a decode step: every row, in order, is a decode row
        rows = torch.arange(B)
        return RowPlan(rows, indptr[:-1], start_req, kv, rows, True, *_group_blocks(groups, rows, B, indptr))
    ql = torch.tensor(meta.q_lens, dtype=torch.int64)
    decode_reqs = (ql == 1).nonzero().squeeze(1)
    group_blocks = _group_blocks(groups, decode_reqs, B, indptr)
    T = int(ql.sum())
    req = torch.repeat_interleave(torch.arange(B), ql)  # [T] request of each token
    decode = (ql == 1)[req]
    rows = torch.cat([decode.nonzero().squeeze(1), (~decode).nonzero().squeeze(1)])
    r = req[rows]
    is_dec = ql[r] == 1
    start = torch.where(is_dec, start_req[r], 0)
    end = torch.where(is_dec, kv[r], 0)
    ext = (ql > 1).nonzero().squeeze(1)  # extends, in batch order
    nd = decode_reqs.shape[0]
    size = ql[ext]
    stop = size.cumsum(0)
    m0 = group_blocks[1].shape[0]  # extend members follow groups'
    causal = torch.stack(
        [m0 + stop - size, m0 + stop, indptr[ext], torch.zeros_like(size), kv[ext], torch.ones_like(size)], 1
    )
    blocks = torch.cat([group_blocks[0], causal]).contiguous()
    members = torch.cat([group_blocks[1], torch.arange(nd, T)])
    covers_all = bool(torch.equal(rows, torch.arange(T)))
    return RowPlan(rows, indptr[r], start, end, decode_reqs, covers_all, blocks, members)


def _group_blocks(
    groups: PrefixGroups | None, decode_reqs: torch.Tensor, batch_size: int, kv_indptr: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The shared-prefix groups as blocks: ``([Ng, 6], members)``; levels need no order (their token ranges
    are disjoint), so nested groups are just more blocks. Members are kernel rows (decode-local)."""
    if groups is None or not groups.num_groups:
        return _NO_BLOCKS, _NO_MEMBERS
    local = torch.full((batch_size,), -1, dtype=torch.int64)
    local[decode_reqs] = torch.arange(decode_reqs.shape[0])
    sizes = torch.tensor([len(m) for m in groups.rows])  # a loop over groups, not rows
    end = sizes.cumsum(0)
    first = torch.tensor([m[0] for m in groups.rows])
    table = torch.stack(
        [
            end - sizes,
            end,
            kv_indptr[first],
            torch.tensor(groups.starts),
            torch.tensor(groups.ends),
            torch.zeros_like(sizes),
        ],
        1,
    )
    return table, local[torch.tensor(list(chain.from_iterable(groups.rows)))]
