"""The checks of :class:`~radixrt.runtime.config.ServerArgs` and the values its choice fields allow: one
ValueError naming the field for each bad value, raised at construction (``Engine(...)``, ``radixrt serve``),
before any process or model starts."""

from __future__ import annotations

from radixrt.runtime.mem.eviction import POLICIES

SCHEDULE_POLICIES = ("lpm", "fcfs", "dfs-weight")
GRAMMAR_BACKENDS = ("xgrammar", "llguidance", "outlines", "none")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
MAX_DRAFT_TOKENS = 64  # the largest step size the speculation cost model measures (scheduler/spec_calibrate.py)
QUANTIZATIONS = ("auto", "none", "fp16", "bf16", "int8", "q4", "q4_k")
KV_CACHE_DTYPES = ("auto", "fp32", "fp16", "bf16", "int8")
ROUTER_POLICIES = ("cache_aware", "round_robin", "power_of_two", "consistent_hash")


def validate(args) -> None:
    """Check every field of ``args`` (a ServerArgs); turns ``enable_hierarchical_cache`` on where a tier is
    sized. Raises ValueError naming the bad field."""
    values = vars(args)  # the checks below name the fields they read

    def choice(name, options):
        if values[name] not in options:
            raise ValueError(f"{name} must be one of {options}, got {values[name]!r}")

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
        if not isinstance(values[name], int) or values[name] < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {values[name]!r}")
    if not args.response_session_ttl > 0:
        raise ValueError(f"response_session_ttl must be > 0, got {args.response_session_ttl!r}")
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
        v = values[name]
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    v = args.num_threads  # None: every core
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
        raise ValueError(f"num_threads must be a positive integer (or unset: every core), got {v!r}")
    if args.speculative_num_draft_tokens > MAX_DRAFT_TOKENS:
        raise ValueError(
            f"speculative_num_draft_tokens must be <= {MAX_DRAFT_TOKENS} (the step-time curve's "
            f"last measured size), got {args.speculative_num_draft_tokens!r}"
        )
    v = args.speculative_max_batch_size
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ValueError(f"speculative_max_batch_size must be an integer >= 0, got {v!r}")
    if args.max_pinned_tokens is not None and (
        not isinstance(args.max_pinned_tokens, int) or args.max_pinned_tokens < 0
    ):
        raise ValueError(f"max_pinned_tokens must be an integer >= 0, got {args.max_pinned_tokens!r}")
    for name in ("max_total_tokens", "context_length"):
        v = values[name]
        if v is not None and (not isinstance(v, int) or v < 2):
            raise ValueError(f"{name} must be an integer >= 2, got {v!r}")
    if args.tool_call_parser is not None or args.reasoning_parser is not None:
        from radixrt.runtime.parsers.reasoning import get_reasoning_format
        from radixrt.runtime.parsers.tool_formats import get_tool_format

        if args.tool_call_parser is not None:
            get_tool_format(args.tool_call_parser)
        if args.reasoning_parser is not None:
            get_reasoning_format(args.reasoning_parser)
    if not isinstance(args.max_restarts, int) or args.max_restarts < 0:
        raise ValueError(f"max_restarts must be an integer >= 0, got {args.max_restarts!r}")
    if args.max_queued_requests is not None and (
        not isinstance(args.max_queued_requests, int) or args.max_queued_requests < 0
    ):
        raise ValueError(f"max_queued_requests must be an integer >= 0, got {args.max_queued_requests!r}")
    if not args.drain_timeout >= 0:
        raise ValueError(f"drain_timeout must be >= 0 seconds, got {args.drain_timeout!r}")
    choice("hicache_write_policy", ("write_through", "write_back"))
    if not isinstance(args.hicache_prefetch_threshold, int) or args.hicache_prefetch_threshold < 1:
        raise ValueError(f"hicache_prefetch_threshold must be an integer >= 1, got {args.hicache_prefetch_threshold!r}")
    if not (isinstance(args.hicache_size, (int, float)) and args.hicache_size >= 0):
        raise ValueError(f"hicache_size must be >= 0 GB, got {args.hicache_size!r}")
    if not (isinstance(args.hicache_storage_size, (int, float)) and args.hicache_storage_size >= 0):
        raise ValueError(f"hicache_storage_size must be >= 0 GB, got {args.hicache_storage_size!r}")
    if 0 < args.hicache_storage_size * 2**30 < 1:  # would round to 0 bytes, which means "no bound"
        raise ValueError(f"hicache_storage_size: {args.hicache_storage_size!r} GB holds no page")
    if not (isinstance(args.hicache_ratio, (int, float)) and args.hicache_ratio > 0):
        raise ValueError(f"hicache_ratio must be > 0, got {args.hicache_ratio!r}")
    if args.hicache_storage is not None and (
        not args.hicache_storage.startswith("file:") or len(args.hicache_storage) == len("file:")
    ):
        raise ValueError(f"hicache_storage must be file:DIR, got {args.hicache_storage!r}")
    if args.hicache_storage is not None:
        _check_storage_dir(args.hicache_storage[len("file:") :])
    if args.hicache_size > 0 or args.hicache_storage:  # either turns the tiers on: say so in server_info
        args.enable_hierarchical_cache = True
    if args.enable_hierarchical_cache and args.tp > 1:  # refused here, before any rank loads the model
        raise ValueError("enable_hierarchical_cache is not supported with --tp > 1")
    if not 0.0 < args.mem_fraction_static <= 1.0:
        raise ValueError(f"mem_fraction_static must be in (0, 1], got {args.mem_fraction_static}")
    _check_ports(args)
    if args.quantization not in ("auto", "none") and args.dtype in ("bfloat16", "float16"):
        raise ValueError(
            f"quantization {args.quantization!r} runs on fp32 activations; with dtype "
            f"{args.dtype!r} the weights stay {args.dtype} ('auto' or 'none')"
        )


def _check_ports(args) -> None:
    """The HTTP port and the DSL's ZMQ port: each in 1..65535, and two different ports (one socket
    would take both, and HTTP would never be answered)."""
    for name, v in (("port", args.port), ("zmq_port", args.zmq_port)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 65535):
            raise ValueError(f"{name} must be an integer in 1..65535, got {v!r}")
    if args.zmq_port is None and args.port == 65535:
        raise ValueError("zmq_port defaults to port + 1 = 65536: give a zmq_port in 1..65535")
    if args.dsl_port == args.port:
        raise ValueError(f"zmq_port must differ from port ({args.port}): they are two sockets")


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
