"""Page-level radix tree of cached KV pages: the prefix cache (in the spirit of SGLang's RadixCache).

Units: a *key* is a list of token ids; a *value* is a list of page ids, one page id per ``page_size``
tokens. Sizes called ``*_pages`` count pages; lengths returned by ``insert`` count tokens.

Invariants (``check_invariants`` verifies them):
  1. The tree is the only owner of the pages it holds. A page id appears at most once in the tree; the
     tree gives a page back to the allocator only when it evicts the node holding it.
  2. Every non-root node has a non-empty key cut to whole pages: ``len(key) == len(value) * page_size``.
     A node sits in ``parent.children`` under the first page of its key (a tuple of page_size tokens).
  3. ``evictable_pages`` = pages of nodes with ``lock_ref == 0``; ``protected_pages`` = pages of nodes
     with ``lock_ref > 0``. Both are kept incrementally. With pages held by running requests outside the
     tree counted by the caller: ``allocator.num_free + evictable + protected + held_outside == total``.
  4. Locks walk from a node to its root, so a parent's ``lock_ref`` >= the sum of its children's. A node
     with ``lock_ref > 0`` (hence every ancestor of one) is never evicted. Roots are never counted or
     locked. Every ``lock_ref`` returns to 0 once all users have unlocked.
  5. A parent's ``last_access_time`` and ``hit_count`` are >= each child's (touching a node touches its
     whole path), so a parent's eviction score is >= its children's (see ``eviction.py``) and leaf-first
     eviction pops nodes in non-decreasing score order.
  6. ``cache_salt`` namespaces keys: one root per salt (``None`` is the default root); different salts
     never share nodes or pages.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar, Protocol

from radixrt.runtime.mem.allocator import PageAllocator
from radixrt.runtime.mem.eviction import DEFAULT_POLICY, EvictionPolicy, make_policy
from radixrt.runtime.mem.tree_check import check_tree

HELD = "held"  # LowerTier.on_evict's answer when it keeps the evicted pages out of the free list until their copy lands


class TreeNode:
    """One edge of the radix tree: ``key`` tokens whose KV lives in the ``value`` pages."""

    __slots__ = ("children", "parent", "key", "value", "lock_ref", "last_access_time", "hit_count", "score", "id")
    _ids: ClassVar[Iterator[int]] = itertools.count()

    def __init__(
        self,
        key: list[int],
        value: list[int],
        parent: TreeNode | None,
        lock_ref: int = 0,
        last_access_time: float = 0.0,
        hit_count: int = 0,
        score: float = 0.0,
    ) -> None:
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.parent: TreeNode | None = parent  # None only for roots
        self.key: list[int] = key  # token ids, a multiple of page_size long
        self.value: list[int] = value  # page ids, len(key) // page_size of them
        self.lock_ref: int = lock_ref  # number of users holding this node (or a descendant)
        self.last_access_time: float = last_access_time  # logical clock ticks, see RadixCache._clock
        self.hit_count: int = hit_count  # admissions whose match passed through this node
        self.score: float = score  # policy-owned (gdsf: its priority at the last access)
        self.id: int = next(TreeNode._ids)  # stable, unique: heap tie-break

    def __repr__(self) -> str:
        return (
            f"TreeNode(id={self.id}, tokens={len(self.key)}, pages={self.value}, "
            f"lock_ref={self.lock_ref}, t={self.last_access_time}, hits={self.hit_count})"
        )


@dataclass
class MatchResult:
    """``pages``: page ids of the matched prefix (matched tokens = len(pages) * page_size).
    ``last_node``: the node ending exactly at the matched prefix (a root on an empty match)."""

    pages: list[int]
    last_node: TreeNode


class LowerTier(Protocol):
    """What the tree asks of the tiers under it (mem/hicache.py's ``HiCache``)."""

    def on_evict(self, leaf: TreeNode) -> bool | str:
        """Called with each leaf as ``evict()`` removes it, before its pages are freed. True: the pages
        were copied to a lower tier, so the policy is not told (the prefix is still cached; the tier tells
        it when the pages leave for good). False: simply freed. HELD: kept, and the tier now owns the
        pages (it frees them once their copy has landed: mem/store_async.py)."""
        ...


class RadixCache:
    """``policy``: an eviction policy name (``eviction.POLICIES``) or instance. ``lower_tier``: builds the
    tiers under this tree from it (``tree -> LowerTier``), last in construction, kept as ``lower_tier``;
    None: evicted pages are simply freed. Raises ValueError on an unknown name or a page_size below 1."""

    def __init__(
        self,
        page_size: int,
        allocator: PageAllocator,
        policy: str | EvictionPolicy = DEFAULT_POLICY,
        lower_tier: Callable[[RadixCache], LowerTier] | None = None,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size ({page_size}) must be >= 1")
        self.page_size = page_size
        self.allocator = allocator
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self._roots: dict[str | None, TreeNode] = {None: TreeNode([], [], None)}
        self._evictable = 0  # pages in nodes with lock_ref == 0
        self._protected = 0  # pages in nodes with lock_ref > 0
        self._clock = 0.0  # logical time: +1 per match_prefix / insert call
        # last: the tier reads the tree (page_size, policy, roots) as it is built
        self.lower_tier: LowerTier | None = lower_tier(self) if lower_tier is not None else None
        # with a lower tier, evict only the pages asked for: the last leaf popped is split and its tail goes
        # (whole-leaf eviction would leave up to a leaf of pool pages free instead of cached)
        self.evict_partial = self.lower_tier is not None

    # ----------------------------------------------------------------------------- sizes
    @property
    def evictable_pages(self) -> int:
        """Pages in unlocked nodes (evict() can free them). O(1)."""
        return self._evictable

    @property
    def protected_pages(self) -> int:
        """Pages in locked nodes (in use by running requests). O(1)."""
        return self._protected

    @property
    def clock(self) -> float:
        """The logical time of the last match_prefix / insert (the ticks ``last_access_time`` counts)."""
        return self._clock

    @property
    def total_pages_in_tree(self) -> int:
        return self._evictable + self._protected

    @property
    def root_node(self) -> TreeNode:
        """The default (salt ``None``) root."""
        return self._roots[None]

    @property
    def roots(self) -> Mapping[str | None, TreeNode]:
        """Read-only view salt -> root (salted roots appear on insert, go away when emptied by evict)."""
        return MappingProxyType(self._roots)

    # ----------------------------------------------------------------------------- lookup / insert
    def match_prefix(self, key: list[int], salt: str | None = None, hit: bool = False) -> MatchResult:
        """Longest cached prefix of ``key`` (cut down to whole pages). Splits the last node at the page
        boundary so ``last_node`` covers exactly the match, and touches every node on the path; ``hit``
        (an admission, not a look-up) also counts a hit on each. Cost: O(matched tokens + path nodes)."""
        ps = self.page_size
        n = len(key) // ps * ps
        key = list(key[:n])
        node = self._roots.get(salt)
        if node is None:  # unknown salt: an empty, unregistered root (locking a root is a no-op)
            return MatchResult([], TreeNode([], [], None))
        self._clock += 1
        now = self._clock
        pages: list[int] = []
        pos = 0
        while pos < n:
            child = node.children.get(tuple(key[pos : pos + ps]))
            if child is None:
                break
            m = self._matched_pages(key, pos, child.key)
            if m < len(child.value):
                child = self._split(child, m)
            self.policy.touch(child, now, hit)
            pages.extend(child.value)
            node = child
            pos += m * ps
        return MatchResult(pages, node)

    def insert(self, key: list[int], pages: list[int], salt: str | None = None) -> int:
        """Cache ``key`` (cut down to whole pages) whose KV lives in ``pages``.

        Returns how many leading tokens were already present. The tree keeps its own pages for that
        range, so the caller still owns (and must free) ``pages[:returned // page_size]``; the tree takes
        ownership of the rest. Raises ValueError unless the cut key has ``len(pages) * page_size`` tokens.
        """
        ps = self.page_size
        n = len(key) // ps * ps
        if n != len(pages) * ps:
            raise ValueError(f"key has {n} page-aligned tokens but {len(pages)} pages x {ps} were given")
        if n == 0:
            return 0
        key = list(key[:n])
        node = self._roots.get(salt)
        if node is None:
            node = self._roots[salt] = TreeNode([], [], None)
        self._clock += 1
        now = self._clock
        pos = 0
        while pos < n:
            first = tuple(key[pos : pos + ps])
            child = node.children.get(first)
            if child is None:
                leaf = TreeNode(key[pos:], list(pages[pos // ps :]), node)
                self.policy.touch(leaf, now, False)
                node.children[first] = leaf
                self._evictable += len(leaf.value)
                return pos
            m = self._matched_pages(key, pos, child.key)
            if m < len(child.value):
                child = self._split(child, m)
            self.policy.touch(child, now, False)
            node = child
            pos += m * ps
        return n

    def _matched_pages(self, key: list[int], start: int, node_key: list[int]) -> int:
        """Whole pages of ``node_key`` equal to ``key[start:]`` (both are page multiples)."""
        if key[start : start + len(node_key)] == node_key:  # fast path: whole node matches
            return len(node_key) // self.page_size
        limit = min(len(key) - start, len(node_key))
        i = 0
        while i < limit and key[start + i] == node_key[i]:
            i += 1
        return i // self.page_size

    def _split(self, node: TreeNode, num_pages: int) -> TreeNode:
        """Cut ``node`` after its first ``num_pages`` pages (0 < num_pages < len(value)). Returns the new
        upper node, which inherits lock_ref and the policy's state, so counters and scores are unchanged."""
        parent = node.parent
        assert parent is not None and 0 < num_pages < len(node.value)
        cut = num_pages * self.page_size
        upper = TreeNode(
            node.key[:cut],
            node.value[:num_pages],
            parent,
            node.lock_ref,
            node.last_access_time,
            node.hit_count,
            node.score,
        )
        node.key, node.value, node.parent = node.key[cut:], node.value[num_pages:], upper
        upper.children[tuple(node.key[: self.page_size])] = node
        parent.children[tuple(upper.key[: self.page_size])] = upper
        return upper

    # ----------------------------------------------------------------------------- locking
    def _is_attached(self, node: TreeNode) -> bool:
        parent = node.parent
        return parent is None or parent.children.get(tuple(node.key[: self.page_size])) is node

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Protect ``node`` and its ancestors from eviction. No-op on a root. O(depth)."""
        if not self._is_attached(node):
            raise ValueError(f"{node!r} is no longer in the tree (evicted before it was locked)")
        while node.parent is not None:
            if node.lock_ref == 0:
                self._evictable -= len(node.value)
                self._protected += len(node.value)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Undo one ``inc_lock_ref(node)``. Raises ValueError if the lock count would go below 0."""
        if node.parent is not None and node.lock_ref <= 0:
            raise ValueError(f"dec_lock_ref below zero on {node!r}")
        while node.parent is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._protected -= len(node.value)
                self._evictable += len(node.value)
            node = node.parent

    # ----------------------------------------------------------------------------- eviction
    def nodes(self) -> Iterator[TreeNode]:
        """Every non-root node, all salts."""
        stack = [c for root in self._roots.values() for c in root.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def evict(self, num_pages: int) -> int:
        """Free at least ``num_pages`` pages (whole leaves, lowest ``policy.key`` first; with
        ``evict_partial`` exactly ``num_pages``, the last leaf split) or every evictable page if there are
        fewer. Returns the number of pages given back to the allocator. O(tree)."""
        if num_pages <= 0 or self._evictable == 0:
            return 0
        key = self.policy.key
        heap = [(key(n), n.id, n) for n in self.nodes() if not n.children and n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_pages and heap:
            _, _, leaf = heapq.heappop(heap)
            need = num_pages - freed
            if self.evict_partial and len(leaf.value) > need:
                self._split(leaf, len(leaf.value) - need)  # ``leaf`` keeps the tail: it goes, its head stays
            parent = leaf.parent
            assert parent is not None
            kept = self.lower_tier.on_evict(leaf) if self.lower_tier is not None else False
            del parent.children[tuple(leaf.key[: self.page_size])]
            if kept is not HELD:
                self.allocator.free(leaf.value)
            if not kept:
                self.policy.evicted(leaf)
            freed += len(leaf.value)
            self._evictable -= len(leaf.value)
            if parent.parent is not None and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (key(parent), parent.id, parent))
        for salt in [s for s, r in self._roots.items() if s is not None and not r.children]:
            del self._roots[salt]  # an emptied salted root: drop it so salts don't accumulate
        return freed

    def flush(self) -> int:
        """Free every unlocked page; returns pages freed (== evictable_pages before the call)."""
        return self.evict(self._evictable)

    # ----------------------------------------------------------------------------- checks
    def all_locks_released(self) -> bool:
        return all(n.lock_ref == 0 for n in self.nodes())

    def check_invariants(self) -> None:
        """Walk the whole tree and raise AssertionError naming the first broken invariant."""
        check_tree(self)
