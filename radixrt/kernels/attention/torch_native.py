"""Torch-native paged attention for CPU (and a reference on any device).

Decode rows (one new token) run as a cascade (``cascade.py``): when the step's metadata carries
``prefix_groups``, each group's shared prefix is attended once for all its members and only each row's
own suffix is gathered; without groups the suffix is the whole context (the plain path). Either way the
decode rows of a step are one batched call per level, with the query heads folded per KV head.

Extend rows (several new tokens) run one SDPA call per request with a causal mask offset by the cached
prefix.

With ``kernel=True`` (the default for fp32 queries on a CPU where the C++ library builds; the pool may be
fp32, fp16, bf16 or int8), every row goes to two C++ calls per layer instead (``paged_rows.py``): the paged
kernel writes the step's K/V and attends each decode row through the page table; the block kernel attends
each extend as one causal block, as small GEMMs. Both reduce a row's tokens in chunks aligned to absolute
positions, folded in a fixed order (``kv_chunk.h``), so a row's output does not depend on its batch, on the
prefill's chunking, or on a cached prefix. Shared-prefix groups (attended once for all their members,
merged by log-sum-exp) are opt-in there (``cascade=True``): that merge is not the fixed order.

The torch path (no C++ library) reads fp16/bf16 pools by casting the slots it gathers; an int8 pool's
pages of the step are dequantized once per layer into a compact fp32 copy (its page ids remapped). It is
not batch-invariant (SDPA's reduction order depends on the shapes).
"""

from __future__ import annotations

import dataclasses
from itertools import accumulate

import torch
import torch.nn.functional as F

from radixrt.kernels.attention.base import AttentionBackend, KVCacheView, read_kv, scales, write_kv
from radixrt.kernels.attention.cascade import DecodePlan, plan_decode, run_decode
from radixrt.kernels.attention.metadata import AttentionMetadata
from radixrt.kernels.attention.paged_cpu import paged_ops
from radixrt.kernels.attention.paged_rows import RowPlan, plan_rows


_NO_SCALE = torch.zeros(0)  # the C++ kernels' scale arguments for a float pool


