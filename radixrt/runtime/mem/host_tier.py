"""Tier 2: a bounded host store of KV pages evicted from the pool (SGLang's HiCache host pool, L2).

Each entry is one page, keyed by ``(cache_salt, chained page hash)`` (``page_hash.py``): the hash names
the whole prefix that produced the page's KV, and the salt keeps tenants apart. Its bytes are one row of
a preallocated uint8 buffer ``[num_slots, page_bytes]`` (``page_codec.py``: the pool's exact bytes). The
buffer is ``calloc``'d, so slots take memory once written.

Exclusive with the pool: a page restored into the pool leaves this store (``take``), and a page inserted
into the tree drops its copy here (``discard``), so a page's KV is in the pool or here, never both.

Eviction inside the tier uses the tree's own eviction keys (``--eviction-policy``, GDSF by default): each
entry keeps ``policy.key(node)`` of the node it was evicted from, and the lowest key goes first. The
tree's GDSF inflation is already inside those scores, so the tier adds no aging of its own. Each entry also
keeps the node's hit count, which a restore gives back to the node it re-creates: GDSF and LFU rank a
prefix by its hits, and a prefix that went down a tier and came back must not restart from zero.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

Key = tuple  # (cache_salt: str | None, page hash: int)


@dataclass
class _Entry:
    slot: int
    score: tuple
    seq: int  # the heap item that is current for this entry (older items are stale)
    hits: int = 0  # the hit count of the node the page left


class HostTier:
    """``num_slots`` pages of ``page_bytes`` each. ``on_drop`` is told the score of each entry this tier
    evicts (the tree's policy ages by it: ``eviction.dropped``). Raises ValueError when either size is
    below 1."""

    def __init__(self, num_slots: int, page_bytes: int, on_drop: Callable[[tuple], None] | None = None) -> None:
        if num_slots < 1 or page_bytes < 1:
            raise ValueError(f"hicache_size gives {num_slots} host pages of {page_bytes} bytes; need >= 1")
        self.num_slots, self.page_bytes = num_slots, page_bytes
        self.rows = torch.from_numpy(np.zeros((num_slots, page_bytes), dtype=np.uint8))
        self._free: list[int] = list(range(num_slots - 1, -1, -1))
        self._index: dict[Key, _Entry] = {}
        self._heap: list[tuple[tuple, int, Key]] = []
        self._seq = itertools.count()
        self._taken: set[int] = set()  # slots taken and being copied out (``take`` .. ``release``/``put_back``)
        self._writing: set[int] = set()  # slots reserved and being written (``reserve`` .. ``commit``)
        self.on_drop = on_drop

    @property
    def num_used(self) -> int:
        return len(self._index)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def __contains__(self, key: Key) -> bool:
        return key in self._index

    def slots(self) -> list[tuple[Key, int]]:
        """Every held page as ``(key, slot)``: its row is ``rows[slot]``."""
        return [(k, e.slot) for k, e in self._index.items()]

    def store(
        self, keys: list[Key], scores: list[tuple], rows: torch.Tensor, hits: int = 0, keep_evicted: bool = True
    ) -> list[tuple[Key, torch.Tensor | None]]:
        """Keep ``rows`` (uint8 ``[len(keys), page_bytes]``) under ``keys`` with the node's ``hits``,
        evicting the lowest-scored entries when full. A key already present keeps its bytes (the same
        prefix, the same KV) and takes the higher score and hit count. Returns the evicted ``(key, row)``
        pairs (the disk tier may keep them; without ``keep_evicted`` the rows are None, no copy made).
        ``reserve`` + ``write`` + ``commit`` in one go (store_async.Storer splits them over two threads)."""
        new, spilled = self.reserve(keys, scores, hits)
        evicted = [(k, self.rows[slot].clone() if keep_evicted else None) for k, slot in spilled]
        self.write(new, rows, len(keys))
        self.commit(keys, new, scores, hits)
        return evicted

    def reserve(
        self, keys: list[Key], scores: list[tuple], hits: int = 0
    ) -> tuple[list[tuple[int, int]], list[tuple[Key, int]]]:
        """Take slots for the keys not held yet, evicting the lowest-scored entries when full (keys held
        take the higher score and hits now). Returns ``(new, spilled)``: ``new`` pairs ``(index in keys,
        slot)``, the slots "being written" (neither free nor held) until ``commit``; ``spilled`` the evicted
        ``(key, slot)``: each such slot is one of ``new``'s, so its old row is readable until ``write``."""
        for i, k in enumerate(keys):
            e = self._index.get(k)
            if e is not None and scores[i] > e.score:
                self._push(k, e.slot, scores[i], max(hits, e.hits))
        # the pages of one evicted node come leaf-last; keep the ones nearest the root when space is short
        new = [i for i, k in enumerate(keys) if k not in self._index][: self.num_slots]
        spilled: list[tuple[Key, int]] = []
        while len(self._free) < len(new):
            popped = self._pop_lowest_slot()
            if popped is None:
                break
            spilled.append(popped)
        new = new[: len(self._free)]
        out = [(i, self._free.pop()) for i in new]  # LIFO: the spilled slots (appended last) go first
        self._writing.update(slot for _, slot in out)
        return out, spilled

    def write(self, new: list[tuple[int, int]], rows: torch.Tensor, n_keys: int) -> None:
        """Copy ``rows`` (uint8 ``[n_keys, page_bytes]``) into the slots ``reserve`` gave. Any thread."""
        if not new:
            return
        src = rows if len(new) == n_keys else rows[torch.tensor([i for i, _ in new], dtype=torch.long)]
        self.rows[torch.tensor([s for _, s in new], dtype=torch.long)] = src

    def commit(
        self,
        keys: list[Key],
        new: list[tuple[int, int]],
        scores: list[tuple],
        hits: int = 0,
        skip: set | frozenset = frozenset(),
    ) -> None:
        """Make written slots hold their keys; keys in ``skip`` (back in the pool meanwhile) or held again
        by now free their slot instead."""
        # deepest page first: among equal scores the heap pops the oldest push, so a node's tail goes before
        # its head, and a prefix never loses a page while keeping the ones after it
        for i, slot in reversed(new):
            self._writing.discard(slot)
            if keys[i] in skip or keys[i] in self._index:
                self._free.append(slot)
            else:
                self._push(keys[i], slot, scores[i], hits)

    def _push(self, key: Key, slot: int, score: tuple, hits: int = 0) -> None:
        seq = next(self._seq)
        self._index[key] = _Entry(slot, score, seq, hits)
        heapq.heappush(self._heap, (score, seq, key))

    def _pop_lowest_slot(self) -> tuple[Key, int] | None:
        """Evict the lowest-scored entry: ``(key, slot)``, its slot now free (its row still intact)."""
        while self._heap:
            _, seq, key = heapq.heappop(self._heap)
            e = self._index.get(key)
            if e is not None and e.seq == seq:
                del self._index[key]
                self._free.append(e.slot)
                if self.on_drop is not None:
                    self.on_drop(e.score)
                return key, e.slot
        return None

    def take(self, key: Key) -> tuple[int, tuple, int] | None:
        """Remove ``key``'s entry and return ``(slot, score, hits)``; the slot stays out of the free list
        until ``release`` (the page is being copied). None when absent."""
        e = self._index.pop(key, None)
        if e is None:
            return None
        self._taken.add(e.slot)
        return e.slot, e.score, e.hits

    def put_back(self, key: Key, slot: int, score: tuple, hits: int = 0) -> None:
        """Undo a ``take`` whose copy did not happen."""
        self._taken.discard(slot)
        self._push(key, slot, score, hits)

    def release(self, slots: list[int]) -> None:
        """Free slots whose pages were copied out (after ``take``)."""
        self._taken.difference_update(slots)
        self._free.extend(slots)

    def discard(self, keys: list[Key]) -> int:
        """Drop the entries of ``keys`` (their pages are in the pool again). Returns how many were held."""
        n = 0
        for k in keys:
            e = self._index.pop(k, None)
            if e is not None:
                self._free.append(e.slot)
                n += 1
        return n

    def clear(self) -> int:
        """Drop every entry; returns how many there were."""
        n = len(self._index)
        self._free.extend(e.slot for e in self._index.values())
        self._index.clear()
        self._heap.clear()
        return n

    def check(self) -> None:
        """Raise AssertionError unless every slot is free, held by exactly one entry, or being copied in or
        out."""
        held = [e.slot for e in self._index.values()] + sorted(self._taken) + sorted(self._writing)
        assert len(set(held)) == len(held), "a host slot is held by two entries"
        assert not set(held) & set(self._free), "a host slot is both free and held"
        assert len(set(self._free)) == len(self._free), "a host slot is free twice"
        assert len(held) + len(self._free) == self.num_slots, (
            f"host tier accounting broken: {len(held)} held + {len(self._free)} free != {self.num_slots}"
        )
