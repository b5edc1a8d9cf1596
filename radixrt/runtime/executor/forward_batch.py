"""ForwardBatch: everything one forward pass needs, assembled by ``ModelRunner.prepare``.

The scheduler decides which rows (``ScheduledBatch``) run; the runner packs them into this plain
dataclass (nano-vllm's ``prepare_model_input``, SGLang's ``ForwardBatch``); the output processor reads the
logit rows back by request. Token rows are packed request after request, in batch order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from radixrt.kernels.attention.metadata import AttentionMetadata
from radixrt.kernels.attention.prefix_groups import PrefixGroups

if TYPE_CHECKING:
    from radixrt.runtime.executor.scheduled_batch import Row
    from radixrt.runtime.scheduler.request import Req


@dataclass
class ForwardBatch:
    """One step's model input.

    Attributes:
        input_ids: int64 ``[T]`` on CPU, the new tokens of every request, packed.
        positions: int64 ``[T]`` on CPU, each token's position in its sequence (for RoPE).
        attn_meta: the paged-attention metadata (``qo_indptr``, ``kv_indptr``, ``kv_indices``,
            ``kv_last_page_len``, ``out_cache_loc``), see kernels/attention/metadata.py.
        logit_rows: int64 ``[R]`` on CPU, the packed token rows whose logits ``ModelRunner.forward``
            returns, in this order; ``forward`` returns fp32 ``[R, vocab]``.
        sample_at: ``(req, i)``: logits row ``i`` is sampled for ``req`` (its last prompt or output token).
        input_logprob_at: ``(req, i, p)``: logits row ``i`` scores input token ``req.input_ids[p]``.
        prefix_groups: shared-prefix (cascade) decode groups: decode rows whose requests share a radix
            node path of a few pages, each group with its shared pages and token range, and each row's
            suffix start (kernels/attention/prefix_groups.py). The same object is ``attn_meta``'s
            ``prefix_groups``, which the attention backend reads; None when nothing is shared or
            ``--disable-cascade-attention`` is set.
        all_rows: ``logit_rows`` is every token row in order (a decode step): ``forward`` skips the gather.
        verify_at: ``(row, i)``: a row carrying ``k = len(row.drafts)`` draft tokens; logits rows
            ``i .. i + k`` score its last ``k + 1`` positions (the speculator's ``accept`` verifies them).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_meta: AttentionMetadata
    logit_rows: torch.Tensor
    sample_at: list[tuple["Req", int]] = field(default_factory=list)
    input_logprob_at: list[tuple["Req", int, int]] = field(default_factory=list)
    prefix_groups: PrefixGroups | None = None
    all_rows: bool = False
    verify_at: list[tuple["Row", int]] = field(default_factory=list)

    @classmethod
    def make(
        cls, input_ids: list[int], positions: list[int], attn_meta: AttentionMetadata, logit_rows: list[int], **kw
    ) -> "ForwardBatch":
        """Build from Python lists (ids and positions of equal length ``T``; rows in ``[0, T)``).

        Raises:
            ValueError: ``input_ids`` and ``positions`` differ in length, or a row is out of range.
        """
        if len(input_ids) != len(positions):
            raise ValueError(f"input_ids has {len(input_ids)} tokens, positions {len(positions)}")
        if any(not 0 <= r < len(input_ids) for r in logit_rows):
            raise ValueError(f"logit_rows must lie in [0, {len(input_ids)})")
        i64 = dict(dtype=torch.int64)
        return cls(
            torch.tensor(input_ids, **i64),
            torch.tensor(positions, **i64),
            attn_meta,
            torch.tensor(logit_rows, **i64),
            all_rows=logit_rows == list(range(len(input_ids))),
            **kw,
        )

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
