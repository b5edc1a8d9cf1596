"""Free-page allocator. It hands out page ids and takes them back; it never knows about requests."""

from __future__ import annotations


class PageAllocator:
    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self._free: list[int] = list(range(num_pages - 1, -1, -1))  # pop() hands out low ids first
        self._is_free = [True] * num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int] | None:
        """Return ``n`` page ids, or None (allocating nothing) when fewer than ``n`` are free."""
        if n > len(self._free):
            return None
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self._is_free[p] = False
        return pages

    def free(self, pages: list[int]) -> None:
        """Give pages back. Raises ValueError on a double free (a bookkeeping bug, never ignored)."""
        for p in pages:
            if self._is_free[p]:
                raise ValueError(f"page {p} freed twice")
            self._is_free[p] = True
            self._free.append(p)
