"""ModelRunner: loads the model and the KV pool; ``prepare`` packs a scheduled step into a ForwardBatch,
``forward`` runs it and returns the logits rows asked for."""

from __future__ import annotations

import logging
import os
import time

import torch

from radixrt.kernels.attention import get_backend
from radixrt.kernels.attention.metadata import AttentionMetadata
from radixrt.runtime.config import ServerArgs
from radixrt.runtime.executor import memory
from radixrt.runtime.executor.forward_batch import ForwardBatch
from radixrt.runtime.executor.scheduled_batch import ScheduledBatch
from radixrt.runtime.executor.cascade_groups import group_decode_rows
from radixrt.runtime.executor.kv_dtype import resolve_kv_dtype
from radixrt.runtime.layers.quant import quantize_for_source
from radixrt.runtime.layers.tp_shard import local_heads
from radixrt.runtime.mem.kv_pool import KV_DTYPES, KVPool
from radixrt.runtime.models.loader import load_model_config, resolve_model
from radixrt.runtime.models.args import ModelArgs
from radixrt.runtime.models.gguf_load import build_from_gguf
from radixrt.runtime.models.st_load import build_from_safetensors
from radixrt.runtime.models.dense_load import build_dense
from radixrt.runtime.models.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)
CPU_MAX_CONTEXTS = 8  # an unset --max-total-tokens on the cpu: the pool holds at most this many contexts
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device_dtype(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """``auto`` device is cuda when available; ``auto`` dtype is bf16 on cuda, fp32 on cpu.

    Raises:
        ValueError: ``cuda`` asked for on a machine without CUDA.
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' asked for, but torch.cuda.is_available() is False")
    if dtype == "auto":
        dtype = "bfloat16" if device == "cuda" else "float32"
    return torch.device(device), _DTYPES[dtype]


class ModelRunner:
    """Owns the model weights, the KV pool and the attention backend.

    Attributes:
        num_pages: KV pool size in pages; ``num_pages * page_size`` tokens.
        context_length: the longest prompt + output, in tokens.
    """

    def __init__(self, args: ServerArgs, tp=None):
        """``tp``: this rank's ``TPGroup`` under ``--tp``; the model is sharded after loading (layers/tp_shard.py)."""
        if args.num_threads:
            torch.set_num_threads(args.num_threads)
        self.args, self.tp = args, tp
        self.device, self.dtype = resolve_device_dtype(args.device, args.dtype)
        if tp is not None:  # one GPU per rank of this node
            from radixrt.runtime.layers.parallel import rank_device

            self.device = rank_device(self.device, tp.rank)
        self.source = resolve_model(args.model)
        cfg = load_model_config(args.model)  # no transformers import where the GGUF's files allow
        self.config = cfg
        margs = ModelArgs.from_hf(cfg)
        self.context_length = min(args.context_length or margs.max_position_embeddings, margs.max_position_embeddings)
        num_heads, num_kv_heads = margs.num_heads, margs.num_kv_heads
        if self._direct_gguf(tp):  # the file's tensors, layer by layer, in their kernels' layouts
            path = os.path.join(self.source.directory, self.source.gguf_file)
            # rotary tables for the positions served, not the architecture's (Llama 3: 131072 x 128 fp32 x 2)
            self.model = build_from_gguf(path, margs, args.quantization, self.context_length, tp)
            self.quantization = "gguf" if args.quantization == "auto" else args.quantization
            if tp is not None and tp.size > 1:  # each rank read its own slices of the file (gguf_tp)
                num_heads, num_kv_heads = local_heads(num_heads, num_kv_heads, tp.size)
        elif self._direct_gguf(tp, safetensors=True):  # a safetensors dir, tensor by tensor (st_load)
            self.model, self.quantization = build_from_safetensors(
                self.source.directory, margs, args.quantization, self.context_length
            )
        else:
            self.model = self._dense_model(margs, tp)
            if tp is not None and tp.size > 1:
                num_heads, num_kv_heads = local_heads(num_heads, num_kv_heads, tp.size)
        self.vocab_size = margs.vocab_size
        self.page_size = args.page_size
        self._weight_bytes = None
        self.kv_dtype = resolve_kv_dtype(
            args.kv_cache_dtype, self.device, self.dtype, self.quantization, self.weight_bytes, margs
        )
        self.num_pages = self._pool_pages(margs.num_layers, num_kv_heads, margs.head_dim)
        self.kv = KVPool(
            self.num_pages, self.page_size, margs.num_layers, num_kv_heads, margs.head_dim, self.kv_dtype, self.device
        )
        self.attn = get_backend(
            args.attention_backend,
            self.device,
            self.dtype,
            kv_dtype=self.kv_dtype,
            cpu_cascade=args.cpu_cascade_attention,
        )
        self.attn.configure(num_heads, num_kv_heads, margs.head_dim, self.dtype, kv_dtype=self.kv_dtype)
        self.cascade_steps = 0  # steps that attended shared prefixes once per group
        self.cascade_rows = 0  # decode rows served by a group, summed over those steps
        self.forward_time = 0.0  # seconds in forward(), summed (the scheduler's StepStats read it)
        self.graph_runner = None
        # under --tp, decode runs eagerly: collectives inside captured graphs are not wired here
        if (
            self.device.type == "cuda"
            and not args.disable_cuda_graph
            and self.attn.cuda_graph is not None
            and (tp is None or tp.size == 1)
        ):
            from radixrt.runtime.executor.cuda_graph_runner import CudaGraphRunner

            self.graph_runner = CudaGraphRunner(self)
        m = self.memory_stats() if self.device.type == "cpu" else None
        logger.info(
            "model %s on %s/%s (%s): KV pool %s, %d pages x %d tokens = %d tokens%s",
            self.source.name,
            self.device,
            self.dtype,
            self.quantization,
            self.kv_dtype_name,
            self.num_pages,
            self.page_size,
            self.num_pages * self.page_size,
            ""
            if m is None
            else f"; weights {m['weight_bytes'] / 2**20:.0f} MiB, KV pool "
            f"{m['kv_pool_bytes'] / 2**20:.0f} MiB, RSS {m['rss_bytes'] / 2**20:.0f} MiB, "
            f"available {memory.available_bytes() / 2**20:.0f} MiB",
        )

    def _direct_gguf(self, tp, safetensors: bool = False) -> bool:
        """A GGUF (sharded or not) or with ``safetensors`` an unsharded safetensors directory, on the CPU:
        loaded from the files layer by layer in its format (gguf_load, gguf_tp, st_load), never through a
        whole-model state dict."""
        unsharded = tp is None or tp.size == 1
        return (
            (self.source.gguf_file is None) == safetensors
            and self.device.type == "cpu"
            and (unsharded or not safetensors)
            and self.dtype == torch.float32
        )

    def _dense_model(self, margs: ModelArgs, tp) -> LlamaForCausalLM:
        """The dense path (CUDA, a bf16/fp16 model on the CPU, safetensors directories under --tp): the
        files read layer by layer into ``self.dtype`` on the device (models/dense_load.py), then quantized
        where the format asks."""
        model = build_dense(
            self.source.directory,
            self.source.gguf_file,
            margs,
            self.device,
            self.dtype,
            tp,
            max_pos=self.context_length,
        )
        self.quantization = quantize_for_source(model, self.args.quantization, self.source, self.device)
        return model

    def _pool_pages(self, num_layers: int, num_kv_heads: int, head_dim: int) -> int:
        """KV pages from --max-total-tokens, or from free GPU memory (the minimum over the tp ranks, whose
        schedulers must agree on the pool)."""
        per_token = KVPool.bytes_per_token(num_layers, num_kv_heads, head_dim, self.kv_dtype)
        total = self.args.max_total_tokens
        if total is None:
            if self.device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(self.device)
                used = torch.cuda.memory_allocated(self.device)
                budget = (free + used) * self.args.mem_fraction_static - used
                total = max(int(budget // per_token), self.page_size)
                if self.tp is not None and self.tp.size > 1:
                    total = min(self.tp.gather_json(total))
            else:  # the memory left after the weights, split between the ranks of this machine, and at
                # most CPU_MAX_CONTEXTS full contexts: host memory is shared with everything else on the box
                ranks = self.tp.size if self.tp is not None else 1
                total = int(memory.available_bytes() * self.args.mem_fraction_static / ranks // per_token)
                total = max(min(total, CPU_MAX_CONTEXTS * self.context_length), self.page_size)
        return max(total // self.page_size, 1)

    @property
    def weight_bytes(self) -> int:
        """Bytes the weights hold, every layout (measured once)."""
        if self._weight_bytes is None:
            self._weight_bytes = memory.weight_bytes(self.model)
        return self._weight_bytes

    @property
    def kv_dtype_name(self) -> str:
        """The pool's ``--kv-cache-dtype`` name (fp32, fp16, bf16, int8)."""
        return {v: k for k, v in KV_DTYPES.items()}[self.kv_dtype]

    def memory_stats(self) -> dict:
        """Bytes: ``weight_bytes`` (as held, every layout), ``kv_pool_bytes``, and this process's
        ``rss_bytes`` / ``peak_rss_bytes``; ``kv_dtype``, the pool's element type."""
        rss = memory.rss_bytes()  # sampled apart from getrusage's peak: the peak is at least the current
        return {
            "weight_bytes": self.weight_bytes,
            "kv_pool_bytes": self.kv.nbytes,
            "kv_dtype": self.kv_dtype_name,
            "rss_bytes": rss,
            "peak_rss_bytes": max(rss, memory.peak_rss_bytes()),
        }

    def prepare(self, batch: ScheduledBatch) -> ForwardBatch:
        """Pack one scheduled step: each row of ``batch`` computes tokens ``[num_computed, num_computed + n)``:
        ``row.num_fill`` of ``req.fill_ids``, then its drafts. Asks for the logits of a request's last token
        once its whole sequence is in (to sample), of every position of a row with drafts (to verify), and of
        every prompt position whose input logprob is wanted."""
        ids, pos, tables, q_lens, kv_lens, rows = [], [], [], [], [], []
        sample_at, lp_at, verify_at = [], [], []
        for row in batch:
            req, n, k = row.req, row.n, len(row.drafts)
            s, e = req.num_computed, req.num_computed + n
            base = len(ids)
            ids.extend(req.fill_ids[s : e - k] + row.drafts if k else req.fill_ids[s:e])
            pos.extend(range(s, e))
            tables.append(req.page_table)
            q_lens.append(n)
            kv_lens.append(e)
            if req.wants_input_logprobs:
                first = max(req.logprob_start_len - 1, 0)
                for p in range(max(s, first), min(e, len(req.input_ids) - 1)):
                    lp_at.append((req, len(rows), p + 1))
                    rows.append(base + p - s)
            if k:  # the last token of fill_ids and every draft after it are scored
                verify_at.append((row, len(rows)))
                rows.extend(range(base + n - 1 - k, base + n))
            elif e == req.seq_len:
                sample_at.append((req, len(rows)))
                rows.append(base + n - 1)
        groups = None
        if not self.args.disable_cascade_attention and self.attn.uses_groups:
            # the tree match made at admission groups the rows (the CPU kernels only with --cpu-cascade-attention)
            groups = group_decode_rows([row.req.last_node for row in batch], tables, q_lens, self.page_size)
        if groups is not None:
            self.cascade_steps += 1
            self.cascade_rows += len({r for members in groups.rows for r in members})
        meta = AttentionMetadata.build(tables, q_lens, kv_lens, self.page_size, prefix_groups=groups)
        return ForwardBatch.make(
            ids, pos, meta, rows, sample_at=sample_at, input_logprob_at=lp_at, prefix_groups=groups, verify_at=verify_at
        )

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """One step. Returns fp32 logits ``[len(fb.logit_rows), vocab]``, rows in ``fb.logit_rows`` order.

        A pure decode step that fits a captured CUDA graph replays it; anything else runs eagerly. Adds
        its seconds to :attr:`forward_time` (the scheduler's StepStats read it)."""
        t0 = time.perf_counter()
        try:
            return self._forward(fb)
        finally:
            self.forward_time += time.perf_counter() - t0

    def _forward(self, fb: ForwardBatch) -> torch.Tensor:
        rows = fb.logit_rows.to(self.device, non_blocking=True)
        if self.graph_runner is not None and self.graph_runner.can_run(fb.attn_meta):
            return self.graph_runner.replay(fb)[rows]
        ids = fb.input_ids.to(self.device, non_blocking=True)
        pos = fb.positions.to(self.device, non_blocking=True)
        meta = fb.attn_meta
        if meta.qo_indptr.device != self.device:
            meta = _to_device(meta, self.device)
        self.attn.plan(meta)
        hidden = self.model(ids, pos, self.attn, self.kv)
        return self.model.compute_logits(hidden if fb.all_rows else hidden[rows])


def _to_device(meta: AttentionMetadata, device: torch.device) -> AttentionMetadata:
    import dataclasses

    return dataclasses.replace(
        meta,
        **{
            k: vars(meta)[k].to(device, non_blocking=True)
            for k in ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len", "out_cache_loc")
        },
    )
