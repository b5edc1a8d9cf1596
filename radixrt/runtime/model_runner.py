"""ModelRunner: loads the model and the KV pool, turns a scheduled step into one forward pass."""
from __future__ import annotations

import logging

import torch

from radixrt.kernels.attention import get_backend
from radixrt.kernels.attention.metadata import AttentionMetadata
from radixrt.runtime.config import ServerArgs
from radixrt.runtime.mem.kv_pool import KVPool
from radixrt.runtime.model_loader import load_config, load_state_dict, resolve_model
from radixrt.runtime.models.llama import LlamaArgs, LlamaForCausalLM

logger = logging.getLogger(__name__)
CPU_DEFAULT_TOTAL_TOKENS = 32768
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

    def __init__(self, args: ServerArgs):
        if args.num_threads:
            torch.set_num_threads(args.num_threads)
        self.args = args
        self.device, self.dtype = resolve_device_dtype(args.device, args.dtype)
        self.source = resolve_model(args.model)
        cfg = load_config(args.model)
        self.config = cfg
        margs = LlamaArgs.from_hf(cfg)
        self.context_length = min(args.context_length or margs.max_position_embeddings,
                                  margs.max_position_embeddings)
        with torch.device("meta"):
            model = LlamaForCausalLM(margs)
        model = model.to_empty(device="cpu")
        model.rotary = type(model.rotary)(margs.head_dim, margs.max_position_embeddings, margs.rope_theta)
        model.load_hf_state_dict(load_state_dict(args.model))
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.model.rotary.to(self.device)  # tables stay fp32; cast per use
        self.vocab_size = margs.vocab_size
        self.page_size = args.page_size
        self.num_pages = self._pool_pages(margs)
        self.kv = KVPool(self.num_pages, self.page_size, margs.num_layers, margs.num_kv_heads,
                         margs.head_dim, self.dtype, self.device)
        self.attn = get_backend(args.attention_backend, self.device, self.dtype)
        if hasattr(self.attn, "configure"):  # FlashInfer needs the head counts and dtype up front
            self.attn.configure(margs.num_heads, margs.num_kv_heads, margs.head_dim, self.dtype)
        self.graph_runner = None
        if self.device.type == "cuda" and not args.disable_cuda_graph and hasattr(self.attn, "cuda_graph"):
            from radixrt.runtime.cuda_graph_runner import CudaGraphRunner
            self.graph_runner = CudaGraphRunner(self)
        logger.info("model %s on %s/%s: %d KV pages x %d tokens", self.source.name, self.device,
                    self.dtype, self.num_pages, self.page_size)

    def _pool_pages(self, a: LlamaArgs) -> int:
        per_token = KVPool.bytes_per_token(a.num_layers, a.num_kv_heads, a.head_dim, self.dtype)
        total = self.args.max_total_tokens
        if total is None:
            if self.device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(self.device)
                used = torch.cuda.memory_allocated(self.device)
                budget = (free + used) * self.args.mem_fraction_static - used
                total = max(int(budget // per_token), self.page_size)
            else:
                total = CPU_DEFAULT_TOTAL_TOKENS
        return max(total // self.page_size, 1)

    def forward(self, input_ids: list[int], positions: list[int], meta: AttentionMetadata,
                logit_rows: list[int]) -> torch.Tensor:
        """One step. Returns fp32 logits ``[len(logit_rows), vocab]`` for the packed token rows asked for."""
        if self.graph_runner is not None and self.graph_runner.can_run(meta):
            return self.graph_runner.replay(input_ids, positions, meta)[logit_rows]
        ids = torch.tensor(input_ids, dtype=torch.int64, device=self.device)
        pos = torch.tensor(positions, dtype=torch.int64, device=self.device)
        if meta.qo_indptr.device != self.device:
            meta = _to_device(meta, self.device)
        self.attn.plan(meta)
        hidden = self.model(ids, pos, self.attn, self.kv)
        rows = torch.tensor(logit_rows, dtype=torch.int64, device=self.device)
        return self.model.compute_logits(hidden[rows])


def _to_device(meta: AttentionMetadata, device: torch.device) -> AttentionMetadata:
    import dataclasses
    return dataclasses.replace(meta, **{k: getattr(meta, k).to(device, non_blocking=True)
                                        for k in ("qo_indptr", "kv_indptr", "kv_indices",
                                                  "kv_last_page_len", "out_cache_loc")})
