"""The attention backend interface. Backends are swappable; the model only calls ``forward``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

import torch

from radixrt.kernels.attention.metadata import AttentionMetadata


class KVCacheView(Protocol):
    """What a backend needs from the KV pool: per-layer paged buffers.

    ``k_buffer(layer)`` / ``v_buffer(layer)``: ``[num_pages, page_size, num_kv_heads, head_dim]`` of
    float32, float16, bfloat16 or int8; ``k_scale(layer)`` / ``v_scale(layer)``: an int8 pool's scales,
    fp32 ``[num_pages, page_size, num_kv_heads]`` (one per token and head; see :func:`quantize_int8`), None
    for a float pool.
    A Protocol, so that the pool (``radixrt.runtime.mem.kv_pool.KVPool``) satisfies it without importing
    the kernels: mem and kernels are independent layers.
    """

    def k_buffer(self, layer: int) -> torch.Tensor: ...

    def v_buffer(self, layer: int) -> torch.Tensor: ...

    def k_scale(self, layer: int) -> torch.Tensor | None: ...

    def v_scale(self, layer: int) -> torch.Tensor | None: ...


class AttentionBackend(ABC):
    """Paged attention over a mixed batch of extends (prefill chunks) and decodes.

    ``plan`` is called once per step with that step's metadata; ``forward`` once per layer. What else a
    backend supports it declares here (the defaults: nothing more), and callers read the declaration:

    - ``uses_groups``: ``plan`` reads ``meta.prefix_groups`` (cascade attention over shared prefixes), so
      the runner groups the decode rows; False: it does not build them.
    - ``cuda_graph``: a helper that plans captured CUDA-graph decode batches (FlashInfer's
      ``FlashInferGraphSupport``), or None: every step runs eagerly.
    - :meth:`configure` / :attr:`configured`: the model's head counts and dtypes, given once before the first
      ``plan`` (a backend that builds its kernels up front needs them).
    - :meth:`kernel_args`: the step's arguments for the fused C++ decoder layer, or None: each layer
      attends through ``forward``.
    """

    uses_groups: bool = True
    cuda_graph = None

    def configure(
        self,
        num_q_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        sm_scale: float | None = None,
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        """Take the model's attention shape before the first :meth:`plan`; the default needs none of it."""

    @property
    def configured(self) -> bool:
        """Whether :meth:`configure` has what this backend needs (always, for one that needs nothing)."""
        return True

    def kernel_args(self) -> tuple | None:
        """This step's arguments of the fused C++ decoder layer (``radixrt.kernels.layer``), or None."""
        return None

    @abstractmethod
    def plan(self, meta: AttentionMetadata) -> None:
        """Prepare for one step (index tensors, kernel plans). Called before the first layer."""

    @abstractmethod
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, kv: KVCacheView, scale: float
    ) -> torch.Tensor:
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


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., D]`` float -> (int8 ``[..., D]``, fp32 scales ``[...]``), one scale per vector:
    ``scale = max|x| / 127``, ``q = round_half_even(x / scale)``; an all-zero vector gets scale 0 and zeros.
    The C++ kernels' write (``kv_chunk.h``) rounds the same way: both store the same bytes."""
    x = x.float()
    scale = x.abs().amax(-1) / 127.0
    zero = scale == 0
    q = torch.round(x / torch.where(zero, torch.ones_like(scale), scale)[..., None]).clamp_(-127, 127)
    return q.masked_fill_(zero[..., None], 0).to(torch.int8), scale


def scales(kv: KVCacheView, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """An int8 pool's (k_scale, v_scale) of ``layer``; (None, None) for a float pool."""
    return kv.k_scale(layer), kv.v_scale(layer)


def write_kv(kv: KVCacheView, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Indexed copy of new K/V into flat slots ``loc`` (``[num_tokens]`` int64), rounded to the pool's type."""
    kb, vb = kv.k_buffer(layer), kv.v_buffer(layer)
    ks, vs = scales(kv, layer)
    if ks is None:
        kb.view(-1, kb.shape[-2], kb.shape[-1])[loc] = k.to(kb.dtype)
        vb.view(-1, vb.shape[-2], vb.shape[-1])[loc] = v.to(vb.dtype)
        return
    for buf, sbuf, x in ((kb, ks, k), (vb, vs, v)):
        qx, sx = quantize_int8(x)
        buf.view(-1, buf.shape[-2], buf.shape[-1])[loc] = qx
        sbuf.view(-1, sbuf.shape[-1])[loc] = sx


def read_kv(buf: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Pages (or slots) of a pool as ``dtype``: an int8 pool's values times their scales."""
    if scale is None:
        return buf.to(dtype)
    return (buf.to(torch.float32) * scale[..., None]).to(dtype)
