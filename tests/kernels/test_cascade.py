"""Shared-prefix (cascade) decode attention equals the plain path, and the grouping follows the radix tree.

Kernel checks run on random pages (fp32, allclose at 1e-5) against two references: the same backend
without groups, and an independent per-row SDPA over the row's whole context.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from radixrt.kernels.attention.cascade import attend_lse, merge_state
from radixrt.kernels.attention.metadata import AttentionMetadata
from radixrt.kernels.attention.prefix_groups import PrefixGroups
from radixrt.kernels.attention.torch_native import TorchNativeBackend
from radixrt.runtime.mem.allocator import PageAllocator
from radixrt.runtime.executor.cascade_groups import group_decode_rows
from radixrt.runtime.mem.kv_pool import KVPool
from radixrt.runtime.mem.radix_cache import RadixCache

HQ, HKV, D = 9, 3, 64
SCALE = D**-0.5


class Batch:
    """Random requests on shuffled pages. ``spec`` is a list of groups ``(rows, tokens, sub)``: ``rows``
    requests share ``tokens`` tokens (may end mid-page); ``sub = (m, t2)`` nests a group of the first
    ``m`` of them over ``t2`` more tokens (a page multiple). ``loose`` rows share nothing; ``extends``
    adds prefill rows ``(q_len, kv_len)``."""

    def __init__(self, P, spec, loose=0, extends=(), seed=0):
        rng = random.Random(seed)
        self.P = P
        pages = list(range(4096 // P * 4))
        rng.shuffle(pages)
        take = lambda n: [pages.pop() for _ in range(n)]  # noqa: E731
        ceil = lambda t: -(-t // P)  # noqa: E731
        rows = []  # (table, q_len, kv_len, groups [(key, start, end)])
        for gi, (n, tokens, sub) in enumerate(spec):
            shared = take(ceil(tokens))
            m, t2 = sub if sub else (0, 0)
            sub_pages = take(ceil(tokens + t2) - ceil(tokens))
            for r in range(n):
                table = shared + (sub_pages if r < m else [])
                own = rng.randint(1, 3 * P + 2)  # ragged suffixes
                groups = [((gi, 0), 0, tokens)]
                if r < m:
                    groups.append(((gi, 1), tokens, tokens + t2))
                rows.append((table + take(ceil(own)), 1, len(table) * P + own, groups))
        for _ in range(loose):
            kv = rng.randint(1, 5 * P)
            rows.append((take(ceil(kv)), 1, kv, []))
        for q, kv in extends:
            rows.append((take(ceil(kv)), q, kv, []))
        rng.shuffle(rows)
        self.tables = [r[0] for r in rows]
        self.q_lens = [r[1] for r in rows]
        self.kv_lens = [r[2] for r in rows]
        by_key: dict = {}
        for i, (table, _, _, groups) in enumerate(rows):
            for key, s, e in groups:
                by_key.setdefault(key, (s, e, table[s // P : ceil(e)], []))[3].append(i)
        keys = sorted(by_key)
        self.groups = PrefixGroups(
            rows=[by_key[k][3] for k in keys],
            starts=[by_key[k][0] for k in keys],
            ends=[by_key[k][1] for k in keys],
            pages=[by_key[k][2] for k in keys],
            levels=[k[1] for k in keys],
            suffix_starts=[max([e for _, _, e in r[3]], default=0) for r in rows],
        )
        self.groups.validate(self.kv_lens, self.q_lens, P)
        g = torch.Generator().manual_seed(seed)
        T = sum(self.q_lens)
        self.pool = KVPool(len(pages) + sum(map(len, self.tables)) + 8, P, 1, HKV, D)
        self.pool.k[0].copy_(torch.randn(self.pool.k[0].shape, generator=g))
        self.pool.v[0].copy_(torch.randn(self.pool.v[0].shape, generator=g))
        self.q = torch.randn(T, HQ, D, generator=g)
        self.k = torch.randn(T, HKV, D, generator=g)
        self.v = torch.randn(T, HKV, D, generator=g)

    def run(self, groups, kernel=False):
        meta = AttentionMetadata.build(self.tables, self.q_lens, self.kv_lens, self.P, prefix_groups=groups)
        be = TorchNativeBackend("cpu", kernel=kernel, cascade=groups is not None)  # groups: opt-in on the kernels
        be.plan(meta)
        return be.forward(self.q, self.k, self.v, 0, self.pool, SCALE), be

    def reference(self):
        """Per-row SDPA over the row's whole context (the pool already holds this step's K/V)."""
        P, out, at = self.P, [], 0
        kf, vf = self.pool.k[0].view(-1, HKV, D), self.pool.v[0].view(-1, HKV, D)
        for table, q, kv in zip(self.tables, self.q_lens, self.kv_lens):
            slots = (torch.tensor(table)[:, None] * P + torch.arange(P)).reshape(-1)[:kv]
            mask = torch.arange(kv)[None, :] <= torch.arange(q)[:, None] + (kv - q)
            o = F.scaled_dot_product_attention(
                self.q[at : at + q].transpose(0, 1),
                kf[slots].transpose(0, 1),
                vf[slots].transpose(0, 1),
                attn_mask=mask,
                scale=SCALE,
                enable_gqa=True,
            )
            out.append(o.transpose(0, 1))
            at += q
        return torch.cat(out)


def check(b: Batch):
    """Both paths (torch, and the C++ paged kernel), with and without groups, against the reference; returns
    the torch and kernel backends of the grouped runs."""
    plain, _ = b.run(None)
    casc, be = b.run(b.groups)
    kplain, _ = b.run(None, kernel=True)
    kcasc, kbe = b.run(b.groups, kernel=True)
    ref = b.reference()
    for out in (plain, casc, kplain, kcasc):
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(casc, plain, rtol=1e-5, atol=1e-5)
    return be, kbe


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("size", [1, 2, 7, 32])
def test_one_group_equals_plain(size, page_size):
    b = Batch(page_size, [(size, 5 * page_size + 3 * (page_size > 1), None)], loose=2, seed=size)
    be, kbe = check(b)
    lv = be.decode.levels
    assert len(lv) == 1 and lv[0].q_rows.shape == (1, size)
    # the block kernel's table: (member begin, member end, page offset, start, end, causal)
    r = kbe.rows
    assert r.blocks[:, [0, 1, 3, 4, 5]].tolist() == [[0, size, 0, b.groups.ends[0], 0]] and r.covers_all
    # members are kernel rows (decode rows first, in batch order), the group's batch rows mapped there
    assert r.decode_reqs[r.members].tolist() == b.groups.rows[0]
    # the kernel's rows start after the shared prefix
    assert kbe.rows.start.tolist() == b.groups.suffix_starts
    # Suffixes are only the rows' own tokens: the shared prefix is not gathered per row.
    assert be.decode.suffix_slots.shape[1] == max(kv - s for kv, s in zip(b.kv_lens, b.groups.suffix_starts))


@pytest.mark.parametrize("page_size", [1, 16])
def test_many_groups_nested_mixed(page_size):
    spec = [(7, 4 * page_size, (3, 2 * page_size)), (2, 3 * page_size + 5, None), (32, 6 * page_size, (32, page_size))]
    extends = [(5, 5), (4, 3 * page_size + 4), (33, 33 + 2 * page_size + 9), (36, 36)]
    b = Batch(page_size, spec, loose=3, extends=extends, seed=page_size)
    be, kbe = check(b)
    assert [lv.q_rows.shape for lv in be.decode.levels] == [(3, 32), (2, 32)]
    assert be.extend_rows and be.decode.levels[0].keep is not None
    # the C++ kernels take every row: 44 decode rows, then the 78 extend rows in token order. The block
    # kernel's table: all group levels (in key order; 76 memberships), then one causal block per extend
    r = kbe.rows
    assert r.rows.shape[0] == 44 + 5 + 4 + 33 + 36 and not r.covers_all
    assert (r.blocks[:, 1] - r.blocks[:, 0]).tolist()[:5] == [7, 3, 2, 32, 32]
    assert r.members[:76].tolist() == [r.decode_reqs.tolist().index(x) for x in sum(b.groups.rows, [])]
    ext = [i for i, q in enumerate(b.q_lens) if q > 1]
    assert (r.blocks[5:, 1] - r.blocks[5:, 0]).tolist() == [b.q_lens[i] for i in ext]
    assert r.blocks[5:, 3:].tolist() == [[0, b.kv_lens[i], 1] for i in ext] and r.blocks[:5, 5].sum() == 0
    assert r.members[76:].tolist() == list(range(44, 122)) and r.end[44:].sum() == 0  # extends: empty there


def test_prefix_ends_mid_page():
    b = Batch(16, [(7, 37, None)], seed=3)  # 37 tokens: two whole pages and 5 tokens of a third
    assert b.groups.ends == [37] and len(b.groups.pages[0]) == 3
    check(b)


def test_span_path_equals_gather_path():
    b = Batch(16, [(5, 48, None)], seed=7)
    old = b.groups.pages[0]
    new = [1024, 1025, 1026]  # consecutive and outside the batch's pages (pool pages 1024..1031 are spare)
    kf, vf = b.pool.k[0], b.pool.v[0]
    kf[new], vf[new] = kf[old].clone(), vf[old].clone()
    for t in b.tables:
        assert t[:3] == old
        t[:3] = new
    b.groups.pages[0] = new
    be, _ = check(b)
    assert be.decode.levels[0].span == (1024 * 16, 1024 * 16 + 48)


def test_merge_state_is_exact():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 4, 8, generator=g) for _ in range(3))
    k2, v2 = torch.randn(2, 3, 6, 8, generator=g), torch.randn(2, 3, 6, 8, generator=g)
    o_a, s_a = attend_lse(q, k, v, None, 0.3)
    o_b, s_b = attend_lse(q, k2, v2, None, 0.3)
    o, s = merge_state(o_a, s_a, o_b, s_b)
    o_ref, s_ref = attend_lse(q, torch.cat([k, k2], 2), torch.cat([v, v2], 2), None, 0.3)
    torch.testing.assert_close(o, o_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=1e-6)
    scores = (q @ torch.cat([k, k2], 2).transpose(-1, -2)) * 0.3
    torch.testing.assert_close(s, torch.logsumexp(scores, -1), rtol=1e-6, atol=1e-6)


def test_validate_names_the_field():
    b = Batch(16, [(3, 32, None)], seed=1)
    g = b.groups
    for field, bad, msg in [
        ("ends", [b.kv_lens[g.rows[0][0]]], "ends"),
        ("suffix_starts", [0] * len(b.kv_lens), "suffix_starts"),
        ("pages", [g.pages[0][:1]], "pages"),
        ("rows", [[]], "rows"),
    ]:
        kw = {**g.__dict__, field: bad}
        with pytest.raises(ValueError, match=msg):
            PrefixGroups(**kw).validate(b.kv_lens, b.q_lens, 16)


def _tree_batch(P=4):
    """Requests on a real radix tree: a 16-token system prompt S, three rows below S+A (A: 8 tokens),
    two rows below S alone, one unrelated row, and one extend row on S."""
    alloc = PageAllocator(256)
    tree = RadixCache(P, alloc)
    S, A = list(range(100, 116)), list(range(200, 208))
    keys = [S + A + [300 + 4 * i + j for j in range(4)] for i in range(3)]
    keys += [S + [400 + 8 * i + j for j in range(8)] for i in range(2)]
    keys += [list(range(500, 512))]
    tree.match_prefix(S[:8])  # no-op on an empty tree
    nodes, tables, kv_lens, q_lens = [], [], [], []
    for key in keys:
        pages = alloc.allocate(len(key) // P)
        present = tree.insert(key, pages)
        alloc.free(pages[: present // P])
    tree.match_prefix(S[:8])  # splits S into two nodes with the same rows below: still one group
    for i, key in enumerate(keys + [S + [600, 601]]):
        m = tree.match_prefix(key)
        tree.inc_lock_ref(m.last_node)
        extra = 3 + i
        own = alloc.allocate(-(-(len(key) - len(m.pages) * P + extra) // P))
        nodes.append(m.last_node)
        tables.append(m.pages + own)
        q = 5 if i == len(keys) else 1
        q_lens.append(q)
        kv_lens.append(len(m.pages) * P + extra)
    return tree, nodes, tables, q_lens, kv_lens


def test_grouping_follows_the_radix_tree():
    tree, nodes, tables, q_lens, kv_lens = _tree_batch()
    g = group_decode_rows(nodes, tables, q_lens, 4, min_tokens=8)
    assert g.rows == [[0, 1, 2, 3, 4], [0, 1, 2]]
    assert (g.starts, g.ends, g.levels) == ([0, 16], [16, 24], [0, 1])
    assert g.pages == [tables[0][:4], tables[0][4:6]]
    assert all(t[:4] == tables[0][:4] for t in tables[:5]) and tables[6][:4] == tables[0][:4]
    assert g.suffix_starts == [24, 24, 24, 16, 16, 0, 0]
    g.validate(kv_lens, q_lens, 4)
    # A longer minimum drops S alone: S+A (24 tokens) is one group, rows 3 and 4 attend alone.
    g2 = group_decode_rows(nodes, tables, q_lens, 4, min_tokens=24)
    assert (g2.rows, g2.starts, g2.ends, g2.levels) == ([[0, 1, 2]], [0], [24], [0])
    assert g2.suffix_starts == [24, 24, 24, 0, 0, 0, 0]
    assert group_decode_rows(nodes, tables, q_lens, 4, min_tokens=8, min_rows=6) is None
    assert group_decode_rows([None] * 7, tables, q_lens, 4) is None
    with pytest.raises(ValueError, match="min_rows"):
        group_decode_rows(nodes, tables, q_lens, 4, min_rows=0)
    for n in nodes:
        tree.dec_lock_ref(n)
    assert tree.all_locks_released()
    tree.check_invariants()


def test_tree_groups_attend_like_the_plain_path():
    tree, nodes, tables, q_lens, kv_lens = _tree_batch()
    groups = group_decode_rows(nodes, tables, q_lens, 4, min_tokens=8)
    g = torch.Generator().manual_seed(11)
    pool = KVPool(256, 4, 1, HKV, D)
    pool.k[0].copy_(torch.randn(pool.k[0].shape, generator=g))
    pool.v[0].copy_(torch.randn(pool.v[0].shape, generator=g))
    T = sum(q_lens)
    q, k, v = (
        torch.randn(T, HQ, D, generator=g),
        torch.randn(T, HKV, D, generator=g),
        torch.randn(T, HKV, D, generator=g),
    )
    outs = []
    for pg in (None, groups):
        be = TorchNativeBackend("cpu")
        be.plan(AttentionMetadata.build(tables, q_lens, kv_lens, 4, prefix_groups=pg))
        outs.append(be.forward(q, k, v, 0, pool, SCALE))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    for n in nodes:
        tree.dec_lock_ref(n)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("cuts", [0, 1, 9])
def test_lone_row_reads_runs_of_pages_as_views(page_size, cuts):
    """Batch-1 decode: a row on ``cuts + 1`` runs of consecutive pages attends each run as a view of the
    pool and merges them; with too many runs it gathers. Same values either way."""
    b = Batch(page_size, [], loose=1, seed=cuts)
    n = 300 // page_size + 1
    table = list(range(20, 20 + n))
    for c in range(cuts):  # break the run: swap in a far page every few pages
        table[(c + 1) * n // (cuts + 1) - 1] = 900 + c
    last = min(5, page_size)
    b.tables, b.kv_lens = [table], [(n - 1) * page_size + last]
    be, _ = check(b)
    runs = 2 * cuts + 1  # each swapped-in page cuts a run in two places
    if runs <= 4:
        assert be.decode.suffix_slots is None and len(be.decode.levels) == runs - 1
        assert be.decode.suffix_span[1] == table[-1] * page_size + last
    else:
        assert be.decode.suffix_slots.shape == (1, b.kv_lens[0]) and not be.decode.levels


@pytest.mark.parametrize("page_size", [1, 16])
def test_kernel_splits_long_rows_exactly(page_size):
    """Rows longer than the kernel's chunk (256 tokens) are attended in parts merged by log-sum-exp: a
    1,300-token row (6 chunks) and a shared-prefix group over 700 tokens equal the reference."""
    b = Batch(page_size, [(3, 700, None)], loose=0, seed=5)
    n = 1300 // page_size + 1
    b.tables.append(list(range(3000 // page_size, 3000 // page_size + n)))
    b.q_lens.append(1)
    b.kv_lens.append(1300)
    b.groups.suffix_starts.append(0)
    T = sum(b.q_lens)
    g = torch.Generator().manual_seed(9)
    b.q, b.k, b.v = (
        torch.randn(T, HQ, D, generator=g),
        torch.randn(T, HKV, D, generator=g),
        torch.randn(T, HKV, D, generator=g),
    )
    _, kbe = check(b)
    assert kbe.rows.end.tolist()[-1] == 1300


@pytest.mark.parametrize("page_size", [1, 16])
def test_kernel_takes_long_extends_and_prefills(page_size):
    """Extends as causal blocks: a 300-token chunk over 700 cached tokens (rows split over items, tokens
    over chunks of 256), a 600-token prefill from nothing and a 2-token extend, beside a shared-prefix group
    (640 tokens at page size 16: more than a chunk) and a loose decode row, equal the reference."""
    b = Batch(
        page_size,
        [(3, 40 * page_size if page_size > 1 else 200, None)],
        loose=1,
        extends=[(300, 1000), (600, 600), (2, 9)],
        seed=11,
    )
    _, kbe = check(b)
    assert kbe.rows.blocks[:, 5].tolist() == [0, 1, 1, 1]
