"""FlashInfer's plan arrays from our :class:`AttentionMetadata`, and their padding for CUDA-graph batches: pure
functions of torch tensors and Python lists, tested on the CPU (``tests/kernels/test_flashinfer_plan.py``) apart
from the backend (``flashinfer.py``), which needs CUDA and the ``flashinfer`` package.

How our :class:`AttentionMetadata` maps onto FlashInfer's paged-KV API
--------------------------------------------------------------------
The metadata already is FlashInfer's CSR page table, so no page list is rebuilt:

- ``paged_kv_indices`` is ``meta.kv_indices`` as is (int32, on the device);
- ``qo_indptr``, ``paged_kv_indptr`` and ``paged_kv_last_page_len`` are recomputed **on the host** from the
  Python lists ``meta.q_lens`` / ``meta.kv_lens`` (``pages_i = ceil(kv_len_i / P)``,
  ``last_i = kv_len_i - (pages_i - 1) * P``). FlashInfer's ``plan()`` reads these three on the CPU to
  build its work schedule; handing it host tensors saves a device-to-host sync per step. They equal
  ``meta``'s own tensors by construction (tested);
- the KV cache is passed as the tuple ``(k_buffer(layer), v_buffer(layer))`` of
  ``[num_pages, page_size, num_kv_heads, head_dim]`` tensors, i.e. ``kv_layout="NHD"``.
"""

from __future__ import annotations

import torch

from radixrt.kernels.attention.metadata import AttentionMetadata

# Graph-captured decode batches pad up to a bucket size; a padded row reads this page (any existing page
# would do: its output is dropped) and writes nothing of its own (see FlashInferGraphSupport).
DUMMY_PAGE = 0


def _cumsum(xs: list[int]) -> list[int]:
    out = [0]
    for x in xs:
        out.append(out[-1] + x)
    return out


def plan_args(meta: AttentionMetadata, num_q_heads: int, num_kv_heads: int, head_dim: int) -> dict:
    """What ``plan()`` of the chosen FlashInfer wrapper gets for this step.

    Returns:
        ``{"mode": "decode" | "prefill", "plan": kwargs, "kv_lens": [...]}``. For ``decode`` the kwargs
        are those of ``BatchDecodeWithPagedKVCacheWrapper.plan`` (``indptr``, ``indices``,
        ``last_page_len``, ``num_qo_heads``, ``num_kv_heads``, ``head_dim``, ``page_size``); for
        ``prefill`` those of ``BatchPrefillWithPagedKVCacheWrapper.plan`` (``qo_indptr``,
        ``paged_kv_indptr``, ``paged_kv_indices``, ``paged_kv_last_page_len``, ``num_qo_heads``,
        ``num_kv_heads``, ``head_dim_qk``, ``page_size``, ``causal=True``). Index pointers and last-page
        lengths are host int32 tensors; the page indices are ``meta.kv_indices`` itself.

    Raises:
        ValueError: head counts that do not form grouped-query attention, or an empty batch.
    """
    if num_q_heads < 1 or num_kv_heads < 1 or num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads ({num_q_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})")
    if meta.batch_size == 0:
        raise ValueError("cannot plan an empty batch")
    P = meta.page_size
    pages = [(kv + P - 1) // P for kv in meta.kv_lens]
    last = [kv - (n - 1) * P for kv, n in zip(meta.kv_lens, pages)]
    i32 = dict(dtype=torch.int32)
    kv_indptr = torch.tensor(_cumsum(pages), **i32)
    last_page_len = torch.tensor(last, **i32)
    if meta.is_decode:
        plan = dict(
            indptr=kv_indptr,
            indices=meta.kv_indices,
            last_page_len=last_page_len,
            num_qo_heads=num_q_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            page_size=P,
        )
        mode = "decode"
    else:
        plan = dict(
            qo_indptr=torch.tensor(_cumsum(meta.q_lens), **i32),
            paged_kv_indptr=kv_indptr,
            paged_kv_indices=meta.kv_indices,
            paged_kv_last_page_len=last_page_len,
            num_qo_heads=num_q_heads,
            num_kv_heads=num_kv_heads,
            head_dim_qk=head_dim,
            page_size=P,
            causal=True,
        )
        mode = "prefill"
    return {"mode": mode, "plan": plan, "kv_lens": list(meta.kv_lens)}


def slots_from_plan(args: dict) -> list[torch.Tensor]:
    """Per request, the flat KV slots (``page * P + offset``) its attention reads, from ``plan_args``' output.

    The inverse view of the page table, used to check the plan against the torch-native backend.
    """
    p = args["plan"]
    if args["mode"] == "decode":
        indptr, indices, last = p["indptr"], p["indices"], p["last_page_len"]
    else:
        indptr, indices, last = p["paged_kv_indptr"], p["paged_kv_indices"], p["paged_kv_last_page_len"]
    P = p["page_size"]
    indices = indices.to("cpu", torch.int64)
    offs = torch.arange(P, dtype=torch.int64)
    out = []
    for i in range(len(last)):
        s, e = int(indptr[i]), int(indptr[i + 1])
        kv_len = (e - s - 1) * P + int(last[i])
        out.append((indices[s:e, None] * P + offs[None, :]).reshape(-1)[:kv_len])
    return out


def pad_decode_plan(plan: dict, padded_bs: int, dummy_page: int = DUMMY_PAGE) -> dict:
    """Pad a decode plan (``plan_args(...)["plan"]``) to ``padded_bs`` rows for a captured graph.

    Each padded row gets one page, ``dummy_page``, holding one token (``last_page_len == 1``): a valid,
    tiny attention whose output is dropped. Real rows are unchanged and stay first.

    Raises:
        ValueError: ``padded_bs`` below the real batch size.
    """
    bs = len(plan["last_page_len"])
    extra = padded_bs - bs
    if extra < 0:
        raise ValueError(f"padded_bs {padded_bs} is below the batch size {bs}")
    if extra == 0:
        return dict(plan)
    indptr = plan["indptr"]
    tail = indptr[-1] + torch.arange(1, extra + 1, dtype=indptr.dtype)
    indices = plan["indices"]
    pad_pages = torch.full((extra,), dummy_page, dtype=indices.dtype, device=indices.device)
    return {
        **plan,
        "indptr": torch.cat([indptr, tail]),
        "indices": torch.cat([indices, pad_pages]),
        "last_page_len": torch.cat([plan["last_page_len"], torch.ones(extra, dtype=plan["last_page_len"].dtype)]),
    }


def pad_out_cache_loc(loc: torch.Tensor, padded_bs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad a decode step's write slots to ``padded_bs`` rows.

    Returns ``(loc, valid)``: padded rows write to real row 0's slot, and ``valid`` (bool) marks the real
    rows. In the graph, padded rows write row 0's own K/V there (see ``FlashInferBackend.forward``), so
    the duplicate writes carry identical values and no page outside the batch is touched.
    """
    bs = loc.shape[0]
    if bs < 1 or padded_bs < bs:
        raise ValueError(f"cannot pad {bs} rows to {padded_bs}")
    valid = torch.zeros(padded_bs, dtype=torch.bool)
    valid[:bs] = True
    if padded_bs == bs:
        return loc, valid.to(loc.device)
    return torch.cat([loc, loc[:1].expand(padded_bs - bs)]), valid.to(loc.device)
