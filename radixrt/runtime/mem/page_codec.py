"""A KV page as one row of bytes: how pages leave the pool for the host tier and the disk, and come back.

A page's row is, layer by layer, its K then its V bytes (``[page_size, num_kv_heads, head_dim]`` in the
pool's own element type), then for an int8 pool the fp32 K and V scales (``[page_size, num_kv_heads]``).
These are the pool's exact bytes: a page that goes out and comes back holds what it held, so attention
over it (and greedy output) is identical to the recomputed page's (the kernels' fixed reduction order
makes a row's output depend on KV content only; docs/DESIGN.md).
"""

from __future__ import annotations

import torch


class PageCodec:
    """Packs pool pages to rows of bytes and unpacks rows into pool pages.

    Args:
        pool: a ``KVPool`` (``k``/``v`` lists of ``[num_pages, page_size, Hkv, D]`` tensors, optional
            ``k_scales``/``v_scales``).

    Attributes:
        page_bytes: bytes of one row (one page, all layers, K and V, scales included).
    """

    def __init__(self, pool) -> None:
        self.pool = pool
        self.tensors: list[torch.Tensor] = []
        for layer in range(len(pool.k)):
            self.tensors += [pool.k[layer], pool.v[layer]]
            if pool.k_scales is not None:
                self.tensors += [pool.k_scales[layer], pool.v_scales[layer]]
        self.sizes = [t[0].numel() * t.element_size() for t in self.tensors]
        self.page_bytes = sum(self.sizes)

    def _index(self, pages: list[int]) -> torch.Tensor:
        return torch.tensor(pages, dtype=torch.long, device=self.tensors[0].device)

    def pack(self, pages: list[int]) -> torch.Tensor:
        """The rows of ``pages``: uint8 ``[len(pages), page_bytes]`` on the CPU (a copy)."""
        if not pages:
            return torch.empty((0, self.page_bytes), dtype=torch.uint8)
        idx, n = self._index(pages), len(pages)
        parts = [t[idx].reshape(n, -1).view(torch.uint8) for t in self.tensors]
        return torch.cat(parts, dim=1).cpu()

    def unpack(self, pages: list[int], rows: torch.Tensor) -> None:
        """Write ``rows`` (uint8 ``[len(pages), page_bytes]``, any device) into pool ``pages``.

        Raises:
            ValueError: ``rows`` is not uint8 of that shape.
        """
        n = len(pages)
        if rows.dtype != torch.uint8 or tuple(rows.shape) != (n, self.page_bytes):
            raise ValueError(f"rows must be uint8 [{n}, {self.page_bytes}], got {rows.dtype} {tuple(rows.shape)}")
        if n == 0:
            return
        idx, off = self._index(pages), 0
        for t, size in zip(self.tensors, self.sizes):
            part = rows[:, off : off + size].contiguous().view(t.dtype).reshape((n,) + tuple(t.shape[1:]))
            t[idx] = part.to(t.device)
            off += size
