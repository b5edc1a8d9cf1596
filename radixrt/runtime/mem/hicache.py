"""The cache tiers under the radix tree (SGLang's HiCache): pool (tier 1), host store (tier 2,
``host_tier.py``), files (tier 3, ``disk_tier.py``).

Hooks (the tree and ``ReqPages`` call them; the logic is all here):
  ``on_evict(leaf)``   the tree evicts a leaf: its pages' bytes go to tier 2 (one copy out of the pool),
                       keyed by ``(cache_salt, chained page hash)`` and scored by the tree's eviction key.
  ``restore(key, salt)`` before an admission's ``match_prefix``: the pages that follow the tree's match
                       and are found in tier 2 (then tier 3) are copied into fresh pool pages and inserted
                       into the tree, so the match that follows covers them (no recompute). The
                       scheduler does the same off its step (``restore_async.Restorer``); this
                       synchronous form serves ``radixrt profile``'s replay.
  ``inserted(key, salt, first, pages)`` after a tree insert: tier 2 drops its copies of those pages (a page
                       is in the pool or in tier 2, never both) and, under ``write_through``, tier 3 gets
                       them at once (a restart keeps them).
Where the tree keeps pool pages, the tiers are keyed by the chained page hash, which the tree's keys
determine: the hash of a prefix is the pointer into tiers 2 and 3, and tier 3 needs it to outlive the tree.

Write policies (``--hicache-write-policy``, SGLang's names) decide when tier 3 is written:
``write_through`` when a page enters the tree; ``write_back`` when it leaves tier 2 (cheaper; pages
still in tiers 1-2 at a crash are lost). Tier 2 is always filled on eviction: on the CPU the pool is host
memory, so a second host copy of live pages would hold nothing more.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

from radixrt.runtime.mem.disk_tier import DiskTier
from radixrt.runtime.mem.hicache_stats import check_tiers, tier_stats
from radixrt.runtime.mem.host_tier import HostTier
from radixrt.runtime.mem.page_codec import PageCodec
from radixrt.runtime.mem.page_hash import page_hashes
from radixrt.runtime.mem.prefetch import Prefetcher
from radixrt.runtime.mem.radix_cache import HELD
from radixrt.runtime.mem.restore_async import Restorer
from radixrt.runtime.mem.store_async import Storer

logger = logging.getLogger(__name__)
WRITE_POLICIES = ("write_through", "write_back")


class HiCache:
    """Args:
        tree: the ``RadixCache`` being built (``RadixCache(lower_tier=...)`` calls ``on_evict``).
        codec: a ``PageCodec`` over the pool.
        allocate: ``ReqPages.allocate`` (pool pages, evicting if short; None when impossible).
        host: tier 2, built with ``on_drop=tree.policy.dropped``; disk: tier 3 or None.
        copy_threads: restores (``restorer``, mem/restore_async.py) and stores (``storer``,
            mem/store_async.py) run on copy threads while requests step (the scheduler); False: both run
            on the caller's thread (``restore``, ``on_evict``).
        prefetch: tier-3 reads for queued requests (``prefetcher``); a replay has no queue to read ahead of.

    Raises ValueError on an unknown ``write_policy``.
    """

    def __init__(
        self,
        tree,
        codec: PageCodec,
        allocate: Callable[[int], list[int] | None],
        host: HostTier,
        disk: DiskTier | None = None,
        write_policy: str = "write_through",
        prefetch_threshold: int = 256,
        copy_threads: bool = False,
        prefetch: bool = True,
    ) -> None:
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"hicache_write_policy must be one of {WRITE_POLICIES}, got {write_policy!r}")
        self.tree, self.codec, self.allocate, self.host, self.disk = tree, codec, allocate, host, disk
        self.write_policy = write_policy
        self.ps = tree.page_size
        self._suspended = False  # during flush: evicted pages are dropped, not stored
        # during a restore's allocation: evicted pages wait here until the restored rows have left their
        # tier-2 slots (a spill must not evict tier-2 entries for room those slots are about to give back)
        self.deferred: list[tuple[list, list, torch.Tensor, int]] | None = None
        self.defer_pages = False  # in ``deferring()``: deferred gets page ids, not rows
        self.host_hit_tokens = self.disk_hit_tokens = 0
        self.stored_pages = self.loaded_pages = self.host_evicted_pages = 0
        self.store_seconds = self.load_seconds = 0.0
        self.prefetcher = Prefetcher(disk) if disk is not None and prefetch else None
        self.prefetch_min_pages = max(1, prefetch_threshold // self.ps)
        self.prefetched_pages = 0
        self.store_async = False  # in ``holding(True)``: evicted pages are held, stored by the thread
        # admissions restore on a copy thread while other requests step, and evicted pages reach tier 2 on another
        self.restorer = Restorer(self) if copy_threads else None
        self.storer = Storer(self) if copy_threads else None

    # ---- tree walking --------------------------------------------------------------------------
    def _path(self, node) -> tuple[list[int], str | None]:
        """The whole key from the root to ``node`` and its root's salt."""
        parts = []
        while node.parent is not None:
            parts.append(node.key)
            node = node.parent
        salt = next((s for s, r in self.tree.roots.items() if r is node), None)
        return [t for part in reversed(parts) for t in part], salt

    # ---- hooks ---------------------------------------------------------------------------------
    def on_evict(self, leaf) -> bool | str:
        """Copy an evicted leaf's pages to tier 2 (before the tree frees them). Returns True when kept, HELD
        when the store copy thread took the pages (they are freed once copied)."""
        if self._suspended:
            return False
        t0 = time.perf_counter()
        key, salt = self._path(leaf)
        hashes = page_hashes(key, self.ps)[-len(leaf.value) :]
        keys = [(salt, h) for h in hashes]
        scores = [self.tree.policy.key(leaf)] * len(keys)
        if self.store_async and self.storer is not None and self.deferred is None:
            self.storer.begin(keys, scores, leaf.hit_count, pages=list(leaf.value))
            return HELD
        # a copy-thread restore's allocation: keep the page ids; pages the job takes are packed on its thread
        rows = list(leaf.value) if self.defer_pages else self.codec.pack(leaf.value)
        if self.deferred is not None:
            self.deferred.append((keys, scores, rows, leaf.hit_count))
        else:
            self.store_rows(keys, scores, rows, leaf.hit_count)
        self.store_seconds += time.perf_counter() - t0
        return True

    def store_rows(self, keys: list, scores: list, rows: torch.Tensor, hits: int) -> None:
        """Put packed pages ``rows`` (``[len(keys), page_bytes]`` uint8) into tier 2 under ``keys`` with their
        eviction ``scores`` and ``hits``; under ``write_back`` the pages tier 2 spills go to tier 3."""
        back = self.disk is not None and self.write_policy == "write_back"
        spilled = self.host.store(keys, scores, rows, hits, keep_evicted=back)
        self.stored_pages += len(keys)
        self.host_evicted_pages += len(spilled)
        if back:
            for (s, h), row in spilled:
                self.disk.write(s, h, row.numpy().tobytes())

    @contextmanager
    def holding(self, hold: bool) -> Iterator[None]:
        """Evictions inside go to the store thread when ``hold`` (``ReqPages.allocate(wait=False)``)."""
        self.store_async = hold
        try:
            yield
        finally:
            self.store_async = False

    @contextmanager
    def deferring(self) -> Iterator[list]:
        """Evictions inside wait, as page ids, in the list yielded (``restore_async.Restorer.begin``)."""
        self.deferred, self.defer_pages = [], True
        try:
            yield self.deferred
        finally:
            self.deferred, self.defer_pages = None, False

    def _store_deferred(self) -> None:
        deferred, self.deferred = self.deferred or [], None
        for item in deferred:
            self.store_rows(*item)

    def inserted(self, key: list[int], salt: str | None, first: int, pages: list[int]) -> None:
        """Pages ``first..first+len(pages)`` of ``key`` just entered the tree as ``pages``."""
        if not pages:
            return
        hashes = page_hashes(key[: (first + len(pages)) * self.ps], self.ps)[first:]
        self.in_pool([(salt, h) for h in hashes])
        if self.disk is not None and self.write_policy == "write_through":
            todo = [(i, h) for i, h in enumerate(hashes) if (salt, h) not in self.disk]
            if todo:
                rows = self.codec.pack([pages[i] for i, _ in todo]).numpy()
                for (_, h), row in zip(todo, rows):
                    self.disk.write(salt, h, row.tobytes())

    def in_pool(self, keys: list[tuple]) -> None:
        """``keys`` are pool pages of the tree again: tier 2 (and any store in flight) lets them go."""
        self.host.discard(keys)
        if self.storer is not None:
            self.storer.discard(keys)

    def restore(self, key: list[int], salt: str | None) -> int:
        """Load the pages of ``key`` that follow the tree's match from tiers 2 and 3 into the pool and the
        tree. Returns tokens restored (0 when none, or when the pool cannot make room)."""
        n_pages = len(key) // self.ps
        self.drain_prefetched()
        m = self.tree.match_prefix(key, salt)
        start = len(m.pages)
        if start >= n_pages or not (self.host.num_used or self.disk is not None):
            return 0
        t0 = time.perf_counter()
        hashes = page_hashes(key[: n_pages * self.ps], self.ps)
        taken: list[tuple[int, tuple, int, tuple, int]] = []  # (index in the run, key, slot, score, hits)
        from_disk: list[tuple[int, bytes]] = []  # (index in the run, row)
        for i in range(start, n_pages):
            k = (salt, hashes[i])
            got = self.host.take(k)
            if got is not None:
                taken.append((i - start, k, *got))
                continue
            row = self.disk.read(salt, hashes[i]) if self.disk is not None else None
            if row is None:
                break
            from_disk.append((i - start, row))
        n = len(taken) + len(from_disk)
        if n == 0:
            return 0
        self.tree.inc_lock_ref(m.last_node)  # the matched part must survive the allocation below
        self.deferred = []
        try:
            pages = self.allocate(n)
            if pages is None:
                for _, k, slot, score, hits in taken:
                    self.host.put_back(k, slot, score, hits)
                return 0
            if taken:
                slots = [t[2] for t in taken]
                self.codec.unpack([pages[t[0]] for t in taken], self.host.rows[torch.tensor(slots, dtype=torch.long)])
                self.host.release(slots)
        finally:
            self.tree.dec_lock_ref(m.last_node)
            self._store_deferred()
        if from_disk:
            rows = torch.frombuffer(bytearray(b"".join(r for _, r in from_disk)), dtype=torch.uint8)
            self.codec.unpack([pages[i] for i, _ in from_disk], rows.view(len(from_disk), -1))
        end = (start + n) * self.ps
        present = self.tree.insert(key[:end], m.pages + pages, salt)
        assert present == start * self.ps, "restored pages must extend the match"
        if taken:  # the new leaf ranks by the hits its pages had (the deepest page's: a parent has >= its child's)
            leaf = self.tree.match_prefix(key[:end], salt).last_node
            leaf.hit_count = min(t[4] for t in taken)
            self.tree.policy.touch(leaf, leaf.last_access_time, False)
        self.host_hit_tokens += len(taken) * self.ps
        self.disk_hit_tokens += len(from_disk) * self.ps
        self.loaded_pages += n
        self.load_seconds += time.perf_counter() - t0
        return n * self.ps

    # ---- prefetch from tier 3 ------------------------------------------------------------------
    def prefetch(self, key: list[int], salt: str | None) -> bool:
        """Queue the file reads of ``key``'s pages beyond the tree and tier 2, when at least
        ``prefetch_min_pages`` consecutive ones have files. Returns True when queued."""
        if self.prefetcher is None:
            return False
        self.drain_prefetched()
        n_pages = len(key) // self.ps
        i = len(self.tree.match_prefix(key, salt).pages)
        if n_pages - i < self.prefetch_min_pages:
            return False
        hashes = page_hashes(key[: n_pages * self.ps], self.ps)
        busy = self.restorer.in_flight if self.restorer is not None else {}
        while i < n_pages and ((salt, hashes[i]) in self.host or (salt, hashes[i]) in busy):
            i += 1
        j = i
        while j < n_pages and (salt, hashes[j]) in self.disk:
            j += 1
        if j - i < self.prefetch_min_pages:
            return False
        return self.prefetcher.submit(key[: j * self.ps], salt, i, hashes[i:j])

    def drain_prefetched(self) -> int:
        """Put finished prefetch reads into tier 2 (pages now in the tree are dropped). Returns pages put."""
        if self.prefetcher is None:
            return 0
        put = 0
        for key, salt, start, hashes, rows in self.prefetcher.take_done():
            in_tree = len(self.tree.match_prefix(key, salt).pages)
            busy = {**(self.restorer.in_flight if self.restorer else {})}
            busy.update(self.storer.in_flight if self.storer else {})
            keep = [
                (h, r)
                for i, (h, r) in enumerate(zip(hashes, rows))
                if start + i >= in_tree and (salt, h) not in self.host and (salt, h) not in busy
            ]
            if not keep:
                continue
            data = torch.frombuffer(bytearray(b"".join(r for _, r in keep)), dtype=torch.uint8)
            score = self._fresh_score()
            self.host.store([(salt, h) for h, _ in keep], [score] * len(keep), data.view(len(keep), -1))
            put += len(keep)
        self.prefetched_pages += put
        return put

    def _fresh_score(self) -> tuple:
        """The eviction key a node touched now would have (prefetched pages rank as just used)."""
        probe = _Probe()
        self.tree.policy.touch(probe, float(self.tree.clock), False)
        return self.tree.policy.key(probe)

    # ---- maintenance ---------------------------------------------------------------------------
    def flush(self) -> int:
        """Empty tiers 1 and 2 (tier 3 is the durable copy and stays). Returns pool pages freed."""
        if self.storer is not None:
            self.storer.drain()
        self._suspended = True
        try:
            freed = self.tree.flush()
        finally:
            self._suspended = False
        self.host.clear()
        return freed

    def persist(self) -> int:
        """Under ``write_back``, queue the files of every page still in tiers 1 and 2 (a restart finds
        them). Returns pages queued. O(cached pages) copies."""
        if self.disk is None or self.write_policy != "write_back":
            return 0
        queued = 0
        for (salt, h), slot in self.host.slots():
            queued += self.disk.write(salt, h, self.host.rows[slot].numpy().tobytes())
        for node in list(self.tree.nodes()):
            key, salt = self._path(node)
            hashes = page_hashes(key, self.ps)[-len(node.value) :]
            todo = [(p, h) for p, h in zip(node.value, hashes) if (salt, h) not in self.disk]
            if todo:
                rows = self.codec.pack([p for p, _ in todo]).numpy()
                for (_, h), row in zip(todo, rows):
                    queued += self.disk.write(salt, h, row.tobytes())
        return queued

    def close(self) -> None:
        """Stop restoring and prefetching, write what ``write_back`` still holds in memory (``persist``),
        and wait for the queued files (a graceful shutdown; SIGTERM drains through here)."""
        if self.restorer is not None:
            self.restorer.close()
        if self.storer is not None:
            self.storer.close()
        if self.prefetcher is not None:
            self.prefetcher.close()
        if self.disk is not None:
            try:
                n = self.persist()
                if n:
                    logger.info("hicache: write_back: %d pages written to %s at shutdown", n, self.disk.dir)
            finally:
                self.disk.close()

    def check_invariants(self) -> None:
        """``hicache_stats.check_tiers``: tier 2 is consistent and disjoint from the pool. Tests only."""
        check_tiers(self, [(*self._path(n), len(n.value)) for n in list(self.tree.nodes())])

    def stats(self, query_tokens: int) -> dict:
        """Per tier: hit tokens and rate (over ``query_tokens``), pages and bytes held, load/store time."""
        return tier_stats(self, query_tokens)


class _Probe:
    """What an eviction policy reads and writes on a node (``eviction.TreeNode``)."""

    def __init__(self) -> None:
        self.last_access_time, self.hit_count, self.score = 0.0, 0, 0.0
