"""RadixCache: exact unit tests (the hypothesis state machine is in test_radix_machine.py). CPU only."""

from __future__ import annotations

import pytest

from radixrt.runtime.mem.allocator import PageAllocator
from radixrt.runtime.mem.radix_cache import RadixCache, TreeNode


def make(page_size: int, num_pages: int = 64, policy: str = "lru") -> tuple[RadixCache, PageAllocator]:
    """These tests pin LRU's order; tests/test_eviction.py covers the other policies."""
    alloc = PageAllocator(num_pages)
    return RadixCache(page_size, alloc, policy), alloc


def nodes_under(node: TreeNode) -> list[TreeNode]:
    out, stack = [], list(node.children.values())
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(n.children.values())
    return out


def put(cache: RadixCache, alloc: PageAllocator, key: list[int], salt: str | None = None) -> list[int]:
    """Allocate pages for ``key``, insert, free the caller's duplicates; returns the pages the tree holds."""
    pages = alloc.allocate(len(key) // cache.page_size)
    assert pages is not None
    present = cache.insert(key, pages, salt)
    alloc.free(pages[: present // cache.page_size])
    cache.check_invariants()
    return cache.match_prefix(key, salt).pages


def balanced(cache: RadixCache, alloc: PageAllocator, held: int = 0) -> bool:
    return alloc.num_free + cache.evictable_pages + cache.protected_pages + held == alloc.num_pages


# ------------------------------------------------------------------------------------------ unit tests
def test_empty_tree_match() -> None:
    cache, alloc = make(4)
    res = cache.match_prefix([1, 2, 3, 4, 5])
    assert res.pages == [] and res.last_node is cache.root_node
    assert cache.match_prefix([]).last_node is cache.root_node
    assert cache.total_pages_in_tree == 0 and alloc.num_free == 64
    cache.check_invariants()


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_insert_then_match_exact_longer_shorter(ps: int) -> None:
    cache, alloc = make(ps)
    key = list(range(3 * ps))
    pages = alloc.allocate(3)
    assert pages == [0, 1, 2]
    assert cache.insert(key, pages) == 0
    cache.check_invariants()
    assert cache.match_prefix(key).pages == [0, 1, 2]
    assert cache.match_prefix(key + [999] * (ps + 1)).pages == [0, 1, 2]  # longer
    assert cache.match_prefix(key[: 2 * ps]).pages == [0, 1]  # shorter, page-aligned
    assert cache.match_prefix(key[: 2 * ps + ps - 1]).pages == [0, 1]  # shorter, cut to pages
    assert cache.match_prefix([999] + key).pages == []
    assert (cache.evictable_pages, cache.protected_pages, cache.total_pages_in_tree) == (3, 0, 3)
    assert balanced(cache, alloc)
    cache.check_invariants()


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_split_on_partial_match(ps: int) -> None:
    cache, alloc = make(ps)
    key = list(range(4 * ps))
    cache.insert(key, alloc.allocate(4) or [])
    assert len(nodes_under(cache.root_node)) == 1
    # diverge in the middle of page 2 (index 1): only page 0 matches
    probe = key[:ps] + [-1] * (3 * ps)
    res = cache.match_prefix(probe)
    assert res.pages == [0]
    assert len(nodes_under(cache.root_node)) == 2
    assert res.last_node.key == key[:ps] and res.last_node.value == [0]
    (lower,) = res.last_node.children.values()
    assert lower.key == key[ps:] and lower.value == [1, 2, 3] and lower.parent is res.last_node
    # a match ending exactly on the node boundary does not split again
    assert cache.match_prefix(key[:ps]).last_node is res.last_node
    assert len(nodes_under(cache.root_node)) == 2
    cache.check_invariants()


def test_split_inside_page_matches_whole_pages_only() -> None:
    cache, alloc = make(4)
    cache.insert([1, 2, 3, 4, 5, 6, 7, 8], alloc.allocate(2) or [])
    res = cache.match_prefix([1, 2, 3, 4, 5, 6, 0, 0])  # diverges inside page 1
    assert res.pages == [0] and res.last_node.key == [1, 2, 3, 4]
    assert [n.value for n in nodes_under(cache.root_node)] in ([[0], [1]], [[1], [0]])
    cache.check_invariants()


def test_insert_returns_already_present_and_duplicates_are_callers() -> None:
    cache, alloc = make(2, num_pages=16)
    a = alloc.allocate(3) or []  # [0, 1, 2]
    assert cache.insert([1, 1, 2, 2, 3, 3], a) == 0
    b = alloc.allocate(4) or []  # [3, 4, 5, 6]
    # shares the first two pages (tokens [1,1,2,2]), then diverges
    assert cache.insert([1, 1, 2, 2, 9, 9, 8, 8], b) == 4
    alloc.free(b[:2])  # the caller's duplicates
    assert cache.match_prefix([1, 1, 2, 2, 9, 9, 8, 8]).pages == [0, 1, 5, 6]
    assert cache.match_prefix([1, 1, 2, 2, 3, 3]).pages == [0, 1, 2]
    assert len(nodes_under(cache.root_node)) == 3  # split [1,1,2,2] + two leaves
    # a full re-insert is all present
    c = alloc.allocate(3) or []
    assert cache.insert([1, 1, 2, 2, 3, 3, 7], c) == 6
    alloc.free(c)
    assert cache.total_pages_in_tree == 5 and balanced(cache, alloc)
    cache.check_invariants()


def test_lock_prevents_eviction() -> None:
    cache, alloc = make(1, num_pages=8)
    put(cache, alloc, [1, 2, 3])
    node = cache.match_prefix([1, 2, 3]).last_node
    cache.inc_lock_ref(node)
    assert (cache.evictable_pages, cache.protected_pages) == (0, 3)
    assert cache.evict(3) == 0 and cache.flush() == 0
    assert cache.match_prefix([1, 2, 3]).pages == [0, 1, 2]
    assert not cache.all_locks_released()
    cache.dec_lock_ref(node)
    assert cache.all_locks_released() and (cache.evictable_pages, cache.protected_pages) == (3, 0)
    assert cache.evict(1) == 3 and alloc.num_free == 8  # a whole leaf goes
    cache.check_invariants()


def test_split_of_locked_node_keeps_lock_counts() -> None:
    cache, alloc = make(2, num_pages=8)
    put(cache, alloc, [1, 1, 2, 2, 3, 3])
    node = cache.match_prefix([1, 1, 2, 2, 3, 3]).last_node
    cache.inc_lock_ref(node)
    upper = cache.match_prefix([1, 1, 9, 9]).last_node  # splits the locked node
    assert upper.value == [0] and upper.lock_ref == 1 and node.value == [1, 2] and node.parent is upper
    assert (cache.evictable_pages, cache.protected_pages) == (0, 3)
    cache.check_invariants()
    cache.dec_lock_ref(node)
    assert cache.all_locks_released() and (cache.evictable_pages, cache.protected_pages) == (3, 0)
    cache.check_invariants()


def test_lock_partial_path_protects_only_that_prefix() -> None:
    cache, alloc = make(1, num_pages=8)
    put(cache, alloc, [1, 2, 3, 4])
    node = cache.match_prefix([1, 2]).last_node  # splits [1,2] | [3,4]
    cache.inc_lock_ref(node)
    assert (cache.evictable_pages, cache.protected_pages) == (2, 2)
    assert cache.flush() == 2
    assert cache.match_prefix([1, 2, 3, 4]).pages == [0, 1]
    cache.dec_lock_ref(node)
    assert cache.flush() == 2 and alloc.num_free == 8
    cache.check_invariants()


def test_lru_order_and_parent_pushed_after_last_child() -> None:
    cache, alloc = make(1, num_pages=16)
    put(cache, alloc, [1, 2, 3])  # pages 0,1,2
    put(cache, alloc, [1, 2, 7])  # shares [1,2]; page 3
    put(cache, alloc, [5, 6])  # pages 4,5
    cache.match_prefix([1, 2, 3])  # [1,2,3] is now the most recent; [1,2,7] the least recent leaf
    free_before = alloc.num_free
    assert cache.evict(1) == 1
    assert cache.match_prefix([1, 2, 7]).pages == [0, 1]  # page 3 went
    assert alloc.num_free == free_before + 1
    cache.match_prefix([1, 2, 3])
    assert cache.evict(1) == 2  # [5,6] is now the oldest leaf
    assert cache.match_prefix([5, 6]).pages == []
    assert cache.evict(1) == 1  # leaf [3]
    # its parent [1,2] became a leaf and was pushed: the next evict takes it within one call
    assert cache.match_prefix([1, 2, 3]).pages == [0, 1]
    assert cache.evict(5) == 2 and cache.total_pages_in_tree == 0 and alloc.num_free == 16
    cache.check_invariants()


def test_parent_pushed_within_one_evict_call() -> None:
    cache, alloc = make(2, num_pages=16)
    put(cache, alloc, [1, 1, 2, 2, 3, 3])
    put(cache, alloc, [1, 1, 2, 2, 4, 4])  # root -> [1,1,2,2] -> {[3,3], [4,4]}
    assert len(nodes_under(cache.root_node)) == 3
    assert cache.evict(4) == 4  # both leaves, then the parent that became a leaf
    assert cache.total_pages_in_tree == 0 and alloc.num_free == 16
    cache.check_invariants()


def test_flush_frees_exactly_unlocked() -> None:
    cache, alloc = make(2, num_pages=16)
    put(cache, alloc, [1, 1, 2, 2, 3, 3])
    put(cache, alloc, [1, 1, 5, 5])
    put(cache, alloc, [9, 9])
    locked = cache.match_prefix([1, 1, 2, 2]).last_node
    cache.inc_lock_ref(locked)
    assert (cache.evictable_pages, cache.protected_pages) == (3, 2)
    assert cache.flush() == 3
    assert (cache.evictable_pages, cache.protected_pages) == (0, 2)
    assert cache.match_prefix([1, 1, 2, 2, 3, 3]).pages == [0, 1]
    assert alloc.num_free == 14
    cache.dec_lock_ref(locked)
    assert cache.flush() == 2 and alloc.num_free == 16
    cache.check_invariants()


def test_salts_isolate() -> None:
    cache, alloc = make(1, num_pages=16)
    a = put(cache, alloc, [1, 2, 3], salt="alice")
    assert cache.match_prefix([1, 2, 3]).pages == []
    assert cache.match_prefix([1, 2, 3], salt="bob").pages == []
    b = put(cache, alloc, [1, 2, 3], salt="bob")
    assert set(a).isdisjoint(b) and cache.total_pages_in_tree == 6
    assert cache.match_prefix([1, 2, 3], salt="alice").pages == a
    assert cache.match_prefix([1, 2, 3], salt="bob").pages == b
    assert cache.flush() == 6 and alloc.num_free == 16
    assert set(cache.roots) == {None}  # emptied salted roots are dropped
    cache.check_invariants()


def test_key_not_page_multiple_is_truncated() -> None:
    cache, alloc = make(4)
    assert cache.insert([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], alloc.allocate(2) or []) == 0
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]).pages == [0, 1]
    assert cache.match_prefix([1, 2, 3]).pages == []
    assert [n.key for n in nodes_under(cache.root_node)] == [[1, 2, 3, 4, 5, 6, 7, 8]]
    cache.check_invariants()


def test_insert_wrong_pages_length_raises() -> None:
    cache, alloc = make(4)
    with pytest.raises(ValueError):
        cache.insert([1, 2, 3, 4, 5, 6, 7, 8], [0])
    with pytest.raises(ValueError):
        cache.insert([1, 2, 3], [0])
    assert cache.insert([1, 2, 3], []) == 0 and cache.total_pages_in_tree == 0


def test_dec_lock_ref_below_zero_raises() -> None:
    cache, alloc = make(1)
    put(cache, alloc, [1, 2])
    node = cache.match_prefix([1, 2]).last_node
    with pytest.raises(ValueError):
        cache.dec_lock_ref(node)
    cache.inc_lock_ref(node)
    cache.dec_lock_ref(node)
    with pytest.raises(ValueError):
        cache.dec_lock_ref(node)
    cache.check_invariants()


def test_lock_after_eviction_raises() -> None:
    cache, alloc = make(1)
    put(cache, alloc, [1, 2])
    node = cache.match_prefix([1, 2]).last_node
    cache.flush()
    with pytest.raises(ValueError):
        cache.inc_lock_ref(node)
    cache.check_invariants()


def test_check_invariants_catches_corruption() -> None:
    cache, alloc = make(1)
    put(cache, alloc, [1, 2])
    put(cache, alloc, [3])
    cache._evictable += 1
    with pytest.raises(AssertionError, match="counters"):
        cache.check_invariants()
    cache._evictable -= 1
    leaf = cache.match_prefix([3]).last_node
    leaf.value = [0]  # page 0 also held by [1, 2]
    with pytest.raises(AssertionError, match="duplicated"):
        cache.check_invariants()
