"""Anonymous memory in transparent huge pages, for the weight copies radixrt makes at load (stacked parts,
unpermuted rows, x16 repacks): each is read once per decode step from memory."""

from __future__ import annotations

import mmap

import numpy as np

HUGE = 2 << 20  # a transparent huge page (x86-64)


def huge_empty(shape: tuple, dtype=np.uint8) -> np.ndarray:
    """An uninitialised C-contiguous array in anonymous memory advised MADV_HUGEPAGE (2 MiB-aligned; plain
    ``np.empty`` under 2 MiB or where the platform has no such advice). Freed with the array.

    Why: a weight we copy (stacked gate/up, unpermuted q/k) is read once per decode step from memory. In
    4 KiB pages a batch-1 Q4_K product read it at 32-34 GB/s, in 2 MiB pages at 38-40, as fast as the file's
    own pages (3B gate/up, 2 threads, 2026-12-04). This host's THP is ``madvise``: without the advice, none.
    """
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if n < HUGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.empty(shape, dtype)
    m = mmap.mmap(-1, n + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE)
    raw = np.frombuffer(m, dtype=np.uint8)  # holds the mapping: unmapped when the last view goes
    off = -raw.ctypes.data % HUGE
    return raw[off : off + n].view(dtype).reshape(shape)
