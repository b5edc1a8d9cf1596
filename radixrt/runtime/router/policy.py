"""Data-parallel routing policies: which replica gets a request.

Every policy is a plain class: ``select(tokens, loads, session)`` gets the prompt's token ids, the current
load (requests in flight) of each candidate replica by id, and an optional session key, and returns one
replica id. Ray Serve's request router calls it (router/serve_router.py); tests and the simulation
(benchmarks/bench_router.py) call it directly.

- ``cache_aware`` (SGLang's cache-aware router, sgl-router ``policies/cache_aware``): an approximate radix
  tree per replica holds the prompts routed there. When load is balanced, the longest match wins if it
  covers more than ``cache_threshold`` of the prompt, else the least-loaded replica. When load is
  imbalanced (max - min > ``balance_abs_threshold`` and max > ``balance_rel_threshold`` * min), the
  request goes to the longest match *among the near-least-loaded replicas* (load <= min + abs threshold),
  ties to the lighter one, and only without a match above the threshold there to the least-loaded one:
  plain shortest-queue during imbalance threw away all affinity (SGLang PR #32195 fixed the same failure;
  it accepts any match in the window, we keep the threshold so that a shared "You are a" is no affinity).
  A ``session`` key, when given, pins a session to the replica it first went to (until that replica leaves).
- ``round_robin``, ``power_of_two`` (two random candidates, the lighter wins; Mitzenmacher),
  ``consistent_hash`` (a hash ring with virtual nodes over the session key, or the first
  ``hash_prefix_tokens`` tokens when there is none).
"""

from __future__ import annotations

import bisect
import hashlib
import random
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Mapping

from radixrt.runtime.config_check import ROUTER_POLICIES as POLICIES
from radixrt.runtime.router.approx_tree import ApproxTree


class RoutingPolicy(ABC):
    name: str = ""

    @abstractmethod
    def select(self, tokens: list[int], loads: Mapping[str, int], session: str | None = None) -> str:
        """Pick one key of ``loads`` (replica id -> requests in flight) for a prompt of ``tokens``.

        Raises:
            ValueError: ``loads`` is empty (no replica to route to).
        """

    def remove(self, replica: str) -> None:
        """Forget a replica that left (died or scaled down)."""


def _check(loads: Mapping[str, int]) -> list[str]:
    if not loads:
        raise ValueError("loads: no replica is available to route to")
    return sorted(loads)


class CacheAwarePolicy(RoutingPolicy):
    """See the module docstring. Thresholds follow sgl-router's defaults, scaled to small deployments.

    Args:
        cache_threshold: minimum matched share of the prompt (0..1) for affinity when balanced.
        balance_abs_threshold: loads (requests) within this of the minimum count as "near-least-loaded";
            also the absolute spread needed to call the load imbalanced.
        balance_rel_threshold: relative spread (max / min) needed to call the load imbalanced.
        max_tree_tokens: tokens each replica's approximate tree keeps (LRU eviction beyond).
        max_sessions: session keys remembered (LRU).
    """

    name = "cache_aware"

    def __init__(
        self,
        cache_threshold: float = 0.5,
        balance_abs_threshold: int = 4,
        balance_rel_threshold: float = 1.5,
        max_tree_tokens: int = 1 << 18,
        max_sessions: int = 65536,
    ):
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {cache_threshold}")
        if balance_abs_threshold < 0 or balance_rel_threshold < 1.0:
            raise ValueError(
                "balance_abs_threshold must be >= 0 and balance_rel_threshold >= 1, got "
                f"{balance_abs_threshold}, {balance_rel_threshold}"
            )
        self.cache_threshold = cache_threshold
        self.abs_thr, self.rel_thr = balance_abs_threshold, balance_rel_threshold
        self.max_tree_tokens = max_tree_tokens
        self.trees: dict[str, ApproxTree] = {}
        self.sessions: OrderedDict[str, str] = OrderedDict()
        self.max_sessions = max_sessions

    def select(self, tokens: list[int], loads: Mapping[str, int], session: str | None = None) -> str:
        ids = _check(loads)
        pinned = self.sessions.get(session) if session is not None else None
        if pinned in loads:
            choice = pinned
        else:
            choice = self._choose(tokens, ids, loads)
        self._tree(choice).insert(list(tokens))
        if session is not None:
            self.sessions[session] = choice
            self.sessions.move_to_end(session)
            while len(self.sessions) > self.max_sessions:
                self.sessions.popitem(last=False)
        return choice

    def _choose(self, tokens: list[int], ids: list[str], loads: Mapping[str, int]) -> str:
        lo, hi = min(loads.values()), max(loads.values())
        imbalanced = hi - lo > self.abs_thr and hi > lo * self.rel_thr
        match = {r: self._tree(r).match(tokens) for r in ids}
        least = min(ids, key=lambda r: (loads[r], self._tree(r).size))
        if imbalanced:
            ids = [r for r in ids if loads[r] <= lo + self.abs_thr]
        best = max(ids, key=lambda r: (match[r], -loads[r]))
        if tokens and match[best] / len(tokens) > self.cache_threshold:
            return best
        return least

    def _tree(self, replica: str) -> ApproxTree:
        tree = self.trees.get(replica)
        if tree is None:
            tree = self.trees[replica] = ApproxTree(self.max_tree_tokens)
        return tree

    def remove(self, replica: str) -> None:
        self.trees.pop(replica, None)
        for s in [s for s, r in self.sessions.items() if r == replica]:
            del self.sessions[s]


class RoundRobinPolicy(RoutingPolicy):
    name = "round_robin"

    def __init__(self) -> None:
        self.i = 0

    def select(self, tokens, loads, session=None) -> str:
        ids = _check(loads)
        self.i += 1
        return ids[(self.i - 1) % len(ids)]


class PowerOfTwoPolicy(RoutingPolicy):
    """Two candidates drawn at random (seeded), the one with fewer requests in flight wins."""

    name = "power_of_two"

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def select(self, tokens, loads, session=None) -> str:
        ids = _check(loads)
        if len(ids) == 1:
            return ids[0]
        a, b = self.rng.sample(ids, 2)
        return a if loads[a] <= loads[b] else b


class ConsistentHashPolicy(RoutingPolicy):
    """Hash ring (Karger et al. 1997) with ``vnodes`` points per replica, keyed by session or prompt head."""

    name = "consistent_hash"

    def __init__(self, vnodes: int = 64, hash_prefix_tokens: int = 64) -> None:
        self.vnodes, self.hash_prefix_tokens = vnodes, hash_prefix_tokens
        self._ring: list[tuple[int, str]] = []
        self._members: frozenset[str] = frozenset()

    def select(self, tokens, loads, session=None) -> str:
        ids = _check(loads)
        if self._members != frozenset(ids):
            self._ring = sorted((_h(f"{r}#{v}"), r) for r in ids for v in range(self.vnodes))
            self._members = frozenset(ids)
        key = session if session is not None else ",".join(map(str, tokens[: self.hash_prefix_tokens]))
        i = bisect.bisect(self._ring, (_h(key), "")) % len(self._ring)
        return self._ring[i][1]


def _h(s: str) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "big")


def make_policy(name: str, **kw) -> RoutingPolicy:
    """Build a policy by name (one of ``POLICIES``). Raises ValueError on an unknown name."""
    classes = {c.name: c for c in (CacheAwarePolicy, RoundRobinPolicy, PowerOfTwoPolicy, ConsistentHashPolicy)}
    if name not in classes:
        raise ValueError(f"router_policy must be one of {POLICIES}, got {name!r}")
    return classes[name](**kw)
