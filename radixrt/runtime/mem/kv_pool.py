"""Paged K/V tensors. Per layer, K and V are ``[num_pages, page_size, num_kv_heads, head_dim]``.

A token's KV lives at flat slot ``page * page_size + offset``. The pool knows nothing of requests or of
the radix tree; the allocator hands out page ids.
"""
from __future__ import annotations

import numpy as np
import torch

_NP = {torch.float32: np.float32, torch.float16: np.float16}


def _zeros(shape: tuple, dtype: torch.dtype, device) -> torch.Tensor:
    """Zeros that take no memory until written: on the CPU numpy's ``zeros`` is ``calloc``, whose large
    blocks are the kernel's zero pages (``torch.zeros`` writes every byte, so a pool sized from free memory
    would be resident at once)."""
    if torch.device(device).type == "cpu" and dtype in _NP:
        return torch.from_numpy(np.zeros(shape, dtype=_NP[dtype]))
    return torch.zeros(shape, dtype=dtype, device=device)


class KVPool:
    """The attention backends' ``KVCacheView`` (a Protocol in :mod:`radixrt.kernels.attention.base`)."""

    def __init__(self, num_pages: int, page_size: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"num_pages ({num_pages}) and page_size ({page_size}) must be >= 1")
        self.num_pages, self.page_size = num_pages, page_size
        shape = (num_pages, page_size, num_kv_heads, head_dim)
        self.k = [_zeros(shape, dtype, device) for _ in range(num_layers)]
        self.v = [_zeros(shape, dtype, device) for _ in range(num_layers)]
        self.nbytes = 2 * sum(t.numel() * t.element_size() for t in self.k)

    def k_buffer(self, layer: int) -> torch.Tensor:
        return self.k[layer]

    def v_buffer(self, layer: int) -> torch.Tensor:
        return self.v[layer]

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """KV bytes one token takes across all layers (K and V)."""
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
