"""Eviction policies: exact victims on small trees (page size 1, so pages are tokens). CPU only."""

from __future__ import annotations

import pytest

from radixrt.runtime.mem.allocator import PageAllocator
from radixrt.runtime.mem.eviction import GDSF, POLICIES, make_policy
from radixrt.runtime.mem.radix_cache import RadixCache


def make(policy: str, num_pages: int) -> tuple[RadixCache, PageAllocator]:
    alloc = PageAllocator(num_pages)
    return RadixCache(1, alloc, policy), alloc


def put(cache: RadixCache, alloc: PageAllocator, key: list[int]) -> None:
    """Insert ``key`` as a finished request would: allocate (evicting if short), insert, free duplicates."""
    if alloc.num_free < len(key):
        cache.evict(len(key) - alloc.num_free)
    pages = alloc.allocate(len(key))
    assert pages is not None
    alloc.free(pages[: cache.insert(key, pages)])
    cache.check_invariants()


def cached(cache: RadixCache, key: list[int]) -> int:
    return len(cache.match_prefix(key).pages)


def test_unknown_policy_names_the_field() -> None:
    with pytest.raises(ValueError, match="eviction_policy"):
        make_policy("mru")
    with pytest.raises(ValueError, match="eviction_policy"):
        RadixCache(1, PageAllocator(4), "random")
    assert set(POLICIES) == {"lru", "lfu", "gdsf"}


@pytest.mark.parametrize("policy, survivor", [("lru", [5, 6, 7]), ("lfu", [1, 2, 3]), ("gdsf", [1, 2, 3])])
def test_hit_prefix_survives_a_newer_one_off(policy: str, survivor: list[int]) -> None:
    cache, alloc = make(policy, 6)
    put(cache, alloc, [1, 2, 3])
    cache.match_prefix([1, 2, 3, 9], hit=True)  # two admissions hit it
    cache.match_prefix([1, 2, 3, 8], hit=True)
    put(cache, alloc, [5, 6, 7])  # a newer one-off: LRU keeps it, frequency-based policies do not
    assert cache.evict(3) == 3
    assert cached(cache, survivor) == 3 and cache.total_pages_in_tree == 3 and alloc.num_free == 3


def test_hits_count_admissions_only_and_split_keeps_them() -> None:
    cache, alloc = make("lfu", 8)
    put(cache, alloc, [1, 2, 3, 4])
    cache.match_prefix([1, 2, 3, 4])  # a look-up (scheduling order): no hit
    cache.match_prefix([1, 2, 3, 4], hit=True)
    upper = cache.match_prefix([1, 2, 7], hit=True).last_node  # splits [1,2] | [3,4]
    (lower,) = upper.children.values()
    assert (upper.key, upper.hit_count) == ([1, 2], 2) and (lower.key, lower.hit_count) == ([3, 4], 1)
    cache.check_invariants()


def test_lfu_never_forgets_but_gdsf_ages_out_a_stale_prefix() -> None:
    """[1,2] was hit twice long ago; then a stream of one-offs. LFU keeps [1,2] forever; GDSF's inflation
    catches up with its score after a few evictions and it goes (Cherkasova 1998, dynamic aging)."""
    stream = [[10 + 2 * i, 11 + 2 * i] for i in range(6)]
    survivors = {}
    for policy in ("lfu", "gdsf"):
        cache, alloc = make(policy, 6)
        put(cache, alloc, [1, 2])
        cache.match_prefix([1, 2], hit=True)
        cache.match_prefix([1, 2], hit=True)
        for key in stream:
            put(cache, alloc, key)
            cache.match_prefix(key, hit=True)  # each one-off is hit once right after
        survivors[policy] = cached(cache, [1, 2])
    assert survivors == {"lfu": 2, "gdsf": 0}


def scores(cache: RadixCache) -> dict[tuple[int, ...], float]:
    """Each top-level node's key -> GDSF score, read without touching anything."""
    return {tuple(n.key): n.score for n in cache.root_node.children.values()}


def test_gdsf_scores_and_inflation_exactly() -> None:
    cache, alloc = make("gdsf", 6)
    pol = cache.policy
    assert isinstance(pol, GDSF)
    put(cache, alloc, [1, 2])  # score L + 1 + hits = 0 + 1 + 0
    cache.match_prefix([1, 2], hit=True)  # 0 + 1 + 1
    put(cache, alloc, [3, 4])
    put(cache, alloc, [5, 6])
    assert scores(cache) == {(1, 2): 2.0, (3, 4): 1.0, (5, 6): 1.0}
    put(cache, alloc, [7, 8])  # [3,4] goes (score 1, older than [5,6]); L becomes 1, so [7,8] scores 2
    assert pol.inflation == 1.0 and scores(cache) == {(1, 2): 2.0, (5, 6): 1.0, (7, 8): 2.0}
    put(cache, alloc, [9, 10])
    assert pol.inflation == 1.0 and scores(cache) == {(1, 2): 2.0, (7, 8): 2.0, (9, 10): 2.0}
    put(cache, alloc, [11, 12])  # a tie at 2: the stale hit prefix is the oldest and ages out
    assert pol.inflation == 2.0 and scores(cache) == {(7, 8): 2.0, (9, 10): 2.0, (11, 12): 3.0}
    cache.check_invariants()


@pytest.mark.parametrize("policy", list(POLICIES))
def test_locked_path_is_never_evicted(policy: str) -> None:
    cache, alloc = make(policy, 6)
    put(cache, alloc, [1, 2, 3])
    node = cache.match_prefix([1, 2, 3], hit=True).last_node
    cache.inc_lock_ref(node)
    put(cache, alloc, [4, 5, 6])
    assert cache.evict(6) == 3 and cached(cache, [1, 2, 3]) == 3
    cache.dec_lock_ref(node)
    assert cache.flush() == 3 and alloc.num_free == 6
    cache.check_invariants()
