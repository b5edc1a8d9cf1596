"""Torch-native paged attention for CPU (and a reference on any device).

Decode rows (one new token) of a step are batched: their pages are gathered into a padded
``[B, max_kv, H, D]`` tensor once per layer and fed to one SDPA call with a padding mask. Extend rows
(several new tokens) run one SDPA call per request with a causal mask offset by the cached prefix.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from radixrt.kernels.attention.base import AttentionBackend, KVCacheView, write_kv
from radixrt.kernels.attention.metadata import AttentionMetadata


class TorchNativeBackend(AttentionBackend):
    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.meta: AttentionMetadata | None = None

    def plan(self, meta: AttentionMetadata) -> None:
        self.meta = meta
        P, B = meta.page_size, meta.batch_size
        dev = meta.kv_indices.device
        indptr = meta.kv_indptr.tolist()
        indices = meta.kv_indices.tolist()
        max_pages = max(indptr[i + 1] - indptr[i] for i in range(B))
        # Padded page table [B, max_pages] -> flat slot of every KV position [B, max_pages * P]; built
        # with a handful of tensor ops whatever the batch size.
        table = [indices[indptr[i]:indptr[i + 1]] + [0] * (max_pages - indptr[i + 1] + indptr[i]) for i in range(B)]
        pt = torch.tensor(table, dtype=torch.int64, device=dev)
        offs = torch.arange(P, dtype=torch.int64, device=dev)
        self.slots = (pt[:, :, None] * P + offs).reshape(B, -1)
        self.qo = meta.qo_indptr.tolist()
        self.decode_rows = [i for i, q in enumerate(meta.q_lens) if q == 1]
        self.extend_rows = [i for i, q in enumerate(meta.q_lens) if q > 1]
        if self.decode_rows:
            rows = torch.tensor(self.decode_rows, dtype=torch.int64, device=dev)
            lens = torch.tensor([meta.kv_lens[i] for i in self.decode_rows], dtype=torch.int64, device=dev)
            max_kv = int(lens.max())
            self.decode_gather = self.slots[rows, :max_kv]
            valid = torch.arange(max_kv, device=dev)[None, :] < lens[:, None]
            self.decode_mask = torch.zeros(valid.shape, device=dev).masked_fill_(~valid, float("-inf"))[:, None, None, :]
            self.decode_q_rows = torch.tensor([self.qo[i] for i in self.decode_rows], dtype=torch.int64, device=dev)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                kv: KVCacheView, scale: float) -> torch.Tensor:
        meta = self.meta
        write_kv(kv, layer, meta.out_cache_loc, k, v)
        kb, vb = kv.k_buffer(layer), kv.v_buffer(layer)
        kflat = kb.view(-1, kb.shape[-2], kb.shape[-1])
        vflat = vb.view(-1, vb.shape[-2], vb.shape[-1])
        out = torch.empty_like(q)
        if self.decode_rows:
            qd = q[self.decode_q_rows].unsqueeze(2)                         # [B, H, 1, D]
            kd = kflat[self.decode_gather].transpose(1, 2).to(q.dtype)      # [B, Hkv, L, D]
            vd = vflat[self.decode_gather].transpose(1, 2).to(q.dtype)
            o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=self.decode_mask.to(q.dtype),
                                               scale=scale, enable_gqa=True)
            out[self.decode_q_rows] = o.squeeze(2)
        for i in self.extend_rows:
            s, e = self.qo[i], self.qo[i + 1]
            q_len, kv_len = e - s, meta.kv_lens[i]
            qi = q[s:e].transpose(0, 1)                                      # [H, q, D]
            ki = kflat[self.slots[i, :kv_len]].transpose(0, 1).to(q.dtype)            # [Hkv, L, D]
            vi = vflat[self.slots[i, :kv_len]].transpose(0, 1).to(q.dtype)
            if q_len == kv_len:  # no cached prefix: plain causal, which takes SDPA's flash path
                o = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale, enable_gqa=True)
            else:  # causal over the cached prefix plus the new tokens (bottom-right aligned)
                rows = torch.arange(q_len, device=q.device).unsqueeze(1) + (kv_len - q_len)
                mask = torch.arange(kv_len, device=q.device).unsqueeze(0) <= rows  # [q, L] bool
                o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=scale, enable_gqa=True)
            out[s:e] = o.transpose(0, 1)
        return out
