"""The C++ paged attention op for CPU (``paged_cpu.cpp``), built at first use (:mod:`radixrt.kernels.cpp`).

``torch.ops.radixrt_attn.paged_attention(q, k_new, v_new, out_loc, k_pool, v_pool, rows, page_ptr,
kv_start, kv_end, kv_indices, page_size, scale) -> (o, lse)``:

- writes ``k_new``/``v_new`` (``[T, Hkv, D]`` fp32, any row stride) into the flat pools ``[slots, Hkv, D]``
  at ``out_loc`` (``[T]`` int64; empty: no write), then
- for each of the ``R`` query rows ``rows`` (int64 rows of ``q [T, Hq, D]`` fp32) attends to tokens
  ``[kv_start, kv_end)`` of its request, whose pages are ``kv_indices[page_ptr:]`` (int32 page ids);
- returns ``o [R, Hq, D]`` fp32 and ``lse [R, Hq]`` fp32, the natural log-sum-exp of the scaled scores
  (``-inf`` with ``o = 0`` for an empty range).

``torch.ops.radixrt_attn.block_attention(q, o, lse, rows, blocks, members, k_pool, v_pool, kv_indices,
page_size, scale)`` (``cascade_cpu.cpp``) then attends *blocks*, many rows against the same tokens (a
shared-prefix group's decode rows; an extend's rows, causal), and merges them into ``o``/``lse`` in place:
``blocks`` int64 ``[Nb, 6]`` = (member begin, member end) into ``members`` (int64 rows of ``o``), the
offset of the block's pages in ``kv_indices``, its tokens ``[start, end)``, causal (0/1)
(``paged_rows.plan_rows``).
"""

from __future__ import annotations


from radixrt.kernels import cpp


def paged_ops():
    """``torch.ops.radixrt_attn`` once built, or ``None`` where it cannot be built (then: the torch path)."""
    return cpp.ops("radixrt_attn")
