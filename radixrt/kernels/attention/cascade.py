"""Decode attention as a cascade: shared prefixes once per group, each row's own suffix, an exact merge.

A decode row's attention over its KV ``[0, kv_len)`` is split into the ranges of its prefix groups (see
``prefix_groups.py``) and its own suffix ``[suffix_start, kv_len)``. Each range yields a partial output
``o`` and the log-sum-exp ``s`` of its scaled scores; two partials merge exactly
(FlashInfer's ``merge_state``; Hydragen, arXiv 2402.05099)::

    s = logaddexp(s_a, s_b);  o = exp(s_a - s) * o_a + exp(s_b - s) * o_b

Per layer the cost is then: one gather of each group's shared K/V (none when its pages are consecutive:
a view of the pool), one batched attention call per nesting level with the query heads of each KV head
folded into rows (``[groups, Hkv, members * G, D] x [groups, Hkv, D, L]``: a GEMM, not a loop), and one
batched call over the padded suffixes. Without groups the suffix is the whole context: the plain path.

Index tensors are built once per step by :func:`plan_decode` with tensor ops (no ``.tolist()``, no
Python loop over rows or pages); :func:`run_decode` runs once per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixrt.kernels.attention.prefix_groups import PrefixGroups

# The fused CPU flash-attention kernel returns the log-sum-exp next to the output (torch >= 2.3).
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def attend_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention that also returns the log-sum-exp of the scores (natural log).

    Args:
        q: ``[N, H, M, D]``; k, v: ``[N, H, L, D]`` (any strides), same dtype as q.
        mask: additive float mask broadcastable to ``[N, H, M, L]`` (0 or -inf), or None. Every query row
            must see at least one key.
        scale: softmax scale.

    Returns:
        ``(o, lse)``: o ``[N, H, M, D]`` in q's dtype, lse ``[N, H, M]`` float32.
    """
    if q.device.type == "cpu" and _FLASH_CPU is not None:
        return _FLASH_CPU(q, k, v, attn_mask=None if mask is None else mask.to(q.dtype), scale=scale)
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if mask is not None:
        s = s + mask
    lse = torch.logsumexp(s, dim=-1)
    return torch.matmul(torch.exp(s - lse[..., None]), v.float()).to(q.dtype), lse


