"""FlashInfer paged attention for CUDA (pinned to ``flashinfer-python==0.6.18.post1``).

Importing this module never imports ``flashinfer``: the package is imported when a
:class:`FlashInferBackend` is constructed. The pure planning functions
(``flashinfer_plan.py``) need only torch and are unit-tested on CPU.

How the metadata maps onto FlashInfer's paged-KV API (the plan's arrays): see ``flashinfer_plan.py``.

Which kernel: a pure decode step (every ``q_len == 1``) runs ``BatchDecodeWithPagedKVCacheWrapper``;
anything else (prefill chunks, prefix-cached extends, mixed with decodes) runs
``BatchPrefillWithPagedKVCacheWrapper`` over the whole batch with ``causal=True``. FlashInfer's causal mask
is aligned bottom-right (query row ``j`` of a request sees KV positions ``<= kv_len - q_len + j``), which
is exactly our metadata's rule for a request with a cached prefix.

Shared-prefix decode: a pure decode step whose metadata carries ``prefix_groups`` runs through
``MultiLevelCascadeAttentionWrapper`` instead (see ``flashinfer_cascade.py``), outside CUDA graphs.

Kernel choices (fewest JIT modules): prefill uses FlashInfer's ``fa2`` backend, and decode uses the
tensor-core path (``use_tensor_cores=True``), which runs the same batch-prefill kernel module with one
query row per request. So one JIT-compiled module serves every step for a given dtype and head_dim.
FlashInfer's kernels take fp16/bf16 (and fp8 KV), never fp32: :meth:`FlashInferBackend.configure`
raises ``ValueError`` for ``float32``; use ``torch_native`` for fp32 runs.

CUDA graphs: see :class:`FlashInferGraphSupport` (``backend.cuda_graph``) and
``radixrt/runtime/executor/cuda_graph_runner.py``.
"""

from __future__ import annotations

import torch

from radixrt.kernels.attention.base import AttentionBackend, KVCacheView, write_kv
from radixrt.kernels.attention.flashinfer_cascade import CascadeWrappers
from radixrt.kernels.attention.flashinfer_plan import DUMMY_PAGE, pad_decode_plan, pad_out_cache_loc, plan_args
from radixrt.kernels.attention.metadata import AttentionMetadata

FLASHINFER_VERSION = "0.6.18.post1"
DEFAULT_WORKSPACE_BYTES = 128 * 1024 * 1024
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


