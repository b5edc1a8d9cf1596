"""ServerArgs: every runtime option in one place. ``radixrt serve --flag`` and ``Engine(flag=...)`` take
the same names (SGLang's spelling where one exists)."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from radixrt.runtime.mem.eviction import POLICIES

SCHEDULE_POLICIES = ("lpm", "fcfs", "dfs-weight")
GRAMMAR_BACKENDS = ("xgrammar", "llguidance", "outlines", "none")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
MAX_DRAFT_TOKENS = 64  # the largest step size the speculation cost model measures (scheduler/spec_calibrate.py)
QUANTIZATIONS = ("auto", "none", "fp16", "bf16", "int8", "q4", "q4_k")
KV_CACHE_DTYPES = ("auto", "fp32", "fp16", "bf16", "int8")
ROUTER_POLICIES = ("cache_aware", "round_robin", "power_of_two", "consistent_hash")


@dataclass
class ServerArgs:
    model: Optional[str] = field(
        default=None, metadata={"help": "alias (smollm2-135m), .gguf path or HF dir; default SmolLM2-135M-Instruct"}
    )
    served_model_name: Optional[str] = field(default=None, metadata={"help": "model name reported by /v1/models"})
    device: str = field(default="auto", metadata={"help": "auto|cpu|cuda; auto picks cuda when available"})
    dtype: str = field(
        default="auto", metadata={"help": "auto|float32|bfloat16|float16; auto: bf16 on cuda, fp32 on cpu"}
    )
    quantization: str = field(
        default="auto",
        metadata={
            "help": "auto|none|fp16|bf16|int8|q4|q4_k weights on cpu, applied while loading, layer by layer; auto: a GGUF's own blocks, every type (Q4_K_M, Q8_0, ...), a safetensors dir's own dtype (fp32/fp16/bf16)"
        },
    )
    kv_cache_dtype: str = field(
        default="auto",
        metadata={
            "help": "auto|fp32|fp16|bf16|int8 KV pool; auto: fp16 for quantized or 2-byte weights (GGUF blocks, q4, int8, fp16, bf16), fp32 for fp32 weights (cuda: the model dtype); int8 has a scale per token and KV head (cpu only)"
        },
    )
    attention_backend: str = field(default="auto", metadata={"help": "auto|torch_native|flashinfer"})
    context_length: Optional[int] = field(
        default=None, metadata={"help": "max prompt+output tokens; default: the model's"}
    )
    page_size: int = field(default=16, metadata={"help": "tokens per KV page"})
    max_total_tokens: Optional[int] = field(
        default=None,
        metadata={
            "help": "KV pool size in tokens (default: --mem-fraction-static of the memory left after the weights)"
        },
    )
    mem_fraction_static: float = field(
        default=0.85,
        metadata={
            "help": "max_total_tokens unset: the KV pool's share of free GPU memory (weights included), or on the cpu of the memory available after the weights"
        },
    )
    max_running_requests: int = field(default=64, metadata={"help": "cap on requests in one batch"})
    chunked_prefill_size: int = field(default=512, metadata={"help": "max prefill tokens of one request per step"})
    max_num_batched_tokens: int = field(default=1024, metadata={"help": "token budget of one step (decodes + prefill)"})
    schedule_policy: str = field(
        default="lpm", metadata={"help": "lpm|fcfs|dfs-weight (lpm falls back to fcfs without the cache)"}
    )
    max_wait_steps: int = field(
        default=64, metadata={"help": "lpm aging: a request waiting more steps than this is served next"}
    )
    disable_radix_cache: bool = field(default=False, metadata={"help": "turn prefix reuse off (ablation)"})
    disable_cascade_attention: bool = field(
        default=False, metadata={"help": "attend shared prefixes per row instead of once per group (ablation)"}
    )
    cpu_cascade_attention: bool = field(
        default=False,
        metadata={
            "help": "cpu kernels: attend a shared prefix once per group of rows (faster at many rows on a long prefix; not batch-invariant: off by default)"
        },
    )
    eviction_policy: str = field(
        default="gdsf",
        metadata={"help": "gdsf|lru|lfu: which cached prefix goes first when pages run short (mem/eviction.py)"},
    )
    enable_hierarchical_cache: bool = field(
        default=False,
        metadata={
            "help": "keep pages evicted from the KV pool in a host store (tier 2) and load them back on a match instead of recomputing (mem/hicache.py)"
        },
    )
    hicache_size: float = field(
        default=0.0,
        metadata={
            "help": "host store size in GB (turns the tiers on); 0 with --enable-hierarchical-cache: --hicache-ratio x the pool"
        },
    )
    hicache_ratio: float = field(
        default=2.0, metadata={"help": "host store size as a multiple of the KV pool, when --hicache-size is 0"}
    )
    hicache_storage: Optional[str] = field(
        default=None,
        metadata={
            "help": "file:DIR: also keep pages in files under DIR (tier 3, created 0700), so a restart with the same model finds them"
        },
    )
    hicache_storage_size: float = field(
        default=0.0,
        metadata={
            "help": "bound on tier 3's page files in GB (0: none); past it the least recently used files are deleted"
        },
    )
    hicache_prefetch_threshold: int = field(
        default=256,
        metadata={
            "help": "tokens found in tier 3 beyond the tree and host store for a queued request's pages to be read ahead of its admission"
        },
    )
    hicache_write_policy: str = field(
        default="write_through",
        metadata={
            "help": "write_through|write_back: tier 3 is written when a page enters the tree, or when it leaves the host store"
        },
    )
    request_log: Optional[str] = field(
        default=None,
        metadata={"help": "append one JSON line per finished request to this file (docs/cache.md: request log)"},
    )
    request_log_hash: bool = field(
        default=False, metadata={"help": "request log: one hash per page instead of token ids"}
    )
    grammar_backend: str = field(
        default="llguidance",
        metadata={
            "help": "llguidance|xgrammar|outlines|none (llguidance: the only one with no invalid output on the schema benchmark, benchmarks/results/grammar_backends.md)"
        },
    )
    grammar_overlap: bool = field(
        default=False,
        metadata={
            "help": "fill the next step's grammar masks on a worker thread while the forward runs; off by default: on 2 CPU cores the thread competes with the forward (json-decode 0.83x vs 0.90x of unconstrained, benchmarks/results/grammar_backends.md)"
        },
    )
    disable_jump_forward: bool = field(
        default=True,
        metadata={
            "help": "on by default (jump-forward off): it loses wall time at 16 concurrent requests; --no-disable-jump-forward appends grammar-forced text in one extend step"
        },
    )
    speculative_algorithm: str = field(
        default="auto",
        metadata={
            "help": "auto|none|suffix|ngram: draftless speculative decoding; drafts from the request's own tokens and recent outputs (suffix, SuffixDecoding) or prompt lookup (ngram), verified in the batched decode step; auto: suffix on the CPU without --tp (faster or equal on every workload of benchmarks/bench_spec.py), none on CUDA (never run on a GPU) and under --tp (docs/DESIGN.md: speculative decoding)"
        },
    )
    speculative_num_draft_tokens: int = field(
        default=24,
        metadata={"help": "most draft tokens one request verifies per step, 1..64 (SuffixDecoding's depth: 24)"},
    )
    speculative_max_batch_size: int = field(
        default=0,
        metadata={
            "help": "no drafts in a step with more running decodes than this; 0: no fixed cutoff, the cost model (--speculative-adaptive) stops drafting where it no longer pays"
        },
    )
    speculative_adaptive: bool = field(
        default=True,
        metadata={
            "help": "choose each step's draft lengths from the measured step time and each request's acceptance (spec/cost.py); --no-speculative-adaptive: every row verifies what the drafter proposes, scaled by its acceptance rate"
        },
    )
    max_pinned_tokens: Optional[int] = field(
        default=None,
        metadata={"help": "cap on KV tokens that open sessions may pin, summed over sessions; default: no cap"},
    )
    random_seed: int = field(default=0, metadata={"help": "seed for requests without their own seed"})
    cuda_graph_max_bs: int = field(default=64, metadata={"help": "largest decode batch captured in a CUDA graph"})
    disable_cuda_graph: bool = field(default=False, metadata={"help": "run decode eagerly on cuda"})
    log_interval: int = field(default=50, metadata={"help": "log throughput and hit rate every N steps"})
    log_level: str = field(default="info", metadata={"help": "debug|info|warning|error"})
    host: str = field(default="127.0.0.1", metadata={"help": "HTTP bind address (loopback by default)"})
    port: int = field(default=30000, metadata={"help": "HTTP port"})
    zmq_port: Optional[int] = field(default=None, metadata={"help": "DSL ZMQ ROUTER port; default port + 1"})
    api_key: Optional[str] = field(
        default=None, metadata={"help": "require 'Authorization: Bearer KEY' on every route but /health"}
    )
    max_restarts: int = field(
        default=3,
        metadata={
            "help": "restarts of the scheduler/detokenizer/tp ranks allowed in any 10 min; then the server stays down (0: never restart)"
        },
    )
    max_queued_requests: Optional[int] = field(
        default=None,
        metadata={
            "help": "requests allowed to wait beyond --max-running-requests; more get 503 with Retry-After (default: one per KV page of the pool)"
        },
    )
    drain_timeout: float = field(
        default=30.0, metadata={"help": "SIGTERM: seconds running requests may take to finish before they are aborted"}
    )
    enable_metrics: bool = field(default=False, metadata={"help": "serve Prometheus /metrics"})
    tool_call_parser: Optional[str] = field(
        default=None, metadata={"help": "hermes|qwen25|llama3|mistral; default: from the chat template / architecture"}
    )
    reasoning_parser: Optional[str] = field(
        default=None, metadata={"help": "qwen3|deepseek-r1: split <think>...</think> into reasoning_content"}
    )
    reasoning_history: str = field(
        default="strip",
        metadata={
            "help": "keep|strip: keep splices an assistant turn's generated ids, reasoning included, into later prompts (a cache hit); strip follows the chat template, which may drop the reasoning"
        },
    )
    turn_store_size: int = field(
        default=4096,
        metadata={"help": "assistant turns whose generated token ids are kept for turn continuity (0: off)"},
    )
    response_store_size: int = field(
        default=256,
        metadata={"help": "stored /v1/responses (oldest dropped first; each pins its conversation as a session)"},
    )
    response_session_ttl: float = field(
        default=600.0, metadata={"help": "seconds a stored response's session stays pinned while idle"}
    )
    num_threads: Optional[int] = field(default=None, metadata={"help": "torch CPU threads; default all cores"})
    tp: int = field(
        default=1, metadata={"help": "tensor-parallel ranks (torch.distributed: gloo on cpu, nccl on cuda)"}
    )
    dp: int = field(
        default=1, metadata={"help": "data-parallel replicas behind a cache-aware router (Ray Serve, extra [cluster])"}
    )
    router_policy: str = field(
        default="cache_aware", metadata={"help": "--dp routing: cache_aware|round_robin|power_of_two|consistent_hash"}
    )
    ray_address: Optional[str] = field(
        default=None,
        metadata={"help": "--dp on an existing Ray cluster (e.g. auto or ray://host:10001); default: a local Ray"},
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ValueError naming the bad field."""

        def choice(name, options):
            if getattr(self, name) not in options:
                raise ValueError(f"{name} must be one of {options}, got {getattr(self, name)!r}")

        choice("schedule_policy", SCHEDULE_POLICIES)
        choice("eviction_policy", tuple(POLICIES))
        choice("grammar_backend", GRAMMAR_BACKENDS)
        choice("device", DEVICES)
        choice("dtype", DTYPES)
        choice("quantization", QUANTIZATIONS)
        choice("kv_cache_dtype", KV_CACHE_DTYPES)
        choice("router_policy", ROUTER_POLICIES)
        choice("reasoning_history", ("keep", "strip"))
        choice("speculative_algorithm", ("auto", "none", "suffix", "ngram"))
        for name in ("turn_store_size", "response_store_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {getattr(self, name)!r}")
        if not self.response_session_ttl > 0:
            raise ValueError(f"response_session_ttl must be > 0, got {self.response_session_ttl!r}")
        for name in (
            "page_size",
            "max_running_requests",
            "chunked_prefill_size",
            "max_num_batched_tokens",
            "max_wait_steps",
            "cuda_graph_max_bs",
            "log_interval",
            "tp",
            "dp",
            "speculative_num_draft_tokens",
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.speculative_num_draft_tokens > MAX_DRAFT_TOKENS:
            raise ValueError(
                f"speculative_num_draft_tokens must be <= {MAX_DRAFT_TOKENS} (the step-time curve's "
                f"last measured size), got {self.speculative_num_draft_tokens!r}"
            )
        v = self.speculative_max_batch_size
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"speculative_max_batch_size must be an integer >= 0, got {v!r}")
        if self.max_pinned_tokens is not None and (
            not isinstance(self.max_pinned_tokens, int) or self.max_pinned_tokens < 0
        ):
            raise ValueError(f"max_pinned_tokens must be an integer >= 0, got {self.max_pinned_tokens!r}")
        for name in ("max_total_tokens", "context_length"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 2):
                raise ValueError(f"{name} must be an integer >= 2, got {v!r}")
        if self.tool_call_parser is not None or self.reasoning_parser is not None:
            from radixrt.runtime.parsers.reasoning import get_reasoning_format
            from radixrt.runtime.parsers.tool_formats import get_tool_format

            if self.tool_call_parser is not None:
                get_tool_format(self.tool_call_parser)
            if self.reasoning_parser is not None:
                get_reasoning_format(self.reasoning_parser)
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ValueError(f"max_restarts must be an integer >= 0, got {self.max_restarts!r}")
        if self.max_queued_requests is not None and (
            not isinstance(self.max_queued_requests, int) or self.max_queued_requests < 0
        ):
            raise ValueError(f"max_queued_requests must be an integer >= 0, got {self.max_queued_requests!r}")
        if not self.drain_timeout >= 0:
            raise ValueError(f"drain_timeout must be >= 0 seconds, got {self.drain_timeout!r}")
        choice("hicache_write_policy", ("write_through", "write_back"))
        if not isinstance(self.hicache_prefetch_threshold, int) or self.hicache_prefetch_threshold < 1:
            raise ValueError(
                f"hicache_prefetch_threshold must be an integer >= 1, got {self.hicache_prefetch_threshold!r}"
            )
        if not (isinstance(self.hicache_size, (int, float)) and self.hicache_size >= 0):
            raise ValueError(f"hicache_size must be >= 0 GB, got {self.hicache_size!r}")
        if not (isinstance(self.hicache_storage_size, (int, float)) and self.hicache_storage_size >= 0):
            raise ValueError(f"hicache_storage_size must be >= 0 GB, got {self.hicache_storage_size!r}")
        if 0 < self.hicache_storage_size * 2**30 < 1:  # would round to 0 bytes, which means "no bound"
            raise ValueError(f"hicache_storage_size: {self.hicache_storage_size!r} GB holds no page")
        if not (isinstance(self.hicache_ratio, (int, float)) and self.hicache_ratio > 0):
            raise ValueError(f"hicache_ratio must be > 0, got {self.hicache_ratio!r}")
        if self.hicache_storage is not None and (
            not self.hicache_storage.startswith("file:") or len(self.hicache_storage) == len("file:")
        ):
            raise ValueError(f"hicache_storage must be file:DIR, got {self.hicache_storage!r}")
        if self.hicache_storage is not None:
            _check_storage_dir(self.hicache_storage[len("file:") :])
        if self.hicache_size > 0 or self.hicache_storage:  # either turns the tiers on: say so in server_info
            self.enable_hierarchical_cache = True
        if self.enable_hierarchical_cache and self.tp > 1:  # refused here, before any rank loads the model
            raise ValueError("enable_hierarchical_cache is not supported with --tp > 1")
        if not 0.0 < self.mem_fraction_static <= 1.0:
            raise ValueError(f"mem_fraction_static must be in (0, 1], got {self.mem_fraction_static}")
        self._check_ports()
        if self.quantization not in ("auto", "none") and self.dtype in ("bfloat16", "float16"):
            raise ValueError(
                f"quantization {self.quantization!r} runs on fp32 activations; with dtype "
                f"{self.dtype!r} the weights stay {self.dtype} ('auto' or 'none')"
            )

    def _check_ports(self) -> None:
        """The HTTP port and the DSL's ZMQ port: each in 1..65535, and two different ports (one socket
        would take both, and HTTP would never be answered)."""
        for name, v in (("port", self.port), ("zmq_port", self.zmq_port)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 65535):
                raise ValueError(f"{name} must be an integer in 1..65535, got {v!r}")
        if self.zmq_port is None and self.port == 65535:
            raise ValueError("zmq_port defaults to port + 1 = 65536: give a zmq_port in 1..65535")
        if self.dsl_port == self.port:
            raise ValueError(f"zmq_port must differ from port ({self.port}): they are two sockets")

    @property
    def dsl_port(self) -> int:
        return self.zmq_port if self.zmq_port is not None else self.port + 1

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        for f in dataclasses.fields(cls):
            flag = "--" + f.name.replace("_", "-")
            helptext = f.metadata.get("help", "")
            if f.type in ("bool", bool):
                parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=helptext)
            else:
                typ = int if "int" in str(f.type) else float if "float" in str(f.type) else str
                parser.add_argument(flag, type=typ, default=f.default, help=f"{helptext} (default: {f.default})")

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> "ServerArgs":
        return cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)})

    def to_cli(self, skip: tuple[str, ...] = ()) -> list[str]:
        """The flags that rebuild these args (non-default fields only), e.g. for a replica's own server."""
        out: list[str] = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in skip or v == f.default:
                continue
            flag = "--" + f.name.replace("_", "-")
            if isinstance(v, bool):
                out.append(flag if v else "--no-" + f.name.replace("_", "-"))
            else:
                out += [flag, str(v)]
        return out

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("api_key")  # never echo the secret
        return d


def _check_storage_dir(path: str) -> None:
    """Before the model loads: ``path`` (tier 3's folder) is a directory, or can be made in an existing,
    writable directory. Raises ValueError naming ``hicache_storage``."""
    import os

    p = os.path.abspath(os.path.expanduser(path))
    if os.path.islink(p) and not os.path.exists(p):  # makedirs would fail on it after the model loaded
        raise ValueError(f"hicache_storage: {p} is a symbolic link to {os.readlink(p)!r}, which does not exist")
    if os.path.exists(p):
        if not os.path.isdir(p):
            raise ValueError(f"hicache_storage: {p} exists and is not a directory")
        if not os.access(p, os.W_OK | os.X_OK):
            raise ValueError(f"hicache_storage: {p} is not writable")
        return
    parent = os.path.dirname(p)
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK) or parent.startswith(("/proc", "/sys")):
        raise ValueError(f"hicache_storage: {p} cannot be created (nearest existing parent: {parent})")