def merge_state(
    o_a: torch.Tensor, s_a: torch.Tensor, o_b: torch.Tensor, s_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attentions over disjoint KV ranges into the attention over their union.

    Args:
        o_a, o_b: ``[..., D]`` partial outputs; s_a, s_b: ``[...]`` float32 log-sum-exps.

    Returns:
        ``(o, s)`` with o in o_a's dtype. Exact up to rounding (FlashInfer ``merge_state``).
    """
    s = torch.logaddexp(s_a, s_b)
    o = torch.exp(s_a - s).unsqueeze(-1) * o_a + torch.exp(s_b - s).unsqueeze(-1) * o_b
    return o.to(o_a.dtype), s


@dataclass
class LevelPlan:
    """One nesting level of groups, padded to ``[Ng, R]`` members and ``L`` shared tokens.

    Attributes:
        q_rows: int64 ``[Ng, R]`` decode-local rows (padding repeats a member; its output is dropped).
        slots: int64 ``[Ng, L]`` flat KV slots of the shared tokens, or None when ``span`` is set.
        span: ``(first, last + 1)`` slots when the level is one group on consecutive pages (a view).
        mask: float ``[Ng, 1, 1, L]`` (0 / -inf) for groups shorter than ``L``, or None.
        keep: int64 indices into the ``Ng * R`` padded members of the real ones, or None (all real).
        tgt: int64 decode-local row of each kept member, or None when they are rows ``0..Bd-1`` in order.
    """

    q_rows: torch.Tensor
    slots: torch.Tensor | None
    span: tuple[int, int] | None
    mask: torch.Tensor | None
    keep: torch.Tensor | None
    tgt: torch.Tensor | None


@dataclass
class DecodePlan:
    """Index tensors of one step's decode rows.

    Attributes:
        q_rows: int64 ``[Bd]`` token rows of the decode rows in the step's packed q.
        suffix_slots: int64 ``[Bd, S]`` flat KV slots of each row's own suffix (padded by repeating the
            row's last slot), or None when ``suffix_span`` is set.
        suffix_mask: float ``[Bd, 1, 1, S]`` (0 / -inf), or None when every suffix is ``S`` long.
        levels: the group levels, outermost first (for a lone row: its earlier runs of pages).
        suffix_span: ``(first, last + 1)`` slots of a lone decode row's last run of consecutive pages,
            read as a view of the pool instead of a gather.
    """

    q_rows: torch.Tensor
    suffix_slots: torch.Tensor | None
    suffix_mask: torch.Tensor | None
    levels: list[LevelPlan]
    suffix_span: tuple[int, int] | None = None


def _pad_mask(valid: torch.Tensor) -> torch.Tensor | None:
    """Additive ``[N, 1, 1, L]`` mask from a bool ``[N, L]`` validity table; None when all valid."""
    if bool(valid.all()):
        return None
    return torch.zeros(valid.shape).masked_fill_(~valid, float("-inf"))[:, None, None, :].to(valid.device)


def plan_decode(
    decode_rows: torch.Tensor,
    q_rows: torch.Tensor,
    kv_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    page_size: int,
    groups: PrefixGroups | None,
) -> DecodePlan:
    """Index tensors for :func:`run_decode`.

    Args:
        decode_rows: int64 ``[Bd]`` batch rows with one new token, ascending.
        q_rows: int64 ``[Bd]`` their token rows in the packed q (``qo_indptr[decode_rows]``).
        kv_lens: int64 ``[B]`` KV length of every batch row, in tokens.
        kv_indptr, kv_indices: the step's CSR page table (``AttentionMetadata``).
        page_size: tokens per page.
        groups: the step's prefix groups (rows are batch rows), or None for the plain path.
    """
    dev, P = kv_indices.device, page_size
    Bd = decode_rows.shape[0]
    kv = kv_lens[decode_rows]
    if groups is not None and groups.num_groups:
        start = torch.tensor(groups.suffix_starts, dtype=torch.int64, device=dev)[decode_rows]
    else:
        start = torch.zeros_like(kv)
    S = int((kv - start).max())
    pos = start[:, None] + torch.arange(S, device=dev)
    valid = pos < kv[:, None]
    pos = torch.minimum(pos, (kv - 1)[:, None])
    page = kv_indices.long()[kv_indptr.long()[decode_rows][:, None] + pos // P]
    slots = page * P + pos % P
    if Bd == 1 and (groups is None or not groups.num_groups):
        runs = _runs(slots[0])
        # a lone row on a few runs of consecutive pages: views, no gather. Each extra run costs an attention
        # call and a merge per layer (~70 us), which only a long context's gather outweighs (~0.65 us a token)
        if runs is not None and S >= VIEW_TOKENS_PER_RUN * (len(runs) - 1):
            one = torch.zeros(1, 1, dtype=torch.int64, device=dev)
            return DecodePlan(
                q_rows, None, None, [LevelPlan(one, None, r, None, None, None) for r in runs[:-1]], runs[-1]
            )
    return DecodePlan(q_rows, slots, _pad_mask(valid), plan_levels(groups, decode_rows, kv_lens.shape[0], P, dev))


def plan_levels(
    groups: PrefixGroups | None, decode_rows: torch.Tensor, batch_size: int, page_size: int, dev: torch.device
) -> list[LevelPlan]:
    """The group levels of :class:`DecodePlan` (outermost first); decode-local rows index ``decode_rows``."""
    if groups is None or not groups.num_groups:
        return []
    local = torch.full((batch_size,), -1, dtype=torch.int64)
    local[decode_rows.cpu()] = torch.arange(decode_rows.shape[0])
    return [_plan_level(groups, lvl, local, decode_rows.shape[0], page_size, dev) for lvl in range(groups.num_levels)]


MAX_RUNS = 4  # more runs of consecutive pages than this: one gather beats that many calls and merges
# A lone row in k runs is read as views from this many tokens per extra run, else gathered. Measured on
# SmolLM2 (3 KV heads x 64), 2 cores: 49 tokens in 3 runs 184 us as views vs 59 us gathered; 600 tokens in
# 2 runs 182 vs 439 us; 200 tokens in 4 runs 291 vs 93 us.
VIEW_TOKENS_PER_RUN = 128


def _runs(slots: torch.Tensor) -> list[tuple[int, int]] | None:
    """Split one row's slots into ``[first, last + 1)`` runs of consecutive slots; None if too many."""
    cut = torch.nonzero(slots.diff() != 1).squeeze(1) + 1
    if cut.numel() >= MAX_RUNS:
        return None
    bounds = [0, *cut.tolist(), slots.numel()]  # at most MAX_RUNS + 1 host ints
    first = slots[bounds[:-1]].tolist()
    return [(f, f + b - a) for f, a, b in zip(first, bounds[:-1], bounds[1:])]


def _plan_level(groups: PrefixGroups, lvl: int, local: torch.Tensor, Bd: int, P: int, dev: torch.device) -> LevelPlan:
    gi = [g for g, x in enumerate(groups.levels) if x == lvl]  # a loop over groups, not rows
    members = [groups.rows[g] for g in gi]
    pages = [groups.pages[g] for g in gi]
    sizes = torch.tensor([len(m) for m in members])
    R = int(sizes.max())
    rows = torch.tensor([m + m[:1] * (R - len(m)) for m in members])
    q_rows = local[rows]
    starts = torch.tensor([groups.starts[g] for g in gi])
    ends = torch.tensor([groups.ends[g] for g in gi])
    L = int((ends - starts).max())
    real = torch.arange(R)[None, :] < sizes[:, None]
    keep = None if bool(real.all()) else real.flatten().nonzero().squeeze(1)
    tgt = q_rows.flatten() if keep is None else q_rows.flatten()[keep]
    if tgt.shape[0] == Bd and torch.equal(tgt, torch.arange(Bd)):
        tgt = None
    slots = span = mask = None
    p0, s0 = pages[0][0], groups.starts[gi[0]]
    if len(gi) == 1 and pages[0] == list(range(p0, p0 + len(pages[0]))):  # consecutive pages: no gather
        first = p0 * P + s0 % P
        span = (first, first + L)
    else:
        width = max(len(p) for p in pages)
        table = torch.tensor([p + p[:1] * (width - len(p)) for p in pages])
        pos = starts[:, None] + torch.arange(L)
        mask = _pad_mask(pos < ends[:, None])
        pos = torch.minimum(pos, (ends - 1)[:, None])
        slots = (table.gather(1, pos // P - (starts // P)[:, None]) * P + pos % P).to(dev)
        mask = None if mask is None else mask.to(dev)
    return LevelPlan(
        q_rows.to(dev), slots, span, mask, None if keep is None else keep.to(dev), None if tgt is None else tgt.to(dev)
    )


def run_decode(
    plan: DecodePlan, q: torch.Tensor, kflat: torch.Tensor, vflat: torch.Tensor, scale: float
) -> torch.Tensor:
    """Cascade decode attention of one layer.

    Args:
        plan: from :func:`plan_decode`.
        q: ``[T, Hq, D]`` the step's packed queries.
        kflat, vflat: ``[num_slots, Hkv, D]`` the layer's pool, flat over ``page * P + offset``.
        scale: softmax scale.

    Returns:
        ``[Bd, Hq, D]``, the decode rows' attention outputs, in q's dtype.
    """
    qd = q[plan.q_rows]
    Bd, Hq, D = qd.shape
    Hkv = kflat.shape[1]
    G = Hq // Hkv
    if plan.suffix_span is not None:
        a, b = plan.suffix_span
        ks = kflat[a:b].to(q.dtype).transpose(0, 1).unsqueeze(0)  # [1, Hkv, S, D], a view
        vs = vflat[a:b].to(q.dtype).transpose(0, 1).unsqueeze(0)
    else:
        ks = kflat[plan.suffix_slots].to(q.dtype).transpose(1, 2)  # [Bd, Hkv, S, D]
        vs = vflat[plan.suffix_slots].to(q.dtype).transpose(1, 2)
    o, lse = attend_lse(qd.view(Bd, Hkv, G, D), ks, vs, plan.suffix_mask, scale)
    return merge_levels(plan.levels, qd, o.reshape(Bd, Hq, D), lse.reshape(Bd, Hq), kflat, vflat, scale)


def merge_levels(
    levels: list[LevelPlan],
    qd: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    kflat: torch.Tensor,
    vflat: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Attend the group levels and merge them into the suffixes' partials ``o [Bd, Hq, D]``, ``lse [Bd, Hq]``
    (float32); ``qd [Bd, Hq, D]`` the decode rows' queries. Returns the merged ``o``."""
    Bd, Hq, D = qd.shape
    Hkv = kflat.shape[1]
    G = Hq // Hkv
    for lv in levels:
        Ng, R = lv.q_rows.shape
        qg = qd[lv.q_rows].view(Ng, R, Hkv, G, D).transpose(1, 2).reshape(Ng, Hkv, R * G, D)
        if lv.span is not None:
            kg = kflat[lv.span[0] : lv.span[1]].to(qd.dtype).transpose(0, 1).unsqueeze(0)  # a view
            vg = vflat[lv.span[0] : lv.span[1]].to(qd.dtype).transpose(0, 1).unsqueeze(0)
        else:
            kg = kflat[lv.slots].to(qd.dtype).transpose(1, 2)  # [Ng, Hkv, L, D]
            vg = vflat[lv.slots].to(qd.dtype).transpose(1, 2)
        og, sg = attend_lse(qg, kg, vg, lv.mask, scale)  # [Ng, Hkv, R*G, D]
        og = og.view(Ng, Hkv, R, G, D).transpose(1, 2).reshape(Ng * R, Hq, D)
        sg = sg.view(Ng, Hkv, R, G).transpose(1, 2).reshape(Ng * R, Hq)
        if lv.keep is not None:
            og, sg = og[lv.keep], sg[lv.keep]
        if lv.tgt is None:
            o, lse = merge_state(o, lse, og, sg)
        else:
            mo, ms = merge_state(o[lv.tgt], lse[lv.tgt], og, sg)
            o = o.index_copy(0, lv.tgt, mo)
            lse = lse.index_copy(0, lv.tgt, ms)
    return o
