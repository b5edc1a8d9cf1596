"""Replay requests through the real radix tree and page allocator, without the model.

Each request follows what the scheduler does with its pages (``mem/req_pages.py``):
  1. *start* (admission): ``match_prefix`` of the cacheable part of the prompt (hit counted), lock the
     matched node, allocate private pages for the rest of the prompt (evicting by the policy);
  2. *prefill done*: insert the prompt's whole pages, give back the duplicates, move the lock to the new node
     (with ``chunks``, at the end of each prefill chunk, as the scheduler inserts each chunk);
  3. *finish*: allocate pages for the output, insert prompt + output less the last token (its KV is never
     computed), give back private pages and the lock.
With times (a request log from ``--request-log``), the three events of every request are replayed in time
order, so requests in flight hold their pages and locks as they did live; without times, each request runs
start to finish before the next. When the pool cannot hold a request's pages (more in flight than the cache
size allows) the request counts its hit and skips caching (``overflow``): live, it would have waited.

Units: lengths are tokens; ``num_pages`` counts pages of ``page_size`` tokens. A request's key is either its
token ids (``unit == 1``) or a chain of page hashes (``unit`` = the hash page size, each hash naming the
whole prefix up to its page), in which case ``page_size`` must be a multiple of ``unit``.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Optional

from radixrt.runtime.mem.allocator import PageAllocator
from radixrt.runtime.mem.radix_cache import RadixCache


@dataclass
class ReplayReq:
    """One request. ``key``: token ids of prompt + output (unit 1), or page hashes over them (unit > 1).
    Times in seconds on one clock, or None (sequential replay)."""

    prompt_len: int
    output_len: int
    key: list[int]
    unit: int = 1
    cacheable: Optional[int] = None  # prompt tokens that may come from the cache (default prompt_len - 1)
    salt: Optional[str] = None
    start: Optional[float] = None
    prefill_done: Optional[float] = None
    finish: Optional[float] = None
    chunks: Optional[list[tuple[float, int]]] = None  # (time, prompt tokens computed) after each prefill chunk
    flush: bool = False  # not a request: the cache was flushed here (every unlocked page freed)

    def tokens_key(self, n: int, page_size: int) -> list[int]:
        """Key of the first ``n`` tokens, cut to whole pages, in tree units (tokens, or one hash a page)."""
        n = n // page_size * page_size
        if self.unit == 1:
            return self.key[:n]
        k = page_size // self.unit
        return self.key[k - 1 : n // self.unit : k]


@dataclass
class ReplayResult:
    page_size: int
    num_pages: int
    policy: str
    query_tokens: int = 0
    hit_tokens: int = 0
    overflow: int = 0  # requests whose pages did not fit
    evicted_pages: int = 0
    host_hit_tokens: int = 0  # of hit_tokens, restored from tier 2 / tier 3 (replays with tiers)
    disk_hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


@dataclass
class _Live:
    req: ReplayReq
    node: object = None
    pages: list[int] = field(default_factory=list)
    cached: int = 0  # tokens owned by the tree at the front of ``pages``
    ok: bool = True


class Replayer:
    """The tree and allocator of one cache configuration; feed it requests with ``run``."""

    def __init__(
        self, num_pages: int, page_size: int, policy: str = "lru", host_pages: int = 0, disk_pages: Optional[int] = None
    ):
        """``host_pages`` > 0: tier 2 of that many pages under the tree; ``disk_pages``: tier 3 too (0: no
        bound), the server's ``HiCache`` (``tiers.py``)."""
        self.host_pages, self.disk_pages, self.tiers = host_pages, disk_pages, None
        self.P = page_size
        self.alloc = PageAllocator(num_pages)
        self.tree_ps = 1  # set on the first request: page_size for token keys, 1 for hash keys
        self.tree: Optional[RadixCache] = None
        self.res = ReplayResult(page_size, num_pages, policy)
        self.policy = policy

    def _tree(self, req: ReplayReq) -> RadixCache:
        ps = self.P if req.unit == 1 else 1
        if req.unit > 1 and self.P % req.unit:
            raise ValueError(f"page_size {self.P} is not a multiple of the log's hash page size {req.unit}")
        if self.tree is None:
            self.tree_ps = ps
            lower = None
            if self.host_pages > 0:
                from radixrt.runtime.profile.tiers import make_tiers

                # a tree page is one pool page in both key forms (a token key's page, or one hash per page)
                def lower(tree: RadixCache):
                    return make_tiers(tree, self._allocate, self.host_pages, self.disk_pages)

            self.tree = RadixCache(ps, self.alloc, self.policy, lower)
            self.tiers = self.tree.lower_tier
        elif ps != self.tree_ps:
            raise ValueError("a log mixes token ids and page hashes")
        return self.tree

    def _allocate(self, n: int) -> Optional[list[int]]:
        if n <= 0:
            return []
        if self.alloc.num_free < n:
            self.res.evicted_pages += self.tree.evict(n - self.alloc.num_free)
        return self.alloc.allocate(n)

    def _insert(self, lv: _Live, n_tokens: int) -> None:
        """Insert the first ``n_tokens`` (whole pages) of the request and share the tree's pages."""
        tree, r = self.tree, lv.req
        n = n_tokens // self.P * self.P
        if n <= lv.cached:
            return
        key = r.tokens_key(n, self.P)
        present = tree.insert(key, lv.pages[: n // self.P], r.salt) * (self.P // self.tree_ps)
        dup = lv.pages[lv.cached // self.P : present // self.P]
        if dup:
            self.alloc.free(dup)
        if self.tiers is not None:
            self.tiers.inserted(key, r.salt, present // self.P, lv.pages[present // self.P : n // self.P])
        m = tree.match_prefix(key, r.salt)
        lv.pages[: n // self.P] = m.pages
        tree.inc_lock_ref(m.last_node)
        tree.dec_lock_ref(lv.node)
        lv.node, lv.cached = m.last_node, n

    def start(self, r: ReplayReq) -> _Live:
        tree = self._tree(r)
        cacheable = r.prompt_len - 1 if r.cacheable is None else min(r.cacheable, r.prompt_len - 1)
        key = r.tokens_key(max(cacheable, 0), self.P)
        if self.tiers is not None:
            h, d = self.tiers.host_hit_tokens, self.tiers.disk_hit_tokens
            self.tiers.restore(key, r.salt)
            units = self.P // self.tree_ps  # tokens per tree key element (1, or a page per hash)
            self.res.host_hit_tokens += (self.tiers.host_hit_tokens - h) * units
            self.res.disk_hit_tokens += (self.tiers.disk_hit_tokens - d) * units
        m = tree.match_prefix(key, r.salt, hit=True)
        tree.inc_lock_ref(m.last_node)
        lv = _Live(r, m.last_node, list(m.pages), len(m.pages) * self.P)
        self.res.query_tokens += r.prompt_len
        self.res.hit_tokens += lv.cached
        more = self._allocate(-(-r.prompt_len // self.P) - len(lv.pages))
        if more is None:
            lv.ok = False
            self.res.overflow += 1
        else:
            lv.pages += more
        return lv

    def prefill_done(self, lv: _Live, tokens: Optional[int] = None) -> None:
        """The first ``tokens`` prompt tokens (default all) have their KV: insert them."""
        if lv.ok:
            n = lv.req.prompt_len if tokens is None else min(tokens, lv.req.prompt_len)
            self._insert(lv, n)

    def finish(self, lv: _Live) -> None:
        r = lv.req
        if lv.ok:
            computed = r.prompt_len + r.output_len - 1
            more = self._allocate(-(-computed // self.P) - len(lv.pages))
            if more is not None:
                lv.pages += more
                self._insert(lv, computed)
            else:
                self.res.overflow += 1
            own = lv.pages[lv.cached // self.P :]
            if own:
                self.alloc.free(own)
        self.tree.dec_lock_ref(lv.node)
        lv.pages = []

    def flush(self) -> None:
        if self.tree is not None:
            self.tree.flush()

    def run(self, reqs: list[ReplayReq]) -> ReplayResult:
        """Replay ``reqs`` (timed when every request has ``start``; otherwise one after another)."""
        if reqs and all(r.start is not None for r in reqs):
            events = []
            for i, r in enumerate(reqs):
                if r.flush:
                    events.append((r.start, 0, i, 0))
                    continue
                done = r.prefill_done if r.prefill_done is not None else r.start
                fin = max(r.finish if r.finish is not None else done, done, r.start)
                # at equal times: finishes, then prefills, then admissions (a step's outputs precede the next
                # step's scheduling); a request's own prefill or finish at its admission time (a log without
                # timings) comes after that admission: kinds 3 and 4
                events += [(r.start, 2, i, 0), (fin, 4 if fin == r.start else 0, i, 0)]
                for t, n in r.chunks or [(done, r.prompt_len)]:
                    t = min(max(t, r.start), fin)
                    events.append((t, 3 if t == r.start else 1, i, n))
            heapq.heapify(events)
            live: dict[int, _Live] = {}
            while events:
                _, kind, i, n = heapq.heappop(events)
                if reqs[i].flush:
                    self.flush()
                elif kind == 2:
                    live[i] = self.start(reqs[i])
                elif kind in (1, 3):
                    self.prefill_done(live[i], n)
                else:
                    self.finish(live.pop(i))
        else:
            for r in reqs:
                if r.flush:
                    self.flush()
                    continue
                lv = self.start(r)
                self.prefill_done(lv)
                self.finish(lv)
        return self.res


def replay(
    reqs: list[ReplayReq],
    num_pages: int,
    page_size: int,
    policy: str = "lru",
    host_pages: int = 0,
    disk_pages: Optional[int] = None,
) -> ReplayResult:
    """Hit rate of ``reqs`` on a pool of ``num_pages`` pages of ``page_size`` tokens under ``policy``, with
    tier 2 of ``host_pages`` and tier 3 of ``disk_pages`` (0: unbounded; None: none) under it.
    Raises ValueError on an unknown policy or a page size the log's hashes cannot express."""
    return Replayer(num_pages, page_size, policy, host_pages, disk_pages).run(reqs)


def pages_needed(reqs: list[ReplayReq], page_size: int) -> int:
    """Pages that hold every request at once: a pool this large never evicts (the infinite cache)."""
    return sum(-(-(r.prompt_len + r.output_len) // page_size) for r in reqs if not r.flush) + 1
