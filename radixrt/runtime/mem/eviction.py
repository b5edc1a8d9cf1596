"""Eviction policies of the radix cache: which unlocked leaf goes first when pages run short.

A policy only *scores* nodes; ``RadixCache.evict`` pops the lowest score among unlocked leaves, frees it,
and pushes its parent once that parent became an unlocked leaf (SGLang's leaf-first eviction, Zheng et al.
2024). A policy never decides how much to free, and it cannot pin anything.

Scores must not increase from a node to its descendants (a parent scores >= each child). Every access
touches a node's whole path from the root, so this holds when a score only grows with the node's own
accesses; it makes one ``evict`` call pop nodes in non-decreasing score order.

Policies (``--eviction-policy``):
- ``lru``: last access time (the seed's behaviour and SGLang's default).
- ``lfu``: ``(hit_count, last_access_time)``: fewest hits first, LRU among equals. This is SGLang's
  ``lfu`` (``--radix-eviction-policy lfu``, its ``LFUStrategy``). Counts never decay, so a prefix that was
  hot once stays cached after its traffic has gone.
- ``gdsf``: Greedy-Dual-Size-Frequency (Cherkasova 1998) with the miss cost of a node equal to its size in
  tokens, so cost / size = 1 and the score is ``L + (1 + hit_count)``, taken at the node's last access.
  ``L`` (the *inflation*) is set to the score of each node evicted, so a node that stops being used falls
  below newer ones once ``L`` has grown past its score: LFU with dynamic aging. Per page freed, a node's
  value is the tokens it saves per page (hits), which is why size does not appear otherwise.

The default is ``gdsf``: replayed through the tree at six cache sizes on agent traces with churn, a
phase-shift trace and the benchmark suite's five workloads (``benchmarks/bench_eviction.py``), it was never
below LRU's hit rate and up to 10.8 points above it (multi-turn chat); ``lfu`` gained more on some traces
but fell 1.1 points below LRU when the hot prompts changed (its counts never decay).

Hits (``TreeNode.hit_count``) count the admissions whose matched prefix passed through the node
(``match_prefix(..., hit=True)``); scheduler look-ups for ordering do not count.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol


class TreeNode(Protocol):
    """What a policy reads and writes on ``radix_cache.TreeNode`` (not imported: the cache imports us)."""

    last_access_time: float
    hit_count: int
    score: float


class EvictionPolicy(ABC):
    """Scores nodes for eviction; the lowest ``key`` goes first. One instance per cache (``gdsf`` keeps
    its inflation value)."""

    name: str = ""

    def touch(self, node: TreeNode, now: float, hit: bool) -> None:
        """Record an access at logical time ``now`` (a match with ``hit=True`` counts a hit)."""
        node.last_access_time = now
        if hit:
            node.hit_count += 1

    @abstractmethod
    def key(self, node: TreeNode) -> tuple[float, ...]:
        """Eviction order: lower first. Ties are broken by node id in the cache."""

    def evicted(self, node: TreeNode) -> None:
        """Called for each node as it is evicted (and its pages leave the cache)."""

    def dropped(self, key: tuple[float, ...]) -> None:
        """A page whose node had eviction ``key`` left the last cache tier under the tree (mem/hicache.py):
        the same event as ``evicted`` for a cache whose pages spill to a lower tier first."""


class LRU(EvictionPolicy):
    name = "lru"

    def key(self, node: TreeNode) -> tuple[float, ...]:
        return (node.last_access_time,)


class LFU(EvictionPolicy):
    name = "lfu"

    def key(self, node: TreeNode) -> tuple[float, ...]:
        return (node.hit_count, node.last_access_time)


class GDSF(EvictionPolicy):
    name = "gdsf"

    def __init__(self) -> None:
        self.inflation = 0.0  # L: the score of the last node evicted (never decreases)

    def touch(self, node: TreeNode, now: float, hit: bool) -> None:
        super().touch(node, now, hit)
        node.score = self.inflation + 1 + node.hit_count

    def key(self, node: TreeNode) -> tuple[float, ...]:
        return (node.score, node.last_access_time)

    def evicted(self, node: TreeNode) -> None:
        self.inflation = max(self.inflation, node.score)

    def dropped(self, key: tuple[float, ...]) -> None:
        # with tiers, L ages the whole hierarchy: it rises when a prefix leaves the cache, not when it
        # moves down a tier (a small pool evicts every request; aging on that would make GDSF an LRU)
        self.inflation = max(self.inflation, key[0])


POLICIES: dict[str, type[EvictionPolicy]] = {p.name: p for p in (LRU, LFU, GDSF)}
DEFAULT_POLICY = "gdsf"  # see the module docstring for the measurement


def make_policy(name: str) -> EvictionPolicy:
    """A fresh policy by name. Raises ValueError naming ``eviction_policy`` on an unknown name."""
    if name not in POLICIES:
        raise ValueError(f"eviction_policy must be one of {tuple(POLICIES)}, got {name!r}")
    return POLICIES[name]()
