"""A request's pages: what the scheduler asks of the allocator and the radix tree.

Page ownership: every page is exactly one of free (allocator), in the tree (evictable or protected), or
private to one running request (``req.page_table[req.prefix_len // P:]``). The first ``prefix_len``
tokens' pages belong to the tree and are locked through ``req.last_node``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from radixrt.runtime.mem.allocator import PageAllocator
from radixrt.runtime.mem.eviction import DEFAULT_POLICY
from radixrt.runtime.mem.radix_cache import RadixCache

if TYPE_CHECKING:  # annotations only: mem sits below the request layer (see [tool.importlinter])
    from radixrt.runtime.scheduler.request import Req


class ReqPages:
    """Attributes:
        unpin: called when eviction cannot free enough pages; it drops one session pin (making pages
            evictable) and returns True, or returns False when nothing is pinned (runtime/scheduler/session.py).
        hicache: the tiers under the tree (``hicache.HiCache``), or None.
    """

    def __init__(self, page_size: int, num_pages: int, enable_cache: bool, eviction_policy: str = DEFAULT_POLICY):
        self.P = page_size
        self.allocator = PageAllocator(num_pages)
        self.tree = RadixCache(page_size, self.allocator, eviction_policy) if enable_cache else None
        self.unpin: Callable[[], bool] | None = None
        self.hicache: Any = None
        self._prefetch_asked: set[str] = set()  # rids whose prefetch was considered

    def allocate(self, n: int) -> list[int] | None:
        """``n`` free pages, evicting tree leaves (by the eviction policy) if short, then dropping session
        pins one by one (oldest first) while still short; None if impossible."""
        if n <= 0:
            return []
        while True:
            if self.allocator.num_free < n and self.tree is not None:
                self.tree.evict(n - self.allocator.num_free)
            if self.allocator.num_free >= n or self.unpin is None or not self.unpin():
                break
        return self.allocator.allocate(n)

    def admit(self, req: Req) -> int:
        """Match the request's cacheable prefix, lock it, adopt its pages. Returns matched tokens."""
        pages, node = [], None
        if self.tree is not None and req.max_cacheable_prefix() > 0:
            if self.hicache is not None and self.hicache.restorer is None:  # evicted pages come back first
                self.hicache.restore(req.fill_ids[: req.max_cacheable_prefix()], req.cache_salt)
            m = self.tree.match_prefix(req.fill_ids[: req.max_cacheable_prefix()], req.cache_salt, hit=True)
            pages, node = m.pages, m.last_node
            self.tree.inc_lock_ref(node)
        matched = len(pages) * self.P
        req.page_table, req.last_node, req.prefix_len, req.num_computed = list(pages), node, matched, matched
        return matched

    def restoring(self, req: Req) -> bool:
        """True while ``req`` must wait for its prefix to come back from the lower tiers: a copy-thread
        restore (mem/restore_async.py) was started for it now or is still in flight. One restore per
        admission attempt: once its job is finished, the request is admitted with what landed."""
        r = self.hicache.restorer if self.hicache is not None else None
        if r is None or req.max_cacheable_prefix() <= 0:
            return False
        if req.restore_job is None:
            req.restore_job = r.begin(req.fill_ids[: req.max_cacheable_prefix()], req.cache_salt)
            return req.restore_job is not None
        return not req.restore_job.finished

    @property
    def restoring_pages(self) -> int:
        """Pool pages held by restores in flight (private to the copy thread)."""
        r = self.hicache.restorer if self.hicache is not None else None
        return r.pages if r is not None else 0

    def poll_restores(self) -> None:
        """Put finished restores into the tree (scheduler thread)."""
        if self.hicache is not None and self.hicache.restorer is not None:
            self.hicache.restorer.poll()

    def grow(self, req: Req, n: int) -> bool:
        """Make room in the page table for ``n`` more computed tokens."""
        need = -(-(req.num_computed + n) // self.P) - len(req.page_table)
        pages = self.allocate(need)
        if pages is None:
            return False
        req.page_table.extend(pages)
        return True

    def cache(self, req: Req) -> None:
        """Insert the request's computed, page-aligned prefix into the tree and share the tree's pages:
        ``insert`` reports how much was already there, and those duplicate pages of ours go back."""
        if self.tree is None:
            return
        k = min(req.num_computed, req.seq_len) // self.P * self.P
        if k <= req.prefix_len:
            return
        key = req.fill_ids[:k]
        present = self.tree.insert(key, req.page_table[: k // self.P], req.cache_salt)
        dup = req.page_table[req.prefix_len // self.P: present // self.P]
        if dup:
            self.allocator.free(dup)
        if self.hicache is not None:
            first = present // self.P
            self.hicache.inserted(key, req.cache_salt, first, req.page_table[first: k // self.P])
        m = self.tree.match_prefix(key, req.cache_salt)
        assert len(m.pages) * self.P == k, "inserted prefix must match in full"
        req.page_table[: k // self.P] = m.pages
        self.tree.inc_lock_ref(m.last_node)
        if req.last_node is not None:
            self.tree.dec_lock_ref(req.last_node)
        req.last_node, req.prefix_len = m.last_node, k

    def release(self, req: Req, keep_lock: bool = False) -> tuple[Any, int]:
        """Cache what is valid, then give back the request's own pages and its lock.

        With ``keep_lock`` the lock on the deepest cached node is not released but returned, for a session
        to pin: ``(node, cached tokens)``; ``(None, 0)`` when nothing is locked."""
        self.cache(req)
        own = req.page_table[req.prefix_len // self.P:]
        if own:
            self.allocator.free(own)
        kept = (None, 0)
        if req.last_node is not None:
            if keep_lock:
                kept = (req.last_node, req.prefix_len)
            else:
                self.tree.dec_lock_ref(req.last_node)
        req.page_table, req.last_node, req.prefix_len, req.num_computed = [], None, 0, 0
        return kept

    def prefetch(self, waiting: list[Req], limit: int = 4) -> None:
        """Start tier-3 reads for the first ``limit`` waiting requests not asked for before (mem/prefetch.py)
        and not already restoring (their files are read by the restore)."""
        if self.hicache is None or self.hicache.prefetcher is None:
            return
        asked = self._prefetch_asked
        if len(asked) > 4096:
            asked.clear()
        for req in [r for r in waiting if r.rid not in asked and r.restore_job is None][:limit]:
            asked.add(req.rid)
            if req.max_cacheable_prefix() > 0:
                self.hicache.prefetch(req.fill_ids[: req.max_cacheable_prefix()], req.cache_salt)

    def flush(self) -> int:
        """Drop every unlocked cached page (and tier 2's); returns pool pages freed."""
        if self.tree is None:
            return 0
        return self.hicache.flush() if self.hicache is not None else self.tree.flush()

    def stats(self, running: list[Req]) -> dict:
        """Page counts: free + evictable + protected + private == total."""
        private = sum(len(r.page_table) - r.prefix_len // self.P for r in running) + self.restoring_pages
        return {"total_pages": self.allocator.num_pages, "free_pages": self.allocator.num_free,
                "evictable_pages": self.tree.evictable_pages if self.tree else 0,
                "protected_pages": self.tree.protected_pages if self.tree else 0,
                "private_pages": private, "page_size": self.P, "enabled": self.tree is not None}
