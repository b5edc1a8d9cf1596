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
from radixrt.runtime.mem.cascade_groups import group_decode_rows
from radixrt.runtime.mem.kv_pool import KVPool
from radixrt.runtime.mem.radix_cache import RadixCache

HQ, HKV, D = 9, 3, 64
SCALE = D ** -0.5


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
                by_key.setdefault(key, (s, e, table[s // P:ceil(e)], []))[3].append(i)
        keys = sorted(by_key)
        self.groups = PrefixGroups(
            rows=[by_key[k][3] for k in keys], starts=[by_key[k][0] for k in keys],
            ends=[by_key[k][1] for k in keys], pages=[by_key[k][2] for k in keys],
            levels=[k[1] for k in keys],
            suffix_starts=[max([e for _, _, e in r[3]], default=0) for r in rows])
        self.groups.validate(self.kv_lens, self.q_lens, P)
        g = torch.Generator().manual_seed(seed)
        T = sum(self.q_lens)
        self.pool = KVPool(len(pages) + sum(map(len, self.tables)) + 8, P, 1, HKV, D)
        self.pool.k[0].copy_(torch.randn(self.pool.k[0].shape, generator=g))
        self.pool.v[0].copy_(torch.randn(self.pool.v[0].shape, generator=g))
        self.q = torch.randn(T, HQ, D, generator=g)
        self.k = torch.randn(T, HKV, D, generator=g)
        self.v = torch.randn(T, HKV, D, generator=g)

    def run(self, groups):
        meta = AttentionMetadata.build(self.tables, self.q_lens, self.kv_lens, self.P, prefix_groups=groups)
        be = TorchNativeBackend("cpu")
        be.plan(meta)
        return be.forward(self.q, self.k, self.v, 0, self.pool, SCALE), be

    def reference(self):
        """Per-row SDPA over the row's whole context (the pool already holds this step's K/V)."""
        P, out, at = self.P, [], 0
        kf, vf = self.pool.k[0].view(-1, HKV, D), self.pool.v[0].view(-1, HKV, D)
        for table, q, kv in zip(self.tables, self.q_lens, self.kv_lens):
            slots = (torch.tensor(table)[:, None] * P + torch.arange(P)).reshape(-1)[:kv]
            mask = torch.arange(kv)[None, :] <= torch.arange(q)[:, None] + (kv - q)
            o = F.scaled_dot_product_attention(self.q[at:at + q].transpose(0, 1), kf[slots].transpose(0, 1),
                                               vf[slots].transpose(0, 1), attn_mask=mask, scale=SCALE,
                                               enable_gqa=True)
            out.append(o.transpose(0, 1))
            at += q
        return torch.cat(out)


def check(b: Batch):
    plain, _ = b.run(None)
    casc, be = b.run(b.groups)
    ref = b.reference()
    torch.testing.assert_close(plain, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(casc, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(casc, plain, rtol=1e-5, atol=1e-5)
    return be


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("size", [1, 2, 7, 32])
def test_one_group_equals_plain(size, page_size):
    b = Batch(page_size, [(size, 5 * page_size + 3 * (page_size > 1), None)], loose=2, seed=size)
    be = check(b)
    lv = be.decode.levels
    assert len(lv) == 1 and lv[0].q_rows.shape == (1, size)
    # Suffixes are only the rows' own tokens: the shared prefix is not gathered per row.
    assert be.decode.suffix_slots.shape[1] == max(kv - s for kv, s in zip(b.kv_lens, b.groups.suffix_starts))


@pytest.mark.parametrize("page_size", [1, 16])
def test_many_groups_nested_mixed(page_size):
    spec = [(7, 4 * page_size, (3, 2 * page_size)), (2, 3 * page_size + 5, None), (32, 6 * page_size, (32, page_size))]
    be = check(Batch(page_size, spec, loose=3, extends=[(5, 5), (4, 3 * page_size + 4)], seed=page_size))
    assert [lv.q_rows.shape for lv in be.decode.levels] == [(3, 32), (2, 32)]
    assert be.extend_rows and be.decode.levels[0].keep is not None


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
    be = check(b)
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
    for field, bad, msg in [("ends", [b.kv_lens[g.rows[0][0]]], "ends"), ("suffix_starts", [0] * len(b.kv_lens), "suffix_starts"),
                            ("pages", [g.pages[0][:1]], "pages"), ("rows", [[]], "rows")]:
        kw = {**g.__dict__, field: bad}
        with pytest.raises(ValueError, match=msg):
            PrefixGroups(**kw).validate(b.kv_lens, b.q_lens, 16)
