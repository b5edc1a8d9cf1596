"""A request's pages: what the scheduler asks of the allocator and the radix tree.

Page ownership: every page is exactly one of free (allocator), in the tree (evictable or protected), or
private to one running request (``req.page_table[req.prefix_len // P:]``). The first ``prefix_len``
tokens' pages belong to the tree and are locked through ``req.last_node``.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Callable

from radixrt.runtime.mem.allocator import PageAllocator
from radixrt.runtime.mem.eviction import DEFAULT_POLICY
from radixrt.runtime.mem.radix_cache import RadixCache

if TYPE_CHECKING:  # annotations only: mem sits below the request layer (see [tool.importlinter])
    from radixrt.runtime.scheduler.request import Req


class ReqPages:
    """The pool's pages for the requests: an allocator, the radix tree (``enable_cache``) and its tiers.

    Args:
        tiers: builds the tiers under the tree (``hicache.HiCache``) from the tree and :meth:`allocate`;
            None (or no tree): none. Kept as ``hicache``.
        unpin: called when eviction cannot free enough pages; it drops one session pin (making pages
            evictable) and returns True, or returns False when nothing is pinned (runtime/scheduler/session.py).
    """

    def __init__(
        self,
        page_size: int,
        num_pages: int,
        enable_cache: bool,
        eviction_policy: str = DEFAULT_POLICY,
        tiers: Callable[[RadixCache, Callable[..., list[int] | None]], Any] | None = None,
        unpin: Callable[[], bool] | None = None,
    ):
        self.P = page_size
        self.allocator = PageAllocator(num_pages)
        lower = (lambda tree: tiers(tree, self.allocate)) if tiers is not None else None
        self.tree = RadixCache(page_size, self.allocator, eviction_policy, lower) if enable_cache else None
        self.unpin = unpin
        self.hicache: Any = self.tree.lower_tier if self.tree is not None else None
        self._prefetch_asked: set[str] = set()  # rids whose prefetch was considered
        self.flushes = 0  # flush() calls so far

    def allocate(self, n: int, wait: bool = True) -> list[int] | None:
        """``n`` free pages, evicting tree leaves (by the eviction policy) if short, then dropping session
        pins one by one (oldest first) while still short; None if impossible.

        With tier 2's store thread (mem/store_async.py), ``wait=False`` (an admission, an extend chunk: they
        can wait a step) evicts with the copies off the step, counting pages whose store is in flight as
        coming, and returns None while only those would make up ``n``. ``wait=True`` (a decode's page)
        evicts with the copy on the step, and waits for stores in flight when nothing else is left."""
        if n <= 0:
            return []
        storer = self.hicache.storer if self.hicache is not None else None
        while True:
            if storer is not None:
                storer.poll()
            coming = storer.pages if storer is not None and not wait else 0
            if self.allocator.num_free + coming < n and self.tree is not None:
                with self.hicache.holding(not wait) if self.hicache is not None else nullcontext():
                    self.tree.evict(n - self.allocator.num_free - coming)
            if self.allocator.num_free >= n:
                break
            if storer is not None and storer.pages:
                if not wait:  # the pages come back once their copies land: the caller retries next step
                    return None
                storer.drain()  # never hand out a page whose copy is in flight
                continue
            if self.unpin is None or not self.unpin():
                break
        return self.allocator.allocate(n)

    def admit(self, req: Req) -> int:
        """Match the request's cacheable prefix, lock it, adopt its pages. Returns matched tokens. The match
        counts a hit on its nodes at the request's first admission only."""
        pages, node = [], None
        if self.tree is not None and req.max_cacheable_prefix() > 0:
            if self.hicache is not None and self.hicache.restorer is None:  # evicted pages come back first
                self.hicache.restore(req.fill_ids[: req.max_cacheable_prefix()], req.cache_salt)
            # one hit per request: an admission retried for want of pages, or after a preemption, is the
            # same access (each retry counted before, inflating LFU/GDSF's frequencies of queued prefixes)
            m = self.tree.match_prefix(
                req.fill_ids[: req.max_cacheable_prefix()], req.cache_salt, hit=not req.hit_counted
            )
            req.hit_counted = True
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
        job = req.restore_job
        if job is None or (job.finished and job.is_store):  # a store landed: restore it now
            req.restore_job = r.begin(req.fill_ids[: req.max_cacheable_prefix()], req.cache_salt)
            return req.restore_job is not None
        return not job.finished

    @property
    def restoring_pages(self) -> int:
        """Pool pages held by restores in flight (private to the copy thread)."""
        r = self.hicache.restorer if self.hicache is not None else None
        return r.pages if r is not None else 0

    @property
    def storing_pages(self) -> int:
        """Pool pages held by stores in flight (evicted, copied to tier 2 by the store thread)."""
        s = self.hicache.storer if self.hicache is not None else None
        return s.pages if s is not None else 0

    def poll_restores(self) -> None:
        """Put finished restores into the tree and land finished stores (scheduler thread)."""
        if self.hicache is not None and self.hicache.restorer is not None:
            self.hicache.restorer.poll()
        if self.hicache is not None and self.hicache.storer is not None:
            self.hicache.storer.poll()

    def wait_copies(self, timeout: float) -> None:
        """An idle scheduler with only copies in flight sleeps until one is done (at most ``timeout`` s)."""
        for t in (self.hicache.restorer, self.hicache.storer) if self.hicache is not None else ():
            if t is not None and t.jobs:
                t.wait(timeout)
                return

    def grow(self, req: Req, n: int, wait: bool = True) -> bool:
        """Make room in the page table for ``n`` more computed tokens (``wait``: see ``allocate``)."""
        need = -(-(req.num_computed + n) // self.P) - len(req.page_table)
        pages = self.allocate(need, wait)
        if pages is None:
            return False
        req.page_table.extend(pages)
        return True

    def trim(self, req: Req, n: int) -> None:
        """Give back the request's own pages past those that hold its first ``n`` tokens (the rollback of
        rejected draft tokens: their slots lie past ``num_computed``, and ``n`` is ``num_computed + 1``, the
        next token's). The tree's pages, the first ``prefix_len`` tokens', are never trimmed."""
        keep = max(-(-n // self.P), req.prefix_len // self.P)
        if len(req.page_table) > keep:
            self.allocator.free(req.page_table[keep:])
            del req.page_table[keep:]

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
        dup = req.page_table[req.prefix_len // self.P : present // self.P]
        if dup:
            self.allocator.free(dup)
        if self.hicache is not None:
            first = present // self.P
            self.hicache.inserted(key, req.cache_salt, first, req.page_table[first : k // self.P])
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
        own = req.page_table[req.prefix_len // self.P :]
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
        """Drop every unlocked cached page (and tier 2's); returns pool pages freed. Counted in ``flushes``
        even without a tree: what caches outputs beside the tree (the drafter's store of past outputs)
        drops them when the count moves."""
        self.flushes += 1
        if self.tree is None:
            return 0
        return self.hicache.flush() if self.hicache is not None else self.tree.flush()

    def stats(self, running: list[Req]) -> dict:
        """Page counts: free + evictable + protected + private == total (private: running requests', restores'
        and stores' in flight; ``storing_pages`` the last)."""
        private = sum(len(r.page_table) - r.prefix_len // self.P for r in running) + self.restoring_pages
        private += self.storing_pages
        return {
            "total_pages": self.allocator.num_pages,
            "free_pages": self.allocator.num_free,
            "evictable_pages": self.tree.evictable_pages if self.tree else 0,
            "protected_pages": self.tree.protected_pages if self.tree else 0,
            "private_pages": private,
            "storing_pages": self.storing_pages,
            "page_size": self.P,
            "enabled": self.tree is not None,
        }
