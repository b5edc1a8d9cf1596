"""CUDA-graph decode: capture the whole model step once per batch-size bucket, replay it per step.

A decode step of a 135M-parameter model is a few hundred tiny kernels; launching them one by one costs
more than running them. ``CudaGraphRunner`` captures ``model(...)`` + ``compute_logits`` for the batch
sizes of :func:`capture_bucket_sizes` at start-up (before any request, so the warm-up writes into the
KV pool land on an unused page) and serves a pure decode step of ``bs`` requests with the graph of the
next bucket up (:func:`padded_batch_size`).

Per replay: the ForwardBatch's token ids and positions are copied into static device buffers (padded rows
get id 0, position 0), the backend plans the padded page table into its fixed buffers
(``attn.cuda_graph.plan_replay``, FlashInfer's ``plan`` outside the graph), then the graph replays.
How padded rows stay harmless is the backend's business (flashinfer.py: they read one token of
``DUMMY_PAGE`` and re-write real row 0's K/V into row 0's own slot).

The bucket arithmetic is pure Python and tested on CPU; the rest needs CUDA.
"""

from __future__ import annotations

import logging
import time

from typing import TYPE_CHECKING

import torch

from radixrt.kernels.attention.metadata import AttentionMetadata

if TYPE_CHECKING:
    from radixrt.runtime.executor.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)
SMALL_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
BUCKET_STEP = 64


def capture_bucket_sizes(max_bs: int) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, ..., 64, then steps of 64, and ``max_bs`` itself last.

    ``capture_bucket_sizes(64) == [1, 2, 4, 8, 16, 32, 64]``;
    ``capture_bucket_sizes(160) == [1, 2, 4, 8, 16, 32, 64, 128, 160]``.

    Raises:
        ValueError: ``max_bs`` below 1.
    """
    if max_bs < 1:
        raise ValueError(f"cuda_graph_max_bs must be >= 1, got {max_bs}")
    sizes = [b for b in SMALL_BUCKETS if b <= max_bs]
    b = SMALL_BUCKETS[-1] + BUCKET_STEP
    while b <= max_bs:
        sizes.append(b)
        b += BUCKET_STEP
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


def padded_batch_size(bs: int, buckets: list[int]) -> int:
    """The smallest captured size that holds ``bs`` rows (5 -> 8 with the default buckets).

    Raises:
        ValueError: ``bs`` below 1 or above the largest bucket.
    """
    for b in buckets:
        if b >= bs >= 1:
            return b
    raise ValueError(f"batch size {bs} is outside the captured sizes 1..{buckets[-1]}")


def pad_tokens(values: list[int], padded_bs: int, fill: int = 0) -> list[int]:
    """Pad a decode step's per-row ids or positions with ``fill``."""
    if len(values) > padded_bs:
        raise ValueError(f"{len(values)} rows do not fit {padded_bs}")
    return list(values) + [fill] * (padded_bs - len(values))


class CudaGraphRunner:
    """Captured decode graphs for one :class:`~radixrt.runtime.executor.model_runner.ModelRunner`.

    Needs a backend with a ``cuda_graph`` helper (FlashInfer's) configured for the model.
    The largest bucket is ``min(cuda_graph_max_bs, max_running_requests)``: no decode batch is larger.
    """

    def __init__(self, model_runner):
        mr = model_runner
        self.mr = mr
        self.attn = mr.attn
        a = mr.model.args
        if not self.attn.configured:
            self.attn.configure(a.num_heads, a.num_kv_heads, a.head_dim, mr.dtype)
        self.max_bs = min(mr.args.cuda_graph_max_bs, mr.args.max_running_requests)
        self.buckets = capture_bucket_sizes(self.max_bs)
        self.page_size = mr.page_size
        max_pages_per_req = (mr.context_length + self.page_size - 1) // self.page_size + 1
        self.attn.cuda_graph.setup(self.buckets, max_pages_per_req, self.page_size)
        dev = mr.device
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None
        t0 = time.perf_counter()
        self.capture()
        self.capture_seconds = time.perf_counter() - t0
        logger.info("captured CUDA graphs for decode batch sizes %s in %.1f s", self.buckets, self.capture_seconds)

    def _run(self, B: int) -> torch.Tensor:
        m = self.mr.model
        hidden = m(self.input_ids[:B], self.positions[:B], self.attn, self.mr.kv)
        return m.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self) -> None:
        gs = self.attn.cuda_graph
        stream = torch.cuda.Stream(self.mr.device)
        try:
            for B in reversed(self.buckets):  # largest first: later graphs reuse its pool memory
                gs.plan_capture(B)
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(2):  # warm-up: lazy init (cuBLAS handles, FlashInfer JIT) off the graph
                        self._run(B)
                torch.cuda.current_stream().wait_stream(stream)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.pool, stream=stream):
                    out = self._run(B)
                if self.pool is None:
                    self.pool = g.pool()
                self.graphs[B], self.outputs[B] = g, out
        finally:
            gs.end_capture()
        torch.cuda.synchronize(self.mr.device)

    def can_run(self, meta: AttentionMetadata) -> bool:
        """A pure decode step of 1..max_bs requests whose page table fits the fixed buffers."""
        if meta.prefix_groups is not None:  # shared-prefix steps run the cascade wrapper, eagerly
            return False
        return (
            meta.is_decode
            and 1 <= meta.batch_size <= self.max_bs
            and meta.page_size == self.page_size
            and self.attn.cuda_graph.fits(meta)
        )

    def replay(self, fb: "ForwardBatch") -> torch.Tensor:
        """Run one decode step. Returns fp32 logits ``[bs, vocab]``, rows in batch order.

        The tensor is a view of the graph's static output: it is overwritten by the next replay of the
        same bucket (ModelRunner indexes it, which copies).
        """
        meta = fb.attn_meta
        bs = meta.batch_size
        B = padded_batch_size(bs, self.buckets)
        self.input_ids[:bs].copy_(fb.input_ids, non_blocking=True)
        self.positions[:bs].copy_(fb.positions, non_blocking=True)
        self.input_ids[bs:B].zero_()  # padded rows: id 0 at position 0 (see pad_tokens)
        self.positions[bs:B].zero_()
        self.attn.cuda_graph.plan_replay(meta, B)
        self.graphs[B].replay()
        return self.outputs[B][:bs]
