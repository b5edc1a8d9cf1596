"""Prefetch from tier 3 for queued requests: a waiting request's pages are read from their files (checked,
``DiskTier.read``) on a worker thread while the scheduler runs other requests' steps, and put into tier 2,
so its admission copies them from host memory instead of reading disk (SGLang prefetches from L3 the same
way, for requests whose storage match is long enough).

Only the worker thread touches the files; only the scheduler thread touches the tree and tier 2
(``HiCache.drain_prefetched`` takes the finished reads). A page that reached the tree in between (its
request was admitted and read it directly, or recomputed it) is dropped at drain, so a page is never in
both the pool and tier 2.
"""

from __future__ import annotations

import collections
import queue
import threading


class Prefetcher:
    """Reads ``(key, salt, start, hashes)`` jobs from ``disk`` on one daemon thread."""

    def __init__(self, disk) -> None:
        self.disk = disk
        self.jobs: queue.Queue = queue.Queue()
        self.done: collections.deque = collections.deque()  # (key, salt, start, hashes, rows) read
        self.submitted: set[tuple] = set()  # (salt, first hash) of jobs queued or done (no resubmission)
        self.pages_read = 0
        self._thread = threading.Thread(target=self._run, name="hicache-prefetch", daemon=True)
        self._thread.start()

    def take_done(self):
        """Finished jobs ``(key, salt, start, hashes, rows)``, oldest first; their runs may be queued again."""
        while self.done:
            key, salt, start, hashes, rows = self.done.popleft()
            self.submitted.discard((salt, hashes[0]))
            yield key, salt, start, hashes, rows

    def submit(self, key: list[int], salt: str | None, start: int, hashes: list[int]) -> bool:
        """Queue the reads of pages ``start..`` of ``key`` (``hashes`` are theirs). False when the same
        run was queued before (its pages are on their way or already read)."""
        tag = (salt, hashes[0])
        if tag in self.submitted:
            return False
        if len(self.submitted) > 4096:  # bounded memory: forget old runs (at worst one is read twice)
            self.submitted.clear()
        self.submitted.add(tag)
        self.jobs.put((key, salt, start, hashes))
        return True

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            key, salt, start, hashes = job
            rows = []
            for h in hashes:
                row = self.disk.read(salt, h)
                if row is None:
                    break
                rows.append(row)
            self.pages_read += len(rows)
            self.done.append((key, salt, start, hashes, rows))  # rows may stop short of hashes

    def close(self) -> None:
        self.jobs.put(None)
        self._thread.join(timeout=30)
