"""Issue 30: a pool with tier 2 behind it hits like one pool of their total size (no model: the scheduler's
page calls, ``ReqPages``, on a tiny KV pool whose pages hold their own token ids, so a restored page's bytes are checked
too). An agent trace: 8 sessions of a 32-token prefix, revisited in 3 shuffled rounds, each turn with a fresh 4-token
tail and 2 output tokens; the working set (80 pages) is 4.4x the pool (18 pages). Before the fixes the
tier hit 364 tokens under both policies (gdsf: 84 below the 4x pool)."""

from __future__ import annotations

import random

import pytest
import torch

from radixrt.runtime.mem.hicache import HiCache
from radixrt.runtime.mem.host_tier import HostTier
from radixrt.runtime.mem.kv_pool import KVPool
from radixrt.runtime.mem.page_codec import PageCodec
from radixrt.runtime.mem.req_pages import ReqPages

P, POOL = 4, 18  # pages of 4 tokens; one turn takes 10 pages


class Turn:
    """What ``ReqPages`` reads of a request (``scheduler/request.py:Req``)."""

    def __init__(self, ids: list[int], rid: str) -> None:
        self.input_ids, self.output_ids, self.rid, self.cache_salt = ids, [], rid, None
        self.page_table, self.last_node, self.prefix_len, self.num_computed = [], None, 0, 0
        self.hit_counted = False

    @property
    def fill_ids(self) -> list[int]:
        return self.input_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.fill_ids)

    def max_cacheable_prefix(self) -> int:
        return self.seq_len - 1


def trace() -> list[list[int]]:
    rng = random.Random(0)
    prefixes = [[rng.randrange(1, 30000) for _ in range(32)] for _ in range(8)]
    order = [s for _ in range(3) for s in rng.sample(range(8), 8)]
    return [prefixes[s] + [rng.randrange(1, 30000) for _ in range(4)] for s in order]


def run(pool_pages: int, policy: str, host_pages: int = 0) -> tuple[int, ReqPages]:
    """Hit tokens of the trace; each computed page's K holds its tokens, checked on every hit."""
    kv = KVPool(pool_pages, P, 1, 1, 1, torch.float32)
    codec = PageCodec(kv)
    tiers = lambda tree, allocate: HiCache(
        tree, codec, allocate, HostTier(host_pages, codec.page_bytes, on_drop=tree.policy.dropped)
    )  # noqa: E731
    req_pages = ReqPages(P, pool_pages, True, policy, tiers=tiers if host_pages else None)
    hits = 0
    for i, ids in enumerate(trace()):
        r = Turn(ids, str(i))
        matched = req_pages.admit(r)
        hits += matched
        got = kv.k[0][torch.tensor(r.page_table, dtype=torch.long)].flatten().tolist() if matched else []
        assert got == [float(t) for t in ids[:matched]], f"turn {i}: a cached page holds other tokens"
        assert req_pages.grow(r, len(ids) - matched)
        for j in range(matched, len(ids)):  # "compute" the rest: each slot holds its token id
            kv.k[0][r.page_table[j // P], j % P, 0, 0] = float(ids[j])
        r.num_computed = len(ids)
        req_pages.cache(r)
        r.output_ids.append(7)
        assert req_pages.grow(r, 1)
        kv.k[0][r.page_table[len(ids) // P], len(ids) % P, 0, 0] = 7.0
        r.num_computed += 1
        r.output_ids.append(7)
        req_pages.release(r)
        assert (
            req_pages.allocator.num_free + req_pages.tree.evictable_pages == pool_pages
            and req_pages.tree.protected_pages == 0
        )
        if req_pages.hicache is not None:
            req_pages.hicache.check_invariants()
    return hits, req_pages


@pytest.mark.parametrize("policy", ["gdsf", "lru"])
def test_pool_and_tier2_hit_like_a_pool_of_their_size(policy):
    """Query tokens 24 x 36 = 864; at most 16 revisits x 32 = 512 can hit. A tier of 3x the pool behind it
    hits at least as much as a pool 4x larger (the tier moves only the pages asked for; a pool evicts whole
    leaves), and far more than the pool alone."""
    alone, _ = run(POOL, policy)
    x4, _ = run(4 * POOL, policy)
    tiered, req_pages = run(POOL, policy, 3 * POOL)
    assert alone == 0  # the working set is 4.4x the pool: every prefix is gone before its revisit
    assert 0 < x4 <= tiered <= 16 * 32, (x4, tiered)
    # the tier's own hits are what the pool alone could not keep, and a hit is never counted twice
    assert 0 < req_pages.hicache.host_hit_tokens <= tiered


def test_restore_spills_after_its_slots_are_free():
    """A restore takes its pages out of a full tier 2 and then allocates pool pages, which pushes pool
    leaves down into tier 2: those must land in the slots just emptied, not push other entries out."""
    _, req_pages = run(POOL, "gdsf", 3 * POOL)
    hc = req_pages.hicache
    assert hc.host.num_used + hc.host.num_free == 3 * POOL
    # every page that left tier 2 for good made room for a newer one when the tier was full
    assert hc.host_evicted_pages == hc.stored_pages - hc.loaded_pages - hc.host.num_used
