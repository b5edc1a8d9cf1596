"""FlashInfer multi-level cascade planning, checked on CPU (no GPU, no flashinfer).

Two checks of ``cascade_plan_args``: the levels' segments cover each row's KV exactly once, in order;
and an emulation of the wrapper's documented semantics (per level, batch attention of each segment's
query rows over its pages, log-sum-exp merged) equals plain attention.
"""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels.attention.cascade import attend_lse, merge_state
from radixrt.kernels.attention.flashinfer_cascade import cascade_plan_args
from radixrt.kernels.attention.metadata import AttentionMetadata
from radixrt.runtime.executor.cascade_groups import group_decode_rows
from test_cascade import HKV, HQ, SCALE, Batch, _tree_batch

D = 64


def _segments(plan: dict, lvl: int, P: int):
    """Per segment of a level: (query rows, flat KV slots)."""
    qo = plan["qo_indptr_arr"][lvl].tolist()
    indptr = plan["paged_kv_indptr_arr"][lvl].tolist()
    pages = plan["paged_kv_indices_arr"][lvl].long()
    last = plan["paged_kv_last_page_len"][lvl].tolist()
    out = []
    for s in range(len(qo) - 1):
        n = indptr[s + 1] - indptr[s]
        length = 0 if n == 0 else (n - 1) * P + last[s]
        slots = (pages[indptr[s] : indptr[s + 1], None] * P + torch.arange(P)).reshape(-1)[:length]
        out.append((range(qo[s], qo[s + 1]), slots))
    return out


def _meta_from_batch(b: Batch) -> AttentionMetadata:
    return AttentionMetadata.build(b.tables, b.q_lens, b.kv_lens, b.P, prefix_groups=b.groups)


CASES = {
    "one_group": lambda: Batch(16, [(7, 64, None)], loose=2, seed=1),
    "nested": lambda: Batch(16, [(7, 64, (3, 32)), (2, 48, None), (32, 96, (32, 16))], loose=3, seed=2),
    "page1": lambda: Batch(1, [(5, 9, (2, 4))], loose=1, seed=3),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_levels_cover_each_row_once(name):
    b = CASES[name]()
    meta = _meta_from_batch(b)
    args = cascade_plan_args(meta, HQ, HKV, D)
    plan, perm, P = args["plan"], args["perm"], b.P
    assert args["num_levels"] == b.groups.num_levels + 1 and plan["causal"] is False
    assert torch.equal(perm[args["inv"]], torch.arange(meta.batch_size))
    for arr in ("qo_indptr_arr", "paged_kv_indptr_arr", "paged_kv_last_page_len"):
        assert all(t.dtype == torch.int32 and t.device.type == "cpu" for t in plan[arr])
    got = {int(r): [] for r in range(meta.batch_size)}
    for lvl in range(args["num_levels"]):
        segs = _segments(plan, lvl, P)
        assert segs[0][0].start == 0 and segs[-1][0].stop == meta.batch_size  # segments partition the rows
        for rows, slots in segs:
            for r in rows:
                got[int(perm[r])].append(slots)
    for r, table in enumerate(b.tables):
        full = (torch.tensor(table)[:, None] * P + torch.arange(P)).reshape(-1)[: b.kv_lens[r]]
        assert torch.equal(torch.cat(got[r]), full)
    # Every group's members are consecutive in the wrapper's row order.
    pos = {int(r): i for i, r in enumerate(perm)}
    for rows in b.groups.rows:
        at = sorted(pos[r] for r in rows)
        assert at == list(range(at[0], at[0] + len(rows)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_emulated_wrapper_equals_plain_attention(name):
    b = CASES[name]()
    args = cascade_plan_args(_meta_from_batch(b), HQ, HKV, D)
    kf, vf = b.pool.k[0].view(-1, HKV, D), b.pool.v[0].view(-1, HKV, D)
    loc = AttentionMetadata.build(b.tables, b.q_lens, b.kv_lens, b.P).out_cache_loc
    kf[loc], vf[loc] = b.k, b.v
    q = b.q[args["perm"]]
    B = q.shape[0]
    o, s = torch.zeros(B, HQ, D), torch.full((B, HQ), float("-inf"))
    for lvl in reversed(range(args["num_levels"])):  # the wrapper runs the last level first
        for rows, slots in _segments(args["plan"], lvl, b.P):
            if not len(rows) or not len(slots):
                continue  # an empty segment: lse -inf, weighed 0 by merge_state
            r = torch.tensor(list(rows))
            qq = q[r].view(len(r), HKV, HQ // HKV, D).transpose(0, 1).reshape(1, HKV, -1, D)
            og, sg = attend_lse(qq, kf[slots].transpose(0, 1)[None], vf[slots].transpose(0, 1)[None], None, SCALE)
            og = og.view(HKV, len(r), HQ // HKV, D).transpose(0, 1).reshape(len(r), HQ, D)
            sg = sg.view(HKV, len(r), HQ // HKV).transpose(0, 1).reshape(len(r), HQ)
            o[r], s[r] = merge_state(o[r], s[r], og, sg)
    torch.testing.assert_close(o[args["inv"]], b.reference(), rtol=1e-5, atol=1e-5)


def test_tree_groups_plan():
    tree, all_nodes, tables, q_lens, kv_lens = _tree_batch()
    q_lens, tables, kv_lens, nodes = q_lens[:-1], tables[:-1], kv_lens[:-1], all_nodes[:-1]  # decodes only
    g = group_decode_rows(nodes, tables, q_lens, 4, min_tokens=8)
    args = cascade_plan_args(AttentionMetadata.build(tables, q_lens, kv_lens, 4, prefix_groups=g), HQ, HKV, D)
    p = args["plan"]
    assert args["perm"].tolist() == [0, 1, 2, 3, 4, 5]
    assert [t.tolist() for t in p["qo_indptr_arr"]] == [[0, 5, 6], [0, 3, 6], list(range(7))]
    assert [t.tolist() for t in p["paged_kv_indptr_arr"][:2]] == [[0, 4, 4], [0, 2, 2]]
    assert [t.tolist() for t in p["paged_kv_last_page_len"][:2]] == [[4, 0], [4, 0]]
    assert p["paged_kv_indices_arr"][0].tolist() == tables[0][:4]
    assert p["paged_kv_indices_arr"][1].tolist() == tables[0][4:6]
    for n in all_nodes:
        tree.dec_lock_ref(n)
    assert tree.all_locks_released()


def test_rejects_what_flashinfer_cannot_express():
    b = Batch(16, [(3, 37, None)], seed=4)  # ends mid-page
    with pytest.raises(ValueError, match="page-aligned"):
        cascade_plan_args(_meta_from_batch(b), HQ, HKV, D)
    b = Batch(16, [(3, 32, None)], extends=[(4, 9)], seed=4)
    with pytest.raises(ValueError, match="decode"):
        cascade_plan_args(_meta_from_batch(b), HQ, HKV, D)
    b = Batch(16, [], loose=2, seed=4)
    with pytest.raises(ValueError, match="empty"):
        cascade_plan_args(AttentionMetadata.build(b.tables, b.q_lens, b.kv_lens, 16), HQ, HKV, D)
