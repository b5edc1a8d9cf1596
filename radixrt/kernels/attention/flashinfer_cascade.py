"""Shared-prefix decode on CUDA through FlashInfer's ``MultiLevelCascadeAttentionWrapper``.

The wrapper runs one batch-prefill attention per level over a unified paged KV cache and merges the
levels with ``merge_state``. Its ``plan`` takes, per level, ``qo_indptr`` (query rows of each segment),
``paged_kv_indptr`` / ``paged_kv_indices`` / ``paged_kv_last_page_len`` (that segment's pages). Segments
partition the query rows at every level, and a segment's rows must be consecutive, so
:func:`cascade_plan_args` orders the decode rows so that every group's members sit together (a stable
sort by group, deepest level first): the backend permutes q before ``run`` and un-permutes the output.

Levels, for a step whose :class:`PrefixGroups` has ``n`` levels (``n + 1`` wrapper levels):

- level ``l < n``: one segment per level-``l`` group (its pages ``[start, end)``), plus one segment per
  run of rows outside any level-``l`` group with no pages (``paged_kv_last_page_len`` 0: FlashInfer's
  ``get_seq_lens`` gives length 0, the kernel's log-sum-exp is -inf and ``merge_state`` weighs it 0);
- level ``n``: one segment per row, its own pages from ``suffix_start`` to ``kv_len``.

FlashInfer segments start at a page boundary, so every group range must be page-aligned; the radix
tree's ranges are (node keys are whole pages). Only pure decode steps run as a cascade. Importing this
module never imports ``flashinfer``. Pure planning is tested on CPU (tests/test_flashinfer_cascade.py).
"""

from __future__ import annotations

import torch

from radixrt.kernels.attention.metadata import AttentionMetadata

_NO_GROUP = 1 << 30  # sorts rows outside a level's groups after its members


def cascade_plan_args(meta: AttentionMetadata, num_q_heads: int, num_kv_heads: int, head_dim: int) -> dict:
    """``MultiLevelCascadeAttentionWrapper.plan`` arguments for a pure decode step with prefix groups.

    Returns:
        ``{"num_levels", "perm", "inv", "plan"}``: ``perm`` int64 ``[B]`` is the row order the wrapper
        sees (q is ``q[perm]``), ``inv`` its inverse (output rows ``out[inv]``); ``plan`` holds the
        per-level lists ``qo_indptr_arr``, ``paged_kv_indptr_arr``, ``paged_kv_indices_arr``,
        ``paged_kv_last_page_len`` (int32; indptrs and last-page lengths on the host, the last level's
        page indices on ``meta.kv_indices``' device) and ``num_qo_heads``, ``num_kv_heads``,
        ``head_dim``, ``page_size``, ``causal=False``.

    Raises:
        ValueError: no groups, a step that is not pure decode, or a group range not page-aligned.
    """
    groups, P, B = meta.prefix_groups, meta.page_size, meta.batch_size
    if groups is None or not groups.num_groups:
        raise ValueError("prefix_groups is empty: use the plain decode plan")
    if not meta.is_decode:
        raise ValueError("cascade attention runs pure decode steps only (every q_len == 1)")
    if any(e % P for e in groups.ends):
        raise ValueError(f"prefix_groups.ends must be page-aligned (page_size {P}) for FlashInfer cascade")
    n = groups.num_levels
    gid = torch.full((n, B), _NO_GROUP, dtype=torch.int64)
    for g, (rows, lvl) in enumerate(zip(groups.rows, groups.levels)):  # a loop over groups, not rows
        gid[lvl, rows] = g
    perm = torch.arange(B)
    for lvl in reversed(range(n)):  # radix sort: outer levels decide last, so nested groups stay together
        perm = perm[torch.argsort(gid[lvl, perm], stable=True)]
    i32 = dict(dtype=torch.int32)
    qo_arr, indptr_arr, indices_arr, last_arr = [], [], [], []
    for lvl in range(n):
        seq = gid[lvl, perm]
        cut = torch.nonzero(seq[1:] != seq[:-1]).squeeze(1) + 1
        qo_arr.append(torch.cat([torch.zeros(1, dtype=torch.int64), cut, torch.tensor([B])]).to(**i32))
        seg_groups = seq[torch.cat([torch.zeros(1, dtype=torch.int64), cut])]
        pages, counts, last = [], [], []
        for g in seg_groups.tolist():  # segments are few: one per group, one per ungrouped run
            if g == _NO_GROUP:
                counts.append(0)
                last.append(0)
            else:
                pages.extend(groups.pages[g])
                counts.append(len(groups.pages[g]))
                last.append(groups.ends[g] - groups.starts[g] - (len(groups.pages[g]) - 1) * P)
        indptr_arr.append(torch.cumsum(torch.tensor([0] + counts), 0).to(**i32))
        indices_arr.append(torch.tensor(pages, **i32).to(meta.kv_indices.device))
        last_arr.append(torch.tensor(last, **i32))
    # Last level: each row's own pages, sliced out of the step's CSR page table with tensor ops.
    kv = torch.tensor(meta.kv_lens, dtype=torch.int64)[perm]
    first = torch.tensor(groups.suffix_starts, dtype=torch.int64)[perm] // P
    counts = (kv + P - 1) // P - first
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)])
    row = torch.repeat_interleave(torch.arange(B), counts)
    src = meta.kv_indptr.long().cpu()[perm][row] + first[row] + torch.arange(int(indptr[-1])) - indptr[row]
    qo_arr.append(torch.arange(B + 1, **i32))
    indptr_arr.append(indptr.to(**i32))
    indices_arr.append(meta.kv_indices[src.to(meta.kv_indices.device)])
    last_arr.append((kv - (kv + P - 1) // P * P + P).to(**i32))
    plan = dict(
        qo_indptr_arr=qo_arr,
        paged_kv_indptr_arr=indptr_arr,
        paged_kv_indices_arr=indices_arr,
        paged_kv_last_page_len=last_arr,
        num_qo_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        page_size=P,
        causal=False,
    )
    return {"num_levels": n + 1, "perm": perm, "inv": torch.argsort(perm), "plan": plan}


class CascadeWrappers:
    """One ``MultiLevelCascadeAttentionWrapper`` per level count, built on first use over the backend's
    workspace. ``plan`` plans a step; ``run`` attends one layer in the caller's row order."""

    def __init__(self, flashinfer_module, workspace: torch.Tensor):
        self._fi, self.workspace = flashinfer_module, workspace
        self.wrappers: dict[int, object] = {}
        self._active = self._perm = self._inv = None

    def plan(self, meta: AttentionMetadata, num_q_heads: int, num_kv_heads: int, head_dim: int, common: dict) -> None:
        args = cascade_plan_args(meta, num_q_heads, num_kv_heads, head_dim)
        n = args["num_levels"]
        if n not in self.wrappers:
            self.wrappers[n] = self._fi.MultiLevelCascadeAttentionWrapper(n, self.workspace, "NHD")
        self.wrappers[n].plan(**args["plan"], **common)
        dev = meta.kv_indices.device
        self._active, self._perm, self._inv = self.wrappers[n], args["perm"].to(dev), args["inv"].to(dev)

    def run(self, q: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self._active.run(q[self._perm], kv_cache)[self._inv]
