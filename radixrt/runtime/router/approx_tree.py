"""Approximate radix tree of the token prefixes a router has sent to one replica.

The router cannot see a replica's real KV cache, so it keeps its own guess: every prompt routed to a
replica is inserted here, and the longest match tells how much of a new prompt that replica probably still
has cached. Old entries are evicted least-recently-used first once the tree holds more than
``max_tokens`` tokens, mirroring (roughly) what the replica's own radix cache evicts under memory pressure.
This is the idea of SGLang's cache-aware router (sgl-router ``policies/cache_aware``, an approximate tree
per worker), here at token granularity and one tree per replica.
"""

from __future__ import annotations

import heapq
import itertools


class _Node:
    __slots__ = ("children", "parent", "key", "last_access", "id")
    _ids = itertools.count()

    def __init__(self, key: tuple[int, ...], parent: "_Node | None", now: int) -> None:
        self.children: dict[int, _Node] = {}  # first token of the child's key -> child
        self.parent = parent
        self.key = key  # token ids on the edge into this node
        self.last_access = now  # logical clock; a parent is never older than a child
        self.id = next(_Node._ids)


class ApproxTree:
    """Token-level radix tree with LRU eviction by size.

    Args:
        max_tokens: tokens the tree may hold after an ``insert``; older leaves are cut first.

    Raises:
        ValueError: ``max_tokens`` < 1.
    """

    def __init__(self, max_tokens: int = 1 << 20) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self.root = _Node((), None, 0)
        self.size = 0  # tokens held (sum of edge lengths)
        self._clock = 0

    def match(self, tokens: list[int]) -> int:
        """Length in tokens of the longest prefix of ``tokens`` held; touches the matched path."""
        self._clock += 1
        node, pos = self.root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            n = _common(child.key, tokens, pos)
            child.last_access = self._clock
            pos += n
            if n < len(child.key):
                break
            node = child
        return pos

    def insert(self, tokens: list[int]) -> None:
        """Add ``tokens`` as a path, then evict LRU leaves until ``size <= max_tokens``."""
        self._clock += 1
        now, node, pos = self._clock, self.root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                leaf = _Node(tuple(tokens[pos:]), node, now)
                node.children[tokens[pos]] = leaf
                self.size += len(leaf.key)
                break
            n = _common(child.key, tokens, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            node, pos = child, pos + n
        if self.size > self.max_tokens:
            self.evict(self.size - self.max_tokens)

    def evict(self, num_tokens: int) -> int:
        """Remove whole leaves, least recently used first, until ``num_tokens`` are gone. Returns tokens removed."""
        heap = [(n.last_access, n.id, n) for n in self._nodes() if not n.children]
        heapq.heapify(heap)
        removed = 0
        while removed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.key[0]]
            removed += len(leaf.key)
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        self.size -= removed
        return removed

    def _split(self, node: _Node, n: int) -> _Node:
        upper = _Node(node.key[:n], node.parent, node.last_access)
        node.parent.children[node.key[0]] = upper
        node.key, node.parent = node.key[n:], upper
        upper.children[node.key[0]] = node
        return upper

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())


def _common(key: tuple[int, ...], tokens: list[int], start: int) -> int:
    """Number of leading tokens ``key`` shares with ``tokens[start:]``."""
    limit = min(len(key), len(tokens) - start)
    i = 0
    while i < limit and key[i] == tokens[start + i]:
        i += 1
    return i
