"""Paged K/V tensors. Per layer, K and V are ``[num_pages, page_size, num_kv_heads, head_dim]``.

A token's KV lives at flat slot ``page * page_size + offset``. The pool knows nothing of requests or of
the radix tree; the allocator hands out page ids.

Element types (``--kv-cache-dtype``): fp32, fp16, bf16, or int8 with one fp32 scale per (token, KV head) (``[num_pages,
page_size, num_kv_heads]`` beside each int8 tensor): ``scale = max|x| / 127``, ``q = round_half_even(x / scale)``
(``kernels.attention.base.quantize_int8``; the C++ kernels write the same bytes). A per-token scale is written once with
its token, so a later token of the same page never changes an earlier token's stored values (a per-page scale rewritten
as the page fills would, and so would break cache- and batch-invariance).
"""

from __future__ import annotations

import numpy as np
import torch

_NP = {torch.float32: np.float32, torch.float16: np.float16, torch.int8: np.int8}
KV_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "int8": torch.int8}


def _zeros(shape: tuple, dtype: torch.dtype, device) -> torch.Tensor:
    """Zeros that take no memory until written: on the CPU numpy's ``zeros`` is ``calloc``, whose large
    blocks are the kernel's zero pages (``torch.zeros`` writes every byte, so a pool sized from free memory
    would be resident at once)."""
    if torch.device(device).type == "cpu" and dtype in _NP:
        return torch.from_numpy(np.zeros(shape, dtype=_NP[dtype]))
    if torch.device(device).type == "cpu" and dtype == torch.bfloat16:  # numpy has no bf16: calloc int16
        return torch.from_numpy(np.zeros(shape, dtype=np.int16)).view(torch.bfloat16)
    return torch.zeros(shape, dtype=dtype, device=device)


class KVPool:
    """The attention backends' ``KVCacheView`` (a Protocol in :mod:`radixrt.kernels.attention.base`).

    Args:
        dtype: the element type: ``torch.float32``, ``float16``, ``bfloat16`` or ``int8`` (then with scales).

    Raises:
        ValueError: a page count or page size below 1, or another dtype.
    """

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"num_pages ({num_pages}) and page_size ({page_size}) must be >= 1")
        if dtype not in KV_DTYPES.values():
            raise ValueError(f"kv_cache_dtype must be one of {tuple(KV_DTYPES)}, got {dtype}")
        self.num_pages, self.page_size, self.dtype = num_pages, page_size, dtype
        shape = (num_pages, page_size, num_kv_heads, head_dim)
        self.k = [_zeros(shape, dtype, device) for _ in range(num_layers)]
        self.v = [_zeros(shape, dtype, device) for _ in range(num_layers)]
        self.k_scales = self.v_scales = None
        if dtype == torch.int8:
            self.k_scales = [_zeros(shape[:3], torch.float32, device) for _ in range(num_layers)]
            self.v_scales = [_zeros(shape[:3], torch.float32, device) for _ in range(num_layers)]
        self.nbytes = num_pages * page_size * self.bytes_per_token(num_layers, num_kv_heads, head_dim, dtype)

    def k_buffer(self, layer: int) -> torch.Tensor:
        return self.k[layer]

    def v_buffer(self, layer: int) -> torch.Tensor:
        return self.v[layer]

    def k_scale(self, layer: int) -> torch.Tensor | None:
        """int8 pools: fp32 ``[num_pages, page_size, num_kv_heads]``; None otherwise."""
        return None if self.k_scales is None else self.k_scales[layer]

    def v_scale(self, layer: int) -> torch.Tensor | None:
        return None if self.v_scales is None else self.v_scales[layer]

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """KV bytes one token takes across all layers (K and V; int8 with its fp32 scale per head)."""
        per_head = head_dim * torch.empty((), dtype=dtype).element_size() + (4 if dtype == torch.int8 else 0)
        return 2 * num_layers * num_kv_heads * per_head
