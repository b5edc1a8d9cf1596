"""Per-batch attention metadata in FlashInfer's paged layout.

For a batch of B requests (extends first or mixed with decodes, in any order):

- ``qo_indptr``  ``[B+1]`` int32: request i's new (query) tokens are rows ``qo_indptr[i]:qo_indptr[i+1]``.
- ``kv_indptr``  ``[B+1]`` int32: request i's pages are ``kv_indices[kv_indptr[i]:kv_indptr[i+1]]``.
- ``kv_indices`` ``[nnz_pages]`` int32: page ids, in token order.
- ``kv_last_page_len`` ``[B]`` int32: tokens used in each request's last page, in ``1..page_size``.
- ``out_cache_loc`` ``[num_tokens]`` int64: flat KV slot (``page * page_size + offset``) of every new token.
- ``prefix_groups`` (optional): decode rows sharing cached prefixes, for cascade attention (prefix_groups.py).

The KV length of request i (cached prefix plus new tokens) is
``(kv_indptr[i+1] - kv_indptr[i] - 1) * page_size + kv_last_page_len[i]``. Query rows attend causally to
the KV of their own request: row j of a request with q_len new tokens and kv_len total tokens sees
positions ``< kv_len - q_len + j + 1``. The same object feeds the torch-native and FlashInfer backends, so
it is tested on CPU once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixrt.kernels.attention.prefix_groups import PrefixGroups


@dataclass
class AttentionMetadata:
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    out_cache_loc: torch.Tensor
    page_size: int
    q_lens: list[int]
    kv_lens: list[int]
    prefix_groups: PrefixGroups | None = None

    @property
    def batch_size(self) -> int:
        return len(self.q_lens)

    @property
    def is_decode(self) -> bool:
        """True when every request has exactly one new token (a pure decode step)."""
        return all(q == 1 for q in self.q_lens)

    @classmethod
    def build(
        cls,
        page_tables: list[list[int]],
        q_lens: list[int],
        kv_lens: list[int],
        page_size: int,
        device: torch.device | str = "cpu",
        prefix_groups: PrefixGroups | None = None,
    ) -> "AttentionMetadata":
        """Build the metadata for one forward step.

        Args:
            page_tables: per request, its page ids (at least ``ceil(kv_len / page_size)`` of them).
            q_lens: per request, the number of new tokens computed this step (>= 1).
            kv_lens: per request, the KV length after this step, in tokens (>= q_len).
            page_size: tokens per page.
            prefix_groups: decode rows that share cached prefixes (shared-prefix attention), or None.

        Raises:
            ValueError: on inconsistent lengths (a q_len above its kv_len, or too few pages).
        """
        if not (len(page_tables) == len(q_lens) == len(kv_lens)):
            raise ValueError("page_tables, q_lens and kv_lens must have one entry per request")
        qo_indptr, kv_indptr, indices, last, locs = [0], [0], [], [], []
        for table, q, kv in zip(page_tables, q_lens, kv_lens):
            if q < 1 or kv < q:
                raise ValueError(f"bad lengths q_len={q} kv_len={kv}")
            num_pages = (kv + page_size - 1) // page_size
            if len(table) < num_pages:
                raise ValueError(f"page table has {len(table)} pages, kv_len={kv} needs {num_pages}")
            indices.extend(table[:num_pages])
            qo_indptr.append(qo_indptr[-1] + q)
            kv_indptr.append(kv_indptr[-1] + num_pages)
            last.append(kv - (num_pages - 1) * page_size)
            locs.extend(table[p // page_size] * page_size + p % page_size for p in range(kv - q, kv))
        i32 = dict(dtype=torch.int32, device=device)
        return cls(
            qo_indptr=torch.tensor(qo_indptr, **i32),
            kv_indptr=torch.tensor(kv_indptr, **i32),
            kv_indices=torch.tensor(indices, **i32),
            kv_last_page_len=torch.tensor(last, **i32),
            out_cache_loc=torch.tensor(locs, dtype=torch.int64, device=device),
            page_size=page_size,
            q_lens=list(q_lens),
            kv_lens=list(kv_lens),
            prefix_groups=prefix_groups,
        )
