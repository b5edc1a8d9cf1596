"""Cache tiers for ``radixrt profile``'s replay: the server's own ``HiCache`` logic (``mem/hicache.py``:
what goes down on eviction, what a match restores, the same eviction order) over stand-ins that hold no
bytes, since a replay has no KV: pages are one byte each, and tier 3 is an in-memory LRU of page names."""

from __future__ import annotations

import collections
from typing import Callable, Optional

import torch

from radixrt.runtime.mem.hicache import HiCache
from radixrt.runtime.mem.host_tier import HostTier


class NullCodec:
    """``PageCodec``'s interface for pages without content: every row is one zero byte."""

    page_bytes = 1

    def pack(self, pages: list[int]) -> torch.Tensor:
        return torch.zeros((len(pages), 1), dtype=torch.uint8)

    def unpack(self, pages: list[int], rows: torch.Tensor) -> None:
        pass


class MemoryDisk:
    """``DiskTier``'s interface as a set of page names bounded by ``max_pages`` (0: none), least recently
    written or read first out, as ``DiskTier`` with ``--hicache-storage-size``."""

    def __init__(self, max_pages: int = 0) -> None:
        self.max_pages = max_pages
        self._lru: collections.OrderedDict[tuple, None] = collections.OrderedDict()

    def __contains__(self, key: tuple) -> bool:
        return key in self._lru

    def write(self, salt: Optional[str], page_hash: int, row: bytes) -> bool:
        k = (salt, page_hash)
        if k in self._lru:
            return False
        self._lru[k] = None
        while self.max_pages and len(self._lru) > self.max_pages:
            self._lru.popitem(last=False)
        return True

    def read(self, salt: Optional[str], page_hash: int) -> Optional[bytes]:
        k = (salt, page_hash)
        if k not in self._lru:
            return None
        self._lru.move_to_end(k)
        return b"\0"

    def close(self) -> None:
        pass


def make_tiers(
    tree,
    allocate: Callable[[int], Optional[list[int]]],
    host_pages: int,
    disk_pages: Optional[int],
    write_policy: str = "write_through",
) -> HiCache:
    """A ``HiCache`` under ``tree``: ``host_pages`` in tier 2 (>= 1), tier 3 of ``disk_pages`` (0: no
    bound; None: no tier 3). No prefetch: a replay has no queue to read ahead of."""
    disk = MemoryDisk(disk_pages) if disk_pages is not None else None
    return HiCache(
        tree,
        NullCodec(),
        allocate,
        HostTier(host_pages, 1, on_drop=tree.policy.dropped),
        disk,
        write_policy,
        prefetch=False,
    )
