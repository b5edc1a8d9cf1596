"""Restores off the scheduler's step: pages found in tier 2 (host rows) or tier 3 (files) are copied into the
pool by a copy thread while the scheduler keeps stepping the running requests.

The request's admission is split in three (SGLang's HiCache does the same with "loading" nodes: its
``load_back`` copies host pages to the device on a separate CUDA stream, and storage prefetch runs in its
own thread; the request is scheduled once the load is done):

  ``begin(key, salt)``  on the scheduler thread: match the tree, take the run of pages that follow from
                        tier 2 (``HostTier.take``: their slots stay out of use) and note the ones that have
                        files, lock the matched node (``inc_lock_ref``) and allocate one pool page per run page
                        up front, so eviction can take neither. The job goes to the copy thread.
  copy thread           unpacks the host rows into their pool pages, reads and checks the files in order
                        (``DiskTier.read``; the first missing or corrupt one ends the run), then marks the
                        job done. On a GPU the copies run on their own CUDA stream and are synchronized
                        before the job is marked done. Torch copies and file reads release the GIL.
  ``poll()``            on the scheduler thread: each finished job's landed pages go into the tree (the
                        lock moves off), host slots are released (or put back, past a failed read), the
                        pages its allocation evicted reach tier 2 (held until now, as ``HiCache.restore``
                        does, so they do not push out entries for room the job's slots give back), and the
                        pool pages that did not land are freed.

While a job runs its pages are private to it: ``pages`` counts them in the pool accounting (free +
evictable + protected + private = total), and tier 2's slots it took are "being copied"
(``HostTier.check``). A request whose match reaches into a run in flight waits for that job instead of
starting a second one. A request aborted while waiting leaves its job running: the job's pages still land
in the tree (their KV is valid) and its lock is released, so no page or lock_ref is lost.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from radixrt.runtime.mem.page_hash import page_hashes

logger = logging.getLogger(__name__)


def on_stream(stream, fn, job):
    """``fn(job)`` on the CUDA copy ``stream`` (synchronized before it returns), or as is without one: how
    the restore and store threads (store_async.py) run each copy."""
    if stream is None:
        return fn(job)
    with torch.cuda.stream(stream):
        out = fn(job)
    stream.synchronize()
    return out


@dataclass(eq=False)
class RestoreJob:
    """One run of pages on its way into the pool. ``host``: ``(index in run, key, slot, score, hits)``;
    ``disk``: ``(index in run, page hash)``; ``landed`` (set by the copy thread): leading run pages whose
    bytes are in the pool."""

    key: list[int]
    salt: str | None
    start: int  # pages matched in the tree when the job began
    node: object  # the matched node, locked until the job is finished
    prefix_pages: list[int]
    pages: list[int]
    keys: list[tuple]
    host: list[tuple] = field(default_factory=list)
    disk: list[tuple] = field(default_factory=list)
    deferred: list[tuple] = field(default_factory=list)  # HiCache.on_evict's spills held until finished
    to_pack: list[tuple] = field(default_factory=list)  # spills whose pages are the job's: packed first
    pack_seconds: float = 0.0
    landed: int = 0
    seconds: float = 0.0
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    finished: bool = False  # poll() put it into the tree
    is_store: bool = False  # a restore (Restorer.begin may answer with a store in flight: store_async.StoreJob)


class Restorer:
    """The copy thread and the jobs in flight of one ``HiCache`` (``hc``)."""

    def __init__(self, hc) -> None:
        self.hc = hc
        self.jobs: list[RestoreJob] = []
        self.in_flight: dict[tuple, RestoreJob] = {}  # (salt, page hash) -> the job bringing it
        self._queue: queue.Queue = queue.Queue()
        self._wake = threading.Event()  # set when a job is done (an idle scheduler waits on it)
        dev = hc.codec.tensors[0].device
        self.stream = torch.cuda.Stream(device=dev) if dev.type == "cuda" else None
        self._thread = threading.Thread(target=self._run, name="hicache-restore", daemon=True)
        self._thread.start()

    @property
    def pages(self) -> int:
        """Pool pages allocated to jobs not yet finished."""
        return sum(len(j.pages) for j in self.jobs)

    def begin(self, key: list[int], salt: str | None) -> RestoreJob | None:
        """Start loading the pages of ``key`` that follow the tree's match (or return the job already bringing
        the first of them). None when there is nothing to load or the pool cannot make room."""
        hc, ps = self.hc, self.hc.ps
        n_pages = len(key) // ps
        hc.drain_prefetched()
        m = hc.tree.match_prefix(key, salt)
        start = len(m.pages)
        if start >= n_pages or not (
            hc.host.num_used or hc.disk is not None or self.in_flight or (hc.storer is not None and hc.storer.in_flight)
        ):
            return None
        hashes = page_hashes(key[: n_pages * ps], ps)
        storing = hc.storer.in_flight if hc.storer is not None else {}
        first = self.in_flight.get((salt, hashes[start])) or storing.get((salt, hashes[start]))
        if first is not None:  # a restore bringing it, or a store not landed yet (its slot is half-written)
            return first
        host, disk = [], []
        for i in range(start, n_pages):
            k = (salt, hashes[i])
            if k in self.in_flight or k in storing:
                break
            got = hc.host.take(k)
            if got is not None:
                host.append((i - start, k, *got))
            elif hc.disk is not None and k in hc.disk:
                disk.append((i - start, hashes[i]))
            else:
                break
        n = len(host) + len(disk)
        if n == 0:
            return None
        hc.tree.inc_lock_ref(m.last_node)  # the matched part must outlive the allocation and the copy
        # pages the allocation evicts wait (copied out of the pool) until the job's tier-2 slots are free, so
        # their spill does not evict tier-2 entries to make room those slots are about to give back
        with hc.deferring() as evicted:
            pages = hc.allocate(n)
        # pages this job took are packed on the copy thread before they are overwritten (the copy on evict
        # leaves the step); any other evicted page is packed now, while nothing has reused it yet
        mine = set(pages or ())
        to_pack = [e for e in evicted if mine.issuperset(e[2])]
        deferred = [(k, sc, hc.codec.pack(ids), h) for k, sc, ids, h in evicted if not mine.issuperset(ids)]
        if pages is None:
            hc.tree.dec_lock_ref(m.last_node)
            for _, k, slot, score, hits in host:
                hc.host.put_back(k, slot, score, hits)
            for item in deferred:
                hc.store_rows(*item)
            return None
        keys = [(salt, h) for h in hashes[start : start + n]]
        job = RestoreJob(
            list(key[: (start + n) * ps]),
            salt,
            start,
            m.last_node,
            list(m.pages),
            pages,
            keys,
            host,
            disk,
            deferred,
            to_pack,
        )
        for k in keys:
            self.in_flight[k] = job
        self.jobs.append(job)
        self._queue.put(job)
        return job

    # ---- the copy thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            t0 = time.perf_counter()
            try:
                job.landed = on_stream(self.stream, self._copy, job)
            except BaseException as e:  # nothing landed: the request recomputes; the scheduler logs it
                job.error, job.landed = e, 0
            job.seconds = time.perf_counter() - t0
            job.done.set()
            self._wake.set()

    def _copy(self, job: RestoreJob) -> int:
        """Fill the job's pool pages; returns how many leading run pages landed. Copies go in chunks of
        ``CHUNK`` pages: joining a run's file bytes in one piece would hold the GIL for tens of milliseconds
        (a 2,000-token prefix is ~46 MB at fp16), stalling the scheduler thread's step."""
        hc = self.hc
        t0 = time.perf_counter()
        for keys, scores, ids, hits in job.to_pack:  # evicted pages' bytes out before restored ones go in
            job.deferred.append((keys, scores, hc.codec.pack(ids), hits))
        job.pack_seconds = time.perf_counter() - t0
        for part in _chunks(job.host):
            slots = torch.tensor([h[2] for h in part], dtype=torch.long)
            hc.codec.unpack([job.pages[h[0]] for h in part], hc.host.rows[slots])
        landed = len(job.pages)
        for part in _chunks(job.disk):
            got = []
            for i, h in part:
                row = hc.disk.read(job.salt, h)
                if row is None:  # missing or failed its checks (dropped, logged): the run ends here
                    landed = i
                    break
                got.append((i, row))
            if got:
                rows = torch.frombuffer(bytearray(b"".join(r for _, r in got)), dtype=torch.uint8)
                hc.codec.unpack([job.pages[i] for i, _ in got], rows.view(len(got), -1))
            if landed < len(job.pages):
                break
        return landed

    # ---- back on the scheduler thread ----------------------------------------------------------
    def wait(self, timeout: float) -> None:
        """Sleep until a job is done or ``timeout`` seconds pass (an idle scheduler, nothing else to run)."""
        if self.jobs and not any(j.done.is_set() for j in self.jobs):
            self._wake.wait(timeout)
        self._wake.clear()

    def poll(self) -> int:
        """Finish every done job (tree insert, tier-2 slots, unused pages). Returns jobs finished."""
        done = [j for j in self.jobs if j.done.is_set()]
        for job in done:
            self.jobs.remove(job)
            self._finish(job)
        return len(done)

    def _finish(self, job: RestoreJob) -> None:
        hc, ps, n = self.hc, self.hc.ps, job.landed
        for k in job.keys:
            self.in_flight.pop(k, None)
        if job.error is not None:
            logger.warning("hicache: a restore failed (%r); its %d pages are recomputed", job.error, len(job.pages))
        for i, k, slot, score, hits in job.host:
            if i < n or k in hc.host:  # copied out (or the tier holds the key again): the slot is free
                hc.host.release([slot])
            else:  # past a failed read: the page stays in tier 2
                hc.host.put_back(k, slot, score, hits)
        for keys, scores, rows, hits in job.deferred:  # the slots above are free again: the spills go in now
            if hc.storer is not None:  # their rows are packed already: the store thread writes them
                hc.storer.begin(keys, scores, hits, rows=rows)
            else:
                hc.store_rows(keys, scores, rows, hits)
        if len(job.pages) > n:
            hc.tree.allocator.free(job.pages[n:])
        if n:
            present = hc.tree.insert(job.key[: (job.start + n) * ps], job.prefix_pages + job.pages[:n], job.salt)
            hc.in_pool(job.keys[:n])  # a copy spilled meanwhile (computed and evicted again): pool only
            dup = job.pages[: max(0, present // ps - job.start)]  # computed meanwhile by another request
            if dup:
                hc.tree.allocator.free(dup)
            from_host = [h for h in job.host if h[0] < n]
            if from_host:  # the new leaf ranks by the hits its pages had (as HiCache.restore)
                leaf = hc.tree.match_prefix(job.key[: (job.start + n) * ps], job.salt).last_node
                leaf.hit_count = min(h[4] for h in from_host)
                hc.tree.policy.touch(leaf, leaf.last_access_time, False)
            hc.host_hit_tokens += len(from_host) * ps
            hc.disk_hit_tokens += (n - len(from_host)) * ps
            hc.loaded_pages += n
        hc.tree.dec_lock_ref(job.node)
        hc.load_seconds += job.seconds - job.pack_seconds
        hc.store_seconds += job.pack_seconds
        job.finished = True

    def close(self) -> None:
        """Stop the copy thread after the jobs queued (the caller polls them afterwards if it goes on)."""
        self._queue.put(None)
        self._thread.join(timeout=30)


CHUNK = 8  # pages per copy (see Restorer._copy)


def _chunks(items: list) -> list[list]:
    return [items[i : i + CHUNK] for i in range(0, len(items), CHUNK)]
