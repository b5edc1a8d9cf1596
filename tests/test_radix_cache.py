"""RadixCache: exact unit tests plus a hypothesis state machine against a naive reference model. CPU only."""
from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, multiple, precondition, rule

from radixrt.runtime.mem.allocator import PageAllocator
from radixrt.runtime.mem.radix_cache import RadixCache, TreeNode

Prefix = tuple[str | None, tuple[int, ...]]  # (salt, page-aligned token prefix)


def make(page_size: int, num_pages: int = 64) -> tuple[RadixCache, PageAllocator]:
    alloc = PageAllocator(num_pages)
    return RadixCache(page_size, alloc), alloc


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
    alloc.free(pages[:present // cache.page_size])
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
    assert cache.match_prefix(key[:2 * ps]).pages == [0, 1]  # shorter, page-aligned
    assert cache.match_prefix(key[:2 * ps + ps - 1]).pages == [0, 1]  # shorter, cut to pages
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


# ------------------------------------------------------------------------------------------ state machine
TOTAL_PAGES = 24
keys = st.lists(st.integers(0, 2), max_size=10)
salts = st.sampled_from([None, "s"])


class RadixCacheMachine(RuleBasedStateMachine):
    inserted = Bundle("inserted")  # (key, salt) pairs that went into the tree, so lookups hit often

    """Reference: ``ref`` maps every cached page-aligned prefix to the page id of its last page, and
    ``times`` to the logical time it was last touched (all pages in one node share a time)."""

    @initialize(ps=st.sampled_from([1, 2, 4]))
    def setup(self, ps: int) -> None:
        self.ps = ps
        self.alloc = PageAllocator(TOTAL_PAGES)
        self.cache = RadixCache(ps, self.alloc)
        self.ref: dict[Prefix, int] = {}
        self.times: dict[Prefix, int] = {}
        self.clock = 0
        self.locks: list[tuple[TreeNode, str | None, tuple[int, ...], list[int]]] = []
        self.requests: list[tuple[list[int], str | None, list[int]]] = []  # privately held pages

    # -- reference helpers
    def prefixes(self, key: list[int], salt: str | None) -> list[Prefix]:
        return [(salt, tuple(key[:k * self.ps])) for k in range(1, len(key) // self.ps + 1)]

    def ref_match(self, key: list[int], salt: str | None) -> list[int]:
        pages = []
        for p in self.prefixes(key, salt):
            if p not in self.ref:
                break
            pages.append(self.ref[p])
        return pages

    def locked_prefixes(self) -> set[Prefix]:
        return {p for _, salt, toks, _ in self.locks for p in self.prefixes(list(toks), salt)}

    def tree_map(self) -> dict[Prefix, int]:
        out: dict[Prefix, int] = {}
        for salt, root in self.cache.roots.items():
            stack: list[tuple[TreeNode, tuple[int, ...]]] = [(root, ())]
            while stack:
                node, toks = stack.pop()
                for i, page in enumerate(node.value):
                    out[(salt, toks + tuple(node.key[:(i + 1) * self.ps]))] = page
                toks = toks + tuple(node.key)
                stack.extend((c, toks) for c in node.children.values())
        return out

    def do_match(self, key: list[int], salt: str | None) -> tuple[TreeNode, list[int]]:
        expected = self.ref_match(key, salt)
        res = self.cache.match_prefix(key, salt)
        assert res.pages == expected
        self.clock += 1
        for p in self.prefixes(key, salt)[:len(expected)]:
            self.times[p] = self.clock
        path: list[int] = []  # last_node covers exactly the match
        node = res.last_node
        while node.parent is not None:
            path[:0] = node.value
            node = node.parent
        assert path == expected
        return res.last_node, expected

    def do_insert(self, key: list[int], salt: str | None, pages: list[int]) -> None:
        prefs = self.prefixes(key, salt)
        present = next((i for i, p in enumerate(prefs) if p not in self.ref), len(prefs))
        assert self.cache.insert(key, pages, salt) == present * self.ps
        self.alloc.free(pages[:present])
        if prefs:
            self.clock += 1
        for i, p in enumerate(prefs):
            self.ref.setdefault(p, pages[i])
            self.times[p] = self.clock

    def do_evict(self, n: int) -> None:
        free_before, evictable_before = self.alloc.num_free, self.cache.evictable_pages
        got = self.cache.evict(n)
        now = self.tree_map()
        assert now.items() <= self.ref.items()
        gone = self.ref.keys() - now.keys()
        assert got == len(gone) == self.alloc.num_free - free_before
        assert got >= min(n, evictable_before) and (got >= n or self.cache.evictable_pages == 0)
        locked = self.locked_prefixes()
        assert not gone & locked, "a locked path was evicted"
        parents = {(salt, toks[:-self.ps]) for salt, toks in now}
        leaves = [p for p in now if p not in parents and p not in locked]
        if gone and leaves:  # LRU: nothing evicted is newer than a surviving evictable leaf
            assert max(self.times[p] for p in gone) <= min(self.times[p] for p in leaves)
        for p in gone:
            del self.ref[p], self.times[p]

    def alloc_or_evict(self, n: int) -> list[int] | None:
        if self.alloc.num_free < n:
            self.do_evict(n - self.alloc.num_free)
        return self.alloc.allocate(n)

    # -- rules
    @rule(target=inserted, key=keys, salt=salts)
    def insert(self, key: list[int], salt: str | None) -> object:
        pages = self.alloc_or_evict(len(key) // self.ps)
        if pages is None:
            return multiple()
        self.do_insert(key, salt, pages)
        return (key, salt)

    @rule(key=keys, salt=salts)
    def start_request(self, key: list[int], salt: str | None) -> None:
        pages = self.alloc_or_evict(len(key) // self.ps)
        if pages is not None:
            self.requests.append((key, salt, pages))

    @precondition(lambda self: self.requests)
    @rule(target=inserted, i=st.integers(0, 100))
    def finish_request(self, i: int) -> tuple[list[int], str | None]:
        key, salt, pages = self.requests.pop(i % len(self.requests))
        self.do_insert(key, salt, pages)
        return (key, salt)

    @rule(known=inserted, cut=st.integers(0, 10), tail=keys)
    def match_known(self, known: tuple[list[int], str | None], cut: int, tail: list[int]) -> None:
        self.do_match(known[0][:cut] + tail, known[1])

    @rule(key=keys, salt=salts)
    def match(self, key: list[int], salt: str | None) -> None:
        self.do_match(key, salt)

    @rule(known=inserted, cut=st.integers(0, 10), tail=keys)
    def lock(self, known: tuple[list[int], str | None], cut: int, tail: list[int]) -> None:
        key, salt = known[0][:cut] + tail, known[1]
        node, pages = self.do_match(key, salt)
        self.cache.inc_lock_ref(node)
        self.locks.append((node, salt, tuple(key[:len(pages) * self.ps]), pages))

    @precondition(lambda self: self.locks)
    @rule(i=st.integers(0, 100), cut=st.integers(0, 10))
    def match_inside_locked_path(self, i: int, cut: int) -> None:
        _, salt, toks, _ = self.locks[i % len(self.locks)]
        self.do_match(list(toks[:cut]), salt)  # splits locked nodes

    @precondition(lambda self: self.locks)
    @rule(i=st.integers(0, 100))
    def unlock(self, i: int) -> None:
        node, *_ = self.locks.pop(i % len(self.locks))
        self.cache.dec_lock_ref(node)

    @rule(n=st.integers(0, TOTAL_PAGES))
    def evict(self, n: int) -> None:
        self.do_evict(n)

    @rule()
    def flush(self) -> None:
        evictable = self.cache.evictable_pages
        self.do_evict(evictable)
        assert self.cache.evictable_pages == 0
        assert set(self.ref) == self.locked_prefixes()

    # -- invariants, checked after every step
    @invariant()
    def consistent(self) -> None:
        self.cache.check_invariants()
        held = sum(len(pages) for _, _, pages in self.requests)
        assert self.alloc.num_free + self.cache.evictable_pages + self.cache.protected_pages + held \
            == TOTAL_PAGES
        assert self.tree_map() == self.ref
        assert self.cache.all_locks_released() == (not any(pages for *_, pages in self.locks))  # roots: no-op
        for node, salt, toks, pages in self.locks:  # locked paths stay attached and intact
            assert node.lock_ref >= 1 or not pages
            path: list[int] = []
            while node.parent is not None:
                assert node.parent.children[tuple(node.key[:self.ps])] is node
                path[:0] = node.value
                node = node.parent
            assert path == pages and (not pages or node is self.cache.roots[salt])

    def teardown(self) -> None:
        if not hasattr(self, "cache"):
            return
        for node, *_ in self.locks:
            self.cache.dec_lock_ref(node)
        assert self.cache.all_locks_released()
        self.cache.flush()
        held = sum(len(pages) for _, _, pages in self.requests)
        assert self.cache.total_pages_in_tree == 0 and self.alloc.num_free + held == TOTAL_PAGES


RadixCacheMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestRadixCacheMachine = RadixCacheMachine.TestCase