# ---- the backend ---------------------------------------------------------------------------------------
class FlashInferBackend(AttentionBackend):
    """Paged attention through FlashInfer's batch prefill/decode wrappers.

    Call :meth:`configure` once (head counts, dtype) before the first :meth:`plan`; ModelRunner does.

    Attributes:
        cuda_graph: a :class:`FlashInferGraphSupport`; its presence tells ModelRunner that decode steps
            can run in captured CUDA graphs.
    """

    def __init__(
        self,
        device: torch.device | str = "cuda",
        workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
        prefill_backend: str = "fa2",
        decode_use_tensor_cores: bool = True,
    ):
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError("FlashInferBackend needs a CUDA device; use the torch_native backend on CPU")
        try:
            import flashinfer  # noqa: F401  (imported here, never when radixrt is imported)
        except ImportError as e:
            raise ValueError(f"FlashInferBackend needs flashinfer-python=={FLASHINFER_VERSION}: {e}") from e
        self._fi = flashinfer
        self.prefill_backend = prefill_backend
        self.decode_use_tensor_cores = decode_use_tensor_cores
        self.workspace = torch.zeros(workspace_bytes, dtype=torch.uint8, device=self.device)
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, "NHD", backend=prefill_backend
        )
        self.decode_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_tensor_cores=decode_use_tensor_cores
        )
        self.num_q_heads = self.num_kv_heads = self.head_dim = None
        self.dtype: torch.dtype | None = None
        self.sm_scale: float | None = None
        self.cuda_graph = FlashInferGraphSupport(self)
        self.cascade = CascadeWrappers(flashinfer, self.workspace)  # decode steps with prefix groups
        self._active = None  # the wrapper planned for this step
        self._loc: torch.Tensor | None = None
        self._valid: torch.Tensor | None = None  # set while a padded graph batch is being captured

    @property
    def configured(self) -> bool:
        return self.dtype is not None

    def configure(
        self,
        num_q_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        sm_scale: float | None = None,
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        """Set the model's attention shape. ``sm_scale`` defaults to ``head_dim ** -0.5``; ``kv_dtype``
        (the paged KV pool's type, passed to the wrappers' ``plan`` as ``kv_data_type``) to ``dtype``.

        Raises:
            ValueError: fp32 queries or an fp32/int8 pool (FlashInfer has fp16/bf16 kernels; its fp8 KV is not
                wired here), or head counts that are not GQA.
        """
        if dtype not in SUPPORTED_DTYPES:
            raise ValueError(
                f"attention_backend 'flashinfer' runs float16/bfloat16 only, got {dtype}; "
                "use attention_backend='torch_native' (or dtype='bfloat16')"
            )
        kv_dtype = dtype if kv_dtype is None else kv_dtype
        if kv_dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"kv_cache_dtype: attention_backend 'flashinfer' takes fp16/bf16 pools, got {kv_dtype}")
        self.kv_dtype = kv_dtype
        if num_q_heads % num_kv_heads:
            raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.num_q_heads, self.num_kv_heads, self.head_dim = num_q_heads, num_kv_heads, head_dim
        self.dtype = dtype
        self.sm_scale = float(head_dim**-0.5 if sm_scale is None else sm_scale)

    def _common_kwargs(self) -> dict:
        return dict(q_data_type=self.dtype, kv_data_type=self.kv_dtype, sm_scale=self.sm_scale)

    def plan(self, meta: AttentionMetadata) -> None:
        if not self.configured:
            raise RuntimeError("FlashInferBackend.configure(...) must be called before plan()")
        self._loc, self._valid = meta.out_cache_loc, None
        if meta.prefix_groups is not None and meta.prefix_groups.num_groups and meta.is_decode:
            self.cascade.plan(meta, self.num_q_heads, self.num_kv_heads, self.head_dim, self._common_kwargs())
            self._active = self.cascade
            return
        args = plan_args(meta, self.num_q_heads, self.num_kv_heads, self.head_dim)
        if args["mode"] == "decode":
            self.decode_wrapper.plan(**args["plan"], **self._common_kwargs())
            self._active = self.decode_wrapper
        else:
            self.prefill_wrapper.plan(**args["plan"], **self._common_kwargs())
            self._active = self.prefill_wrapper

    def bind(self, wrapper, loc: torch.Tensor | None, valid: torch.Tensor | None) -> None:
        """Run ``forward`` through a CUDA graph's planned ``wrapper``, writing K/V at ``loc`` (``[B]``
        int64 slots) with ``valid`` (``[B]`` bool) marking real rows; all None: unbound (graph captured)."""
        self._active, self._loc, self._valid = wrapper, loc, valid

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, kv: KVCacheView, scale: float
    ) -> torch.Tensor:
        if self._active is None:
            raise RuntimeError("FlashInferBackend.plan() must be called before forward()")
        if abs(scale - self.sm_scale) > 1e-9 * self.sm_scale:  # FlashInfer takes the scale at plan time
            raise ValueError(f"softmax scale {scale} differs from the configured {self.sm_scale}")
        if self._valid is not None:
            # A padded graph batch: padded rows write real row 0's K/V into row 0's slot (their loc),
            # the same values row 0 writes, so padding never changes the pool.
            keep = self._valid[:, None, None]
            k = torch.where(keep, k, k[:1])
            v = torch.where(keep, v, v[:1])
        write_kv(kv, layer, self._loc, k, v)
        # q may be a view into the fused q/k rotary output (models/llama.py): FlashInfer wants it dense
        return self._active.run(q.contiguous(), (kv.k_buffer(layer), kv.v_buffer(layer)))


