"""Tensor parallelism by sharding a loaded model in place (the Megatron-LM layout, Shoeybi et al. 2019).

``shard_model(model, tp)`` swaps the Llama model's layers for their parallel forms, so models/*.py stay
single-device and readable:

- ``qkv_proj`` and ``gate_up_proj``: column-parallel. Rank r keeps its query heads, its KV heads and its
  slice of the intermediate dimension; outputs stay sharded, no communication.
- ``o_proj`` and ``down_proj``: row-parallel. Rank r keeps the matching input columns; the partial sums are
  all-reduced. A bias is added on rank 0 only, before the all-reduce, so it is counted once.
- ``embed_tokens``: vocab-parallel. Rank r holds rows ``[r*V/tp, (r+1)*V/tp)``, looks up the ids in its
  range, zeroes the others, and the ranks all-reduce.
- ``lm_head`` (or the tied embedding): vocab-parallel too; each rank computes its logits shard and the
  shards are all-gathered, so every rank samples from the same full ``[n, vocab]`` logits.
- KV heads: split across ranks when ``tp`` divides their number, else replicated (rank r uses KV head
  ``r // (tp / num_kv_heads)``) when ``num_kv_heads`` divides ``tp``; query heads must divide by ``tp``.

The collectives run on ``TPGroup.group`` (NCCL on CUDA, gloo on CPU). ``TPGroup.cpu_group`` is always
gloo, for control messages (the scheduler's per-step broadcast).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional

import msgspec
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


@dataclass
class TPGroup:
    """This process's place in a tensor-parallel group. ``size == 1``: no communication at all."""

    rank: int = 0
    size: int = 1
    group: Any = None  # device collectives
    cpu_group: Any = None  # gloo, control messages

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """Concatenate every rank's ``[..., sizes[r]]`` shard along the last dim (shards may differ by one
        row when the vocab does not divide: they are padded to the largest for the collective)."""
        if self.size == 1:
            return x
        width = max(sizes)
        if x.shape[-1] < width:
            x = F.pad(x, (0, width - x.shape[-1]))
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat([p[..., :n] for p, n in zip(parts, sizes)], dim=-1)

    def share_tokens(self, ids: list[int]) -> list[int]:
        """Rank 0's sampled token ids, on every rank (broadcast over the CPU group)."""
        if self.size == 1 or not ids:
            return ids
        t = torch.tensor(ids, dtype=torch.int64)
        dist.broadcast(t, 0, group=self.cpu_group)
        return t.tolist()

    def gather_json(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (msgspec JSON bytes over the CPU group, never pickle), in rank order."""
        if self.size == 1:
            return [obj]
        data = msgspec.json.encode(obj)
        n = torch.tensor([len(data)], dtype=torch.int64)
        lens = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        dist.all_gather(lens, n, group=self.cpu_group)
        width = int(max(lens))
        buf = torch.zeros(width, dtype=torch.uint8)
        buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        parts = [torch.empty(width, dtype=torch.uint8) for _ in range(self.size)]
        dist.all_gather(parts, buf, group=self.cpu_group)
        return [msgspec.json.decode(p[: int(k)].numpy().tobytes()) for p, k in zip(parts, lens)]


def init_tp(
    rank: int,
    size: int,
    device: torch.device,
    init_method: Optional[str] = None,
    timeout: timedelta = timedelta(seconds=900),
) -> TPGroup:
    """Join the process group (``init_method`` None: torchrun's ``env://``, i.e. MASTER_ADDR/PORT). NCCL plus
    a gloo CPU group on CUDA, gloo alone on CPU. ``timeout`` bounds every collective: long enough for all
    ranks to load their weights on a busy host (a dead peer is noticed at once: its sockets close).

    Raises:
        ValueError: ``rank`` outside ``[0, size)``.
    """
    if not 0 <= rank < size:
        raise ValueError(f"tp rank {rank} must be in [0, {size})")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=init_method or "env://", rank=rank, world_size=size, timeout=timeout)
    world = dist.group.WORLD
    cpu = world if backend == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    return TPGroup(rank, size, world, cpu)


def rank_device(device: torch.device, rank: int) -> torch.device:
    """A rank's device: ``cuda:LOCAL_RANK`` (torchrun) or ``cuda:rank`` (one node) on CUDA; the CPU as is."""
    if device.type != "cuda":
        return device
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))


# ---- head and vocab partitioning -----------------------------------------------------------------------
def q_heads(rank: int, tp: int, num_heads: int) -> list[int]:
    if num_heads % tp:
        raise ValueError(f"tp={tp} must divide num_attention_heads={num_heads}")
    per = num_heads // tp
    return list(range(rank * per, (rank + 1) * per))


def kv_heads(rank: int, tp: int, num_kv_heads: int) -> list[int]:
    """KV heads rank ``rank`` holds: a contiguous slice, or one replicated head when tp > num_kv_heads."""
    if num_kv_heads % tp == 0:
        per = num_kv_heads // tp
        return list(range(rank * per, (rank + 1) * per))
    if tp % num_kv_heads == 0:
        return [rank // (tp // num_kv_heads)]
    raise ValueError(f"tp={tp} and num_key_value_heads={num_kv_heads}: one must divide the other")


def inter_share(intermediate_size: int, tp: int) -> int:
    """The MLP width one of ``tp`` ranks holds (gate/up rows, down's inputs).

    Raises:
        ValueError: ``tp`` does not divide ``intermediate_size``.
    """
    if intermediate_size % tp:
        raise ValueError(f"tp={tp} must divide intermediate_size={intermediate_size}")
    return intermediate_size // tp


def vocab_range(rank: int, tp: int, vocab: int) -> tuple[int, int]:
    per = -(-vocab // tp)
    return min(rank * per, vocab), min((rank + 1) * per, vocab)


# ---- parallel layers -----------------------------------------------------------------------------------
class ColumnParallelLinear(nn.Module):
    """``y_r = x @ W_r^T + b_r`` with ``W_r`` ``[out/tp, in]``: the output stays sharded."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None):
        super().__init__()
        self.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.contiguous(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """``y = all_reduce(x_r @ W_r^T) + b`` with ``W_r`` ``[out, in/tp]``; the bias lives on rank 0 only."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], tp: TPGroup):
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
        keep = bias is not None and tp.rank == 0
        self.bias = nn.Parameter(bias.contiguous(), requires_grad=False) if keep else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(F.linear(x, self.weight, self.bias))


class VocabParallelEmbedding(nn.Module):
    """Rows ``[start, end)`` of the embedding; ids outside give zeros; the ranks' lookups are summed."""

    def __init__(self, weight: torch.Tensor, start: int, end: int, tp: TPGroup):
        super().__init__()
        self.tp, self.start, self.end = tp, start, end
        self.weight = nn.Parameter(weight[start:end].clone(), requires_grad=False)  # not a view of the whole

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mine = (ids >= self.start) & (ids < self.end)
        out = F.embedding(torch.where(mine, ids - self.start, 0), self.weight)
        return self.tp.all_reduce(out * mine.unsqueeze(-1).to(out.dtype))
