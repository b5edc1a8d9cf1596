"""Stores off the scheduler's step: the K/V of pages the tree evicts are copied into tier 2 (and, under
``write_back``, the tier-2 entries they push out into files) by a copy thread, while the scheduler keeps
stepping the running requests.

SGLang's HiCache is the contrast: its write-back eviction queues the device-to-host copy on the cache
controller's own stream but then blocks the evicting step until every queued copy has acknowledged, and
only then frees the device pages; the copies that do run behind the step are its write-through backups,
whose nodes stay locked until the ack is polled at a later step. Here eviction takes that second shape:

  ``begin``  on the scheduler thread, from ``HiCache.on_evict`` (or a restore's held spills): tier-2 slots
             are reserved (``HostTier.reserve``: "being written", not yet matchable), the entries they push
             out are noted, and the pool pages stay held: neither free nor evictable (``pages`` counts them
             in the pool's accounting, free + evictable + protected + private = total).
  thread     packs the pool pages (``PageCodec.pack``; on a GPU on its own stream, synchronized), writes the
             pushed-out rows' files first under ``write_back``, then the new rows into their slots.
  ``poll``   on the scheduler thread: a finished job's slots become entries (``HostTier.commit``: keys that
             entered the tree meanwhile are skipped, see ``discard``) and its pool pages return to the
             free list. Only then can a match restore them, or the allocator hand the pages out.

An admission that needs pages only in-flight stores would give waits in the queue (``ReqPages.allocate``
with ``wait=False``); an allocation that cannot wait (a decode's next page) evicts with a synchronous store
or, when only in-flight stores are left, waits for them (``drain``): a page whose copy is in flight is never
handed out. A match reaching a key in flight waits for its job (``Restorer.begin`` returns it).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from radixrt.runtime.mem.restore_async import on_stream

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class StoreJob:
    """One evicted run on its way into tier 2. ``new``: ``(index in keys, slot)`` reserved; ``spilled``:
    ``(key, slot)`` entries pushed out whose rows go to files first (``write_back`` with a disk only)."""

    keys: list[tuple]
    scores: list[tuple]
    hits: int
    pages: list[int]  # pool pages held until the job lands ([] when ``rows`` came packed)
    rows: torch.Tensor | None
    new: list[tuple[int, int]]
    spilled: list[tuple]
    dropped: set = field(default_factory=set)  # keys back in the tree meanwhile: not committed
    seconds: float = 0.0
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    finished: bool = False  # poll() landed it (a request waiting on it may restore now)
    is_store: bool = True


class Storer:
    """The store copy thread and the jobs in flight of one ``HiCache`` (``hc``)."""

    def __init__(self, hc) -> None:
        self.hc = hc
        self.jobs: list[StoreJob] = []
        self.in_flight: dict[tuple, StoreJob] = {}  # (salt, page hash) -> the job writing it
        self._queue: queue.Queue = queue.Queue()
        self._wake = threading.Event()
        dev = hc.codec.tensors[0].device
        self.stream = torch.cuda.Stream(device=dev) if dev.type == "cuda" else None  # never run: no GPU here
        self._thread = threading.Thread(target=self._run, name="hicache-store", daemon=True)
        self._thread.start()

    @property
    def pages(self) -> int:
        """Pool pages held by stores not yet landed."""
        return sum(len(j.pages) for j in self.jobs)

    def begin(
        self,
        keys: list[tuple],
        scores: list[tuple],
        hits: int,
        pages: list[int] | None = None,
        rows: torch.Tensor | None = None,
    ) -> StoreJob:
        """Queue the copy of pool ``pages`` (or of packed ``rows``, uint8 ``[len(keys), page_bytes]``) under
        ``keys``; the caller gives up ``pages`` to the job until it lands."""
        hc = self.hc
        new, spilled = hc.host.reserve(keys, scores, hits)
        back = hc.disk is not None and hc.write_policy == "write_back"
        job = StoreJob(keys, scores, hits, list(pages or ()), rows, new, spilled if back else [])
        for i, _ in new:
            self.in_flight[keys[i]] = job
        hc.stored_pages += len(keys)
        hc.host_evicted_pages += len(spilled)
        self.jobs.append(job)
        self._queue.put(job)
        return job

    def discard(self, keys: list[tuple]) -> None:
        """``keys`` are in the pool again: their jobs in flight must not make them tier-2 entries."""
        for k in keys:
            job = self.in_flight.pop(k, None)
            if job is not None:
                job.dropped.add(k)

    # ---- the copy thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            t0 = time.perf_counter()
            try:
                on_stream(self.stream, self._copy, job)
            except BaseException as e:  # the slots are given back at poll; the pages were cached, not needed
                job.error = e
            job.seconds = time.perf_counter() - t0
            job.done.set()
            self._wake.set()

    def _copy(self, job: StoreJob) -> None:
        hc = self.hc
        rows = job.rows if job.rows is not None else hc.codec.pack(job.pages)
        for (salt, h), slot in job.spilled:  # the pushed-out rows leave for their files before being overwritten
            hc.disk.write(salt, h, hc.host.rows[slot].numpy().tobytes())
        hc.host.write(job.new, rows, len(job.keys))

    # ---- back on the scheduler thread ----------------------------------------------------------
    def poll(self) -> int:
        """Land every finished job (tier-2 entries, pool pages freed). Returns pages freed."""
        freed = 0
        for job in [j for j in self.jobs if j.done.is_set()]:
            self.jobs.remove(job)
            freed += self._land(job)
        return freed

    def _land(self, job: StoreJob) -> int:
        hc = self.hc
        for i, _ in job.new:
            if self.in_flight.get(job.keys[i]) is job:
                del self.in_flight[job.keys[i]]
        if job.error is not None:
            logger.warning("hicache: a store to tier 2 failed (%r); its %d pages are dropped", job.error, len(job.keys))
            job.dropped.update(job.keys)
        hc.host.commit(job.keys, job.new, job.scores, job.hits, job.dropped)
        if job.pages:
            hc.tree.allocator.free(job.pages)
        hc.store_seconds += job.seconds
        job.finished = True
        return len(job.pages)

    def wait(self, timeout: float) -> None:
        """Sleep until a job is done or ``timeout`` seconds pass (an idle scheduler, nothing else to run)."""
        if self.jobs and not any(j.done.is_set() for j in self.jobs):
            self._wake.wait(timeout)
        self._wake.clear()

    def drain(self, timeout: float = 60.0) -> int:
        """Wait for every job in flight and land them (an allocation that cannot wait, flush, shutdown).
        Returns pages freed. Raises TimeoutError when a copy does not finish within ``timeout`` seconds."""
        for job in list(self.jobs):
            if not job.done.wait(timeout):
                raise TimeoutError(f"hicache: a store of {len(job.keys)} pages did not finish in {timeout}s")
        return self.poll()

    def close(self, timeout: float = 60.0) -> None:
        """Land what is queued (so ``write_back``'s ``persist`` sees it), then stop the thread. A copy stuck
        past ``timeout`` seconds is dropped with a warning (its pages are not in tier 2; the process ends)."""
        try:
            self.drain(timeout)
        except TimeoutError as e:
            logger.warning("%s; dropped at shutdown", e)
        finally:
            self._queue.put(None)
            self._thread.join(timeout=30)