class FlashInferGraphSupport:
    """The FlashInfer half of CUDA-graph decode (the model half is ``CudaGraphRunner``).

    One ``BatchDecodeWithPagedKVCacheWrapper`` per captured batch size ``B``, built with
    ``use_cuda_graph=True`` over fixed device buffers (``indptr[:B+1]``, ``last_page_len[:B]`` and one
    shared ``indices`` buffer). Before capture the wrapper is planned for a dummy batch; before each replay
    it is planned again with the real (padded) page table. FlashInfer's ``plan`` copies the page table into
    those fixed buffers and rewrites its schedule in its own workspace, which the captured kernels read.

    Padding: a batch of ``bs`` rows runs in the graph of the next bucket ``B``. Padded rows read
    ``DUMMY_PAGE`` (1 token) and write real row 0's K/V into row 0's slot (see ``pad_out_cache_loc``),
    so no scratch page is needed and the KV pool is never touched outside the batch's own slots.
    """

    def __init__(self, backend: FlashInferBackend):
        self.backend = backend
        self.wrappers: dict[int, object] = {}
        self.max_indices = 0

    def setup(self, batch_sizes: list[int], max_pages_per_req: int, page_size: int) -> None:
        """Allocate the fixed buffers and one cuda-graph decode wrapper per batch size."""
        b = self.backend
        if not b.configured:
            raise RuntimeError("FlashInferBackend.configure(...) must be called before cuda_graph.setup()")
        self._page_size = page_size
        fi, dev = b._fi, b.device
        max_bs = max(batch_sizes)
        self.max_indices = max_bs * max_pages_per_req
        self.indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.last_page_len = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self.indices = torch.zeros(self.max_indices, dtype=torch.int32, device=dev)
        self.loc = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.valid = torch.ones(max_bs, dtype=torch.bool, device=dev)
        for B in batch_sizes:
            self.wrappers[B] = fi.BatchDecodeWithPagedKVCacheWrapper(
                b.workspace,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=b.decode_use_tensor_cores,
                paged_kv_indptr_buffer=self.indptr[: B + 1],
                paged_kv_indices_buffer=self.indices,
                paged_kv_last_page_len_buffer=self.last_page_len[:B],
            )

    def fits(self, meta: AttentionMetadata) -> bool:
        """True when the padded page table fits the fixed indices buffer."""
        P = meta.page_size
        pages = sum((kv + P - 1) // P for kv in meta.kv_lens)
        return pages + (max(self.wrappers) - meta.batch_size) <= self.max_indices

    def _plan(self, B: int, plan: dict, loc: torch.Tensor, valid: torch.Tensor) -> None:
        b = self.backend
        self.wrappers[B].plan(**plan, **b._common_kwargs())
        self.loc[:B].copy_(loc, non_blocking=True)
        self.valid[:B].copy_(valid, non_blocking=True)

    def plan_capture(self, B: int) -> None:
        """Plan a dummy batch of ``B`` one-token rows on ``DUMMY_PAGE`` and switch the backend to graph
        mode for batch size ``B`` (its forward then reads the fixed buffers). Only at start-up, before any
        request: the warm-up runs write slot ``DUMMY_PAGE * page_size``."""
        b = self.backend
        plan = dict(
            indptr=torch.arange(B + 1, dtype=torch.int32),
            indices=torch.full((B,), DUMMY_PAGE, dtype=torch.int32),
            last_page_len=torch.ones(B, dtype=torch.int32),
            num_qo_heads=b.num_q_heads,
            num_kv_heads=b.num_kv_heads,
            head_dim=b.head_dim,
            page_size=self._page_size,
        )
        self._plan(
            B, plan, torch.full((B,), DUMMY_PAGE * self._page_size, dtype=torch.int64), torch.ones(B, dtype=torch.bool)
        )
        b.bind(self.wrappers[B], self.loc[:B], self.valid[:B])

    def end_capture(self) -> None:
        self.backend.bind(None, None, None)

    def plan_replay(self, meta: AttentionMetadata, B: int) -> None:
        """Plan the real decode batch, padded to ``B``, into the fixed buffers of graph ``B``."""
        b = self.backend
        args = plan_args(meta, b.num_q_heads, b.num_kv_heads, b.head_dim)
        if args["mode"] != "decode":
            raise ValueError("only pure decode batches run in a CUDA graph")
        plan = pad_decode_plan(args["plan"], B)
        loc, valid = pad_out_cache_loc(meta.out_cache_loc, B)
        self._plan(B, plan, loc, valid)
