"""ServerArgs: every runtime option in one place. ``radixrt serve --flag`` and ``Engine(flag=...)`` take
the same names (SGLang's spelling where one exists)."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from radixrt.runtime.config_check import validate


def flag(default=None, help: str = "", factory=None):
    """A ServerArgs field: its default (or ``factory`` for a mutable one) and its ``--help`` text."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class ServerArgs:
    model: Optional[str] = flag(None, "alias (smollm2-135m), .gguf path or HF dir; default SmolLM2-135M-Instruct")
    served_model_name: Optional[str] = flag(None, "model name reported by /v1/models")
    device: str = flag("auto", "auto|cpu|cuda; auto picks cuda when available")
    dtype: str = flag("auto", "auto|float32|bfloat16|float16; auto: bf16 on cuda, fp32 on cpu")
    quantization: str = flag(
        "auto",
        "auto|none|fp16|bf16|int8|q4|q4_k weights on cpu, applied while loading, layer by layer; auto: a GGUF's "
        "own blocks, every type (Q4_K_M, Q8_0, ...), a safetensors dir's own dtype (fp32/fp16/bf16)",
    )
    kv_cache_dtype: str = flag(
        "auto",
        "auto|fp32|fp16|bf16|int8 KV pool; auto: fp16 for quantized or 2-byte weights (GGUF blocks, q4, int8, "
        "fp16, bf16), fp32 for fp32 weights (cuda: the model dtype); int8 has a scale per token and KV head (cpu "
        "only)",
    )
    attention_backend: str = flag("auto", "auto|torch_native|flashinfer")
    context_length: Optional[int] = flag(None, "max prompt+output tokens; default: the model's")
    page_size: int = flag(16, "tokens per KV page")
    max_total_tokens: Optional[int] = flag(
        None,
        "KV pool size in tokens (default: --mem-fraction-static of the memory left after the weights)",
    )
    mem_fraction_static: float = flag(
        0.85,
        "max_total_tokens unset: the KV pool's share of free GPU memory (weights included), or on the cpu of the "
        "memory available after the weights",
    )
    max_running_requests: int = flag(64, "cap on requests in one batch")
    chunked_prefill_size: int = flag(512, "max prefill tokens of one request per step")
    max_num_batched_tokens: int = flag(1024, "token budget of one step (decodes + prefill)")
    schedule_policy: str = flag("lpm", "lpm|fcfs|dfs-weight (lpm falls back to fcfs without the cache)")
    max_wait_steps: int = flag(64, "lpm aging: a request waiting more steps than this is served next")
    disable_radix_cache: bool = flag(False, "turn prefix reuse off (ablation)")
    disable_cascade_attention: bool = flag(False, "attend shared prefixes per row instead of once per group (ablation)")
    cpu_cascade_attention: bool = flag(
        False,
        "cpu kernels: attend a shared prefix once per group of rows (faster at many rows on a long prefix; not "
        "batch-invariant: off by default)",
    )
    eviction_policy: str = flag(
        "gdsf",
        "gdsf|lru|lfu: which cached prefix goes first when pages run short (mem/eviction.py)",
    )
    enable_hierarchical_cache: bool = flag(
        False,
        "keep pages evicted from the KV pool in a host store (tier 2) and load them back on a match instead of "
        "recomputing (mem/hicache.py)",
    )
    hicache_size: float = flag(
        0.0,
        "host store size in GB (turns the tiers on); 0 with --enable-hierarchical-cache: --hicache-ratio x the pool",
    )
    hicache_ratio: float = flag(2.0, "host store size as a multiple of the KV pool, when --hicache-size is 0")
    hicache_storage: Optional[str] = flag(
        None,
        "file:DIR: also keep pages in files under DIR (tier 3, created 0700), so a restart with the same model "
        "finds them",
    )
    hicache_storage_size: float = flag(
        0.0,
        "bound on tier 3's page files in GB (0: none); past it the least recently used files are deleted",
    )
    hicache_prefetch_threshold: int = flag(
        256,
        "tokens found in tier 3 beyond the tree and host store for a queued request's pages to be read ahead of "
        "its admission",
    )
    hicache_write_policy: str = flag(
        "write_through",
        "write_through|write_back: tier 3 is written when a page enters the tree, or when it leaves the host store",
    )
    request_log: Optional[str] = flag(
        None,
        "append one JSON line per finished request to this file (docs/cache.md: request log)",
    )
    request_log_hash: bool = flag(False, "request log: one hash per page instead of token ids")
    grammar_backend: str = flag(
        "llguidance",
        "llguidance|xgrammar|outlines|none (llguidance: the only one with no invalid output on the schema "
        "benchmark, benchmarks/results/grammar_backends.md)",
    )
    grammar_overlap: bool = flag(
        False,
        "fill the next step's grammar masks on a worker thread while the forward runs; off by default: on few CPU "
        "cores the thread competes with the forward (benchmarks/results/grammar_backends.md)",
    )
    disable_jump_forward: bool = flag(
        True,
        "on by default (jump-forward off): it loses wall time at 16 concurrent requests; "
        "--no-disable-jump-forward appends grammar-forced text in one extend step",
    )
    speculative_algorithm: str = flag(
        "auto",
        "auto|none|suffix|ngram: draftless speculative decoding; drafts from the request's own tokens and recent "
        "outputs (suffix, SuffixDecoding) or prompt lookup (ngram), verified in the batched decode step; auto: "
        "suffix on the CPU without --tp (faster or equal on every workload of benchmarks/bench_spec.py), none on "
        "CUDA (never run on a GPU) and under --tp (docs/DESIGN.md: speculative decoding)",
    )
    speculative_num_draft_tokens: int = flag(
        24,
        "most draft tokens one request verifies per step, 1..64 (SuffixDecoding's depth: 24)",
    )
    speculative_max_batch_size: int = flag(
        0,
        "no drafts in a step with more running decodes than this; 0: no fixed cutoff, the cost model "
        "(--speculative-adaptive) stops drafting where it no longer pays",
    )
    speculative_adaptive: bool = flag(
        True,
        "choose each step's draft lengths from the measured step time and each request's acceptance "
        "(spec/cost.py); --no-speculative-adaptive: every row verifies what the drafter proposes, scaled by its "
        "acceptance rate",
    )
    max_pinned_tokens: Optional[int] = flag(
        None,
        "cap on KV tokens that open sessions may pin, summed over sessions; default: no cap",
    )
    random_seed: int = flag(0, "seed for requests without their own seed")
    cuda_graph_max_bs: int = flag(64, "largest decode batch captured in a CUDA graph")
    disable_cuda_graph: bool = flag(False, "run decode eagerly on cuda")
    log_interval: int = flag(50, "log throughput and hit rate every N steps")
    log_level: str = flag("info", "debug|info|warning|error")
    host: str = flag("127.0.0.1", "HTTP bind address (loopback by default)")
    port: int = flag(30000, "HTTP port")
    zmq_port: Optional[int] = flag(None, "DSL ZMQ ROUTER port; default port + 1")
    api_key: Optional[str] = flag(None, "require 'Authorization: Bearer KEY' on every route but /health")
    max_restarts: int = flag(
        3,
        "restarts of the scheduler/detokenizer/tp ranks allowed in any 10 min; then the server stays down (0: "
        "never restart)",
    )
    max_queued_requests: Optional[int] = flag(
        None,
        "requests allowed to wait beyond --max-running-requests; more get 503 with Retry-After (default: one per "
        "KV page of the pool)",
    )
    drain_timeout: float = flag(30.0, "SIGTERM: seconds running requests may take to finish before they are aborted")
    enable_metrics: bool = flag(False, "serve Prometheus /metrics")
    tool_call_parser: Optional[str] = flag(
        None,
        "hermes|qwen25|llama3|mistral; default: from the chat template / architecture",
    )
    reasoning_parser: Optional[str] = flag(None, "qwen3|deepseek-r1: split <think>...</think> into reasoning_content")
    reasoning_history: str = flag(
        "strip",
        "keep|strip: keep splices an assistant turn's generated ids, reasoning included, into later prompts (a "
        "cache hit); strip follows the chat template, which may drop the reasoning",
    )
    turn_store_size: int = flag(4096, "assistant turns whose generated token ids are kept for turn continuity (0: off)")
    response_store_size: int = flag(
        256,
        "stored /v1/responses (oldest dropped first; each pins its conversation as a session)",
    )
    response_session_ttl: float = flag(600.0, "seconds a stored response's session stays pinned while idle")
    num_threads: Optional[int] = flag(None, "torch CPU threads; default all cores")
    tp: int = flag(1, "tensor-parallel ranks (torch.distributed: gloo on cpu, nccl on cuda)")
    dp: int = flag(1, "data-parallel replicas behind a cache-aware router (Ray Serve, extra [cluster])")
    router_policy: str = flag("cache_aware", "--dp routing: cache_aware|round_robin|power_of_two|consistent_hash")
    ray_address: Optional[str] = flag(
        None,
        "--dp on an existing Ray cluster (e.g. auto or ray://host:10001); default: a local Ray",
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ValueError naming the bad field (the checks: :mod:`.config_check`)."""
        validate(self)

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
        given = vars(ns)
        return cls(**{f.name: given[f.name] for f in dataclasses.fields(cls)})

    def to_cli(self, skip: tuple[str, ...] = ()) -> list[str]:
        """The flags that rebuild these args (non-default fields only), e.g. for a replica's own server."""
        out: list[str] = []
        values = vars(self)
        for f in dataclasses.fields(self):
            v = values[f.name]
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
