"""The attention backend interface. Backends are swappable; the model only calls ``forward``."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

import torch

from radixrt.kernels.attention.metadata import AttentionMetadata


class KVCacheView(Protocol):
    """What a backend needs from the KV pool: per-layer paged buffers.

    ``k_buffer(layer)`` / ``v_buffer(layer)``: ``[num_pages, page_size, num_kv_heads, head_dim]``.
    A Protocol, so that the pool (``radixrt.runtime.mem.kv_pool.KVPool``) satisfies it without importing
    the kernels: mem and kernels are independent layers.
    """

    def k_buffer(self, layer: int) -> torch.Tensor: ...

    def v_buffer(self, layer: int) -> torch.Tensor: ...


class AttentionBackend(ABC):
    """Paged attention over a mixed batch of extends (prefill chunks) and decodes.

    ``plan`` is called once per step with that step's metadata; ``forward`` once per layer.
    """

    @abstractmethod
    def plan(self, meta: AttentionMetadata) -> None:
        """Prepare for one step (index tensors, kernel plans). Called before the first layer."""

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                kv: KVCacheView, scale: float) -> torch.Tensor:
        """Write the new tokens' K/V into the pool, then attend.

        Args:
            q: ``[num_tokens, num_q_heads, head_dim]``.
            k, v: ``[num_tokens, num_kv_heads, head_dim]``, the new tokens of this step.
            layer: layer index.
            kv: the KV pool.
            scale: softmax scale, usually ``head_dim ** -0.5``.

        Returns:
            ``[num_tokens, num_q_heads, head_dim]``, same dtype as q.
        """


def write_kv(kv: KVCacheView, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Indexed copy of new K/V into flat slots ``loc`` (``[num_tokens]`` int64)."""
    kb, vb = kv.k_buffer(layer), kv.v_buffer(layer)
    kb.view(-1, kb.shape[-2], kb.shape[-1])[loc] = k.to(kb.dtype)
    vb.view(-1, vb.shape[-2], vb.shape[-1])[loc] = v.to(vb.dtype)
