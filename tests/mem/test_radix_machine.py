"""RadixCache against a naive reference model: a hypothesis state machine, run once per eviction policy.
The reference tracks every cached page-aligned prefix, its last access time and its hit count. CPU only."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from radixrt.runtime.mem.allocator import PageAllocator
from radixrt.runtime.mem.eviction import POLICIES
from radixrt.runtime.mem.radix_cache import RadixCache, TreeNode

Prefix = tuple[str | None, tuple[int, ...]]  # (salt, page-aligned token prefix)

TOTAL_PAGES = 24
keys = st.lists(st.integers(0, 2), max_size=10)
salts = st.sampled_from([None, "s"])


class RadixCacheMachine(RuleBasedStateMachine):
    inserted = Bundle("inserted")  # (key, salt) pairs that went into the tree, so lookups hit often

    """Reference: ``ref`` maps every cached page-aligned prefix to the page id of its last page, ``times``
    to the logical time it was last touched and ``hits`` to the admissions that matched through it (all
    pages in one node share a time and a hit count)."""

    def __init__(self, policy: str = "lru") -> None:
        super().__init__()
        self.policy = policy

    @initialize(ps=st.sampled_from([1, 2, 4]))
    def setup(self, ps: int) -> None:
        self.ps = ps
        self.alloc = PageAllocator(TOTAL_PAGES)
        self.cache = RadixCache(ps, self.alloc, self.policy)
        self.ref: dict[Prefix, int] = {}
        self.times: dict[Prefix, int] = {}
        self.hits: dict[Prefix, int] = {}
        self.clock = 0
        self.locks: list[tuple[TreeNode, str | None, tuple[int, ...], list[int]]] = []
        self.requests: list[tuple[list[int], str | None, list[int]]] = []  # privately held pages

    # -- reference helpers
    def prefixes(self, key: list[int], salt: str | None) -> list[Prefix]:
        return [(salt, tuple(key[: k * self.ps])) for k in range(1, len(key) // self.ps + 1)]

    def ref_match(self, key: list[int], salt: str | None) -> list[int]:
        pages = []
        for p in self.prefixes(key, salt):
            if p not in self.ref:
                break
            pages.append(self.ref[p])
        return pages

    def locked_prefixes(self) -> set[Prefix]:
        return {p for _, salt, toks, _ in self.locks for p in self.prefixes(list(toks), salt)}

    def tree_nodes(self) -> dict[Prefix, TreeNode]:
        """Every cached prefix -> the tree node holding its last page."""
        out: dict[Prefix, TreeNode] = {}
        for salt, root in self.cache.roots.items():
            stack: list[tuple[TreeNode, tuple[int, ...]]] = [(root, ())]
            while stack:
                node, toks = stack.pop()
                for i in range(len(node.value)):
                    out[(salt, toks + tuple(node.key[: (i + 1) * self.ps]))] = node
                toks = toks + tuple(node.key)
                stack.extend((c, toks) for c in node.children.values())
        return out

    def tree_map(self) -> dict[Prefix, int]:
        out: dict[Prefix, int] = {}
        for (salt, toks), node in self.tree_nodes().items():
            out[(salt, toks)] = node.value[len(toks) // self.ps - 1 - self.depth_pages(node)]
        return out

    def depth_pages(self, node: TreeNode) -> int:
        """Pages above ``node`` on its path."""
        n, node = 0, node.parent
        while node is not None:
            n += len(node.value)
            node = node.parent
        return n

    def do_match(self, key: list[int], salt: str | None, hit: bool = False) -> tuple[TreeNode, list[int]]:
        expected = self.ref_match(key, salt)
        res = self.cache.match_prefix(key, salt, hit=hit)
        assert res.pages == expected
        self.clock += 1
        for p in self.prefixes(key, salt)[: len(expected)]:
            self.times[p] = self.clock
            self.hits[p] += hit
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
            self.hits.setdefault(p, 0)

    def do_evict(self, n: int) -> None:
        free_before, evictable_before = self.alloc.num_free, self.cache.evictable_pages
        scores = {p: self.cache.policy.key(node) for p, node in self.tree_nodes().items()}
        got = self.cache.evict(n)
        now = self.tree_map()
        assert now.items() <= self.ref.items()
        gone = self.ref.keys() - now.keys()
        assert got == len(gone) == self.alloc.num_free - free_before
        assert got >= min(n, evictable_before) and (got >= n or self.cache.evictable_pages == 0)
        locked = self.locked_prefixes()
        assert not gone & locked, "a locked path was evicted"
        parents = {(salt, toks[: -self.ps]) for salt, toks in now}
        leaves = [p for p in now if p not in parents and p not in locked]
        if gone and leaves and self.policy == "lru":  # nothing evicted is newer than a surviving evictable leaf
            assert max(self.times[p] for p in gone) <= min(self.times[p] for p in leaves)
        if gone and leaves:  # any policy: nothing evicted scores above a surviving evictable leaf
            assert max(scores[p] for p in gone) <= min(scores[p] for p in leaves)
        for p in gone:
            del self.ref[p], self.times[p], self.hits[p]

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
    def admit_known(self, known: tuple[list[int], str | None], cut: int, tail: list[int]) -> None:
        """A match that counts as a hit (an admission), as the scheduler's admit does."""
        self.do_match(known[0][:cut] + tail, known[1], hit=True)

    @rule(known=inserted, cut=st.integers(0, 10), tail=keys)
    def lock(self, known: tuple[list[int], str | None], cut: int, tail: list[int]) -> None:
        key, salt = known[0][:cut] + tail, known[1]
        node, pages = self.do_match(key, salt)
        self.cache.inc_lock_ref(node)
        self.locks.append((node, salt, tuple(key[: len(pages) * self.ps]), pages))

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
        assert self.alloc.num_free + self.cache.evictable_pages + self.cache.protected_pages + held == TOTAL_PAGES
        assert self.tree_map() == self.ref
        nodes = self.tree_nodes()
        assert {p: n.hit_count for p, n in nodes.items()} == self.hits
        assert self.cache.all_locks_released() == (not any(pages for *_, pages in self.locks))  # roots: no-op
        for node, salt, toks, pages in self.locks:  # locked paths stay attached and intact
            assert node.lock_ref >= 1 or not pages
            path: list[int] = []
            while node.parent is not None:
                assert node.parent.children[tuple(node.key[: self.ps])] is node
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


@pytest.mark.parametrize("policy", list(POLICIES))
def test_radix_cache_machine(policy: str) -> None:
    run_state_machine_as_test(
        lambda: RadixCacheMachine(policy), settings=settings(max_examples=200, stateful_step_count=40, deadline=None)
    )