class TorchNativeBackend(AttentionBackend):
    """``kernel``: use the C++ paged kernels (fp32 queries on the CPU only); ``None`` means: where they build.
    ``dtype``: the queries' (model's) dtype. ``cascade``: with the kernels, attend shared-prefix groups once
    per group (faster for many rows on a long shared prefix; not batch-invariant). ``kv_dtype``: the pool's
    element type (the torch path plans an int8 pool's steps on compact pages). ``uses_groups`` tells the
    model runner whether to plan groups at all."""

    def __init__(
        self,
        device: torch.device | str = "cpu",
        kernel: bool | None = None,
        dtype: torch.dtype = torch.float32,
        cascade: bool = False,
        kv_dtype: torch.dtype | None = None,
    ):
        self.device = torch.device(device)
        usable = self.device.type == "cpu" and dtype == torch.float32
        self.ops = paged_ops() if usable and kernel is not False else None
        if kernel and self.ops is None:
            raise ValueError("the C++ paged attention kernels need fp32 queries on an AVX2 CPU with gcc")
        self.cascade, self.kv_dtype = cascade, kv_dtype
        self.uses_groups = cascade or self.ops is None
        self.pages: torch.Tensor | None = None  # torch path, int8 pool: the step's pages, ascending
        self.loc: torch.Tensor | None = None  # the step's real out_cache_loc (meta's may be remapped)
        self.meta: AttentionMetadata | None = None
        self.decode: DecodePlan | None = None
        self.rows: RowPlan | None = None

    def plan(self, meta: AttentionMetadata) -> None:
        """Build the step's index tensors: tensor ops only, no host round trips of the page table."""
        self.meta = meta
        groups = meta.prefix_groups if meta.prefix_groups is not None and meta.prefix_groups.num_groups else None
        self.decode, self.pages, self.loc = None, None, meta.out_cache_loc
        if self.ops is not None:
            self.rows = plan_rows(meta, groups if self.cascade else None)
            self.extend_rows = []
        else:
            if self.kv_dtype == torch.int8:
                self.meta = meta = self._compact(meta)
                groups = None
            self._plan_torch(meta, groups)

    def _compact(self, meta: AttentionMetadata) -> AttentionMetadata:
        """The torch path over an int8 pool: page ids remapped onto the step's own pages (``self.pages``),
        which forward dequantizes; no groups (their page lists are pool ids)."""
        self.pages, inv = torch.unique(meta.kv_indices.long(), return_inverse=True)
        return dataclasses.replace(meta, kv_indices=inv.to(meta.kv_indices.dtype), prefix_groups=None)

    def kernel_args(self) -> tuple | None:
        """``(out_cache_loc, rows, page_ptr, kv_start, kv_end, kv_indices, page_size, blocks, members,
        scatter)``, the C++ kernels' arguments for this step (``paged_cpu.py``), or ``None`` without them.
        ``scatter``: their rows are not in token order (decode rows first, then extends), so the output goes
        back to them. The one-op decoder layer (:mod:`radixrt.kernels.layer`) takes them."""
        if self.ops is None:
            return None
        r, m = self.rows, self.meta
        return (
            m.out_cache_loc,
            r.rows,
            r.page_ptr,
            r.start,
            r.end,
            m.kv_indices,
            m.page_size,
            r.blocks,
            r.members,
            not r.covers_all,
        )

    @property
    def qo(self) -> list[int]:
        """Token offset of each request in the packed q (``qo_indptr`` on the host); derived, since only
        the SDPA extends need it (a decode step does not)."""
        return list(accumulate(self.meta.q_lens, initial=0))

    def _plan_torch(self, meta: AttentionMetadata, groups) -> None:
        dev = meta.kv_indices.device
        q_lens = torch.tensor(meta.q_lens, dtype=torch.int64)
        all_decode = max(meta.q_lens) == 1
        decode_rows = torch.arange(meta.batch_size) if all_decode else (q_lens == 1).nonzero().squeeze(1)
        self.extend_rows = [] if all_decode else [i for i, n in enumerate(meta.q_lens) if n > 1]
        if decode_rows.numel():
            decode_rows = decode_rows.to(dev)
            q_rows = decode_rows if all_decode else meta.qo_indptr.long()[decode_rows]
            kv_lens = torch.tensor(meta.kv_lens, dtype=torch.int64, device=dev)
            self.decode = plan_decode(
                decode_rows, q_rows, kv_lens, meta.kv_indptr, meta.kv_indices, meta.page_size, groups
            )

    @property
    def slots(self) -> torch.Tensor:
        """int64 ``[B, max_pages * P]``: every request's flat KV slots, padded (a view for checks)."""
        meta, P = self.meta, self.meta.page_size
        counts = meta.kv_indptr.long().diff()
        B = counts.shape[0]
        row = torch.repeat_interleave(torch.arange(B, device=counts.device), counts)
        col = torch.arange(row.shape[0], device=counts.device) - meta.kv_indptr.long()[row]
        table = torch.zeros(B, int(counts.max()), dtype=torch.int64, device=counts.device)
        table[row, col] = meta.kv_indices.long()
        return (table[:, :, None] * P + torch.arange(P, device=counts.device)).reshape(B, -1)

    def _extend_slots(self, i: int, page_start: int) -> torch.Tensor:
        meta, P = self.meta, self.meta.page_size
        kv_len = meta.kv_lens[i]
        pages = meta.kv_indices[page_start : page_start - (-kv_len // P)].long()
        return (pages[:, None] * P + torch.arange(P, device=pages.device)).reshape(-1)[:kv_len]

    def _kernel(self, q, k, v, kflat, vflat, ks, vs, scale) -> torch.Tensor:
        """Write the step's K/V and attend every row: ``[T, Hq, D]``."""
        r, meta = self.rows, self.meta
        o, lse = self.ops.paged_attention(
            q,
            k,
            v,
            meta.out_cache_loc,
            kflat,
            vflat,
            ks,
            vs,
            r.rows,
            r.page_ptr,
            r.start,
            r.end,
            meta.kv_indices,
            meta.page_size,
            scale,
        )
        if r.blocks.shape[0]:
            self.ops.block_attention(
                q, o, lse, r.rows, r.blocks, r.members, kflat, vflat, ks, vs, meta.kv_indices, meta.page_size, scale
            )
        if r.covers_all:
            return o
        out = torch.empty_like(q)
        out[r.rows] = o
        return out

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, kv: KVCacheView, scale: float
    ) -> torch.Tensor:
        meta = self.meta
        kb, vb = kv.k_buffer(layer), kv.v_buffer(layer)
        ks, vs = scales(kv, layer)
        if self.ops is not None:
            flat = [t.view(-1, t.shape[-2], t.shape[-1]) for t in (kb, vb)]
            sc = [_NO_SCALE if s is None else s.view(-1, s.shape[-1]) for s in (ks, vs)]
            return self._kernel(q, k, v, *flat, *sc, scale)
        write_kv(kv, layer, self.loc, k, v)
        if ks is not None:  # int8: the step's pages dequantized, in the remapped order of plan()
            kb, vb = read_kv(kb[self.pages], ks[self.pages], q.dtype), read_kv(vb[self.pages], vs[self.pages], q.dtype)
        kflat = kb.view(-1, kb.shape[-2], kb.shape[-1])
        vflat = vb.view(-1, vb.shape[-2], vb.shape[-1])
        if self.decode is not None and not self.extend_rows:
            return run_decode(self.decode, q, kflat, vflat, scale)
        out = torch.empty_like(q)
        if self.decode is not None:
            out[self.decode.q_rows] = run_decode(self.decode, q, kflat, vflat, scale)
        qo, page_ptr = self.qo, meta.kv_indptr.tolist()  # host offsets, once per layer with extends
        for i in self.extend_rows:
            s, e = qo[i], qo[i + 1]
            q_len, kv_len = e - s, meta.kv_lens[i]
            slots = self._extend_slots(i, page_ptr[i])
            # 4-D [1, H, L, D]: with 3-D inputs torch's CPU SDPA takes its math path (measured: 1024 causal
            # tokens, 9 q / 3 kv heads: 102 ms vs 14 ms through the flash kernel)
            qi = q[s:e].transpose(0, 1).unsqueeze(0)  # [1, H, q, D]
            ki = kflat[slots].transpose(0, 1).unsqueeze(0).to(q.dtype)  # [1, Hkv, L, D]
            vi = vflat[slots].transpose(0, 1).unsqueeze(0).to(q.dtype)
            if q_len == kv_len:  # no cached prefix: plain causal
                o = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale, enable_gqa=True)
            else:  # causal over the cached prefix plus the new tokens (bottom-right aligned)
                rows = torch.arange(q_len, device=q.device).unsqueeze(1) + (kv_len - q_len)
                mask = torch.arange(kv_len, device=q.device).unsqueeze(0) <= rows  # [q, L] bool
                o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=scale, enable_gqa=True)
            out[s:e] = o[0].transpose(0, 1)
        return out
