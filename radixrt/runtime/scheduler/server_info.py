"""The ``get_server_info`` dict, one shape for the offline Engine and ``GET /get_server_info``."""

from __future__ import annotations

from typing import Any


def queue_stats(sched) -> dict:
    """The scheduler's live state: ``cache`` (page counts, hit tokens, ``speculative``: the speculator's
    counters), ``num_running`` and ``num_waiting``
    (requests; waiting includes those whose grammar is still compiling), ``memory`` (bytes: weights, KV
    pool, this process's RSS and peak RSS). Call it in the scheduler's thread."""
    return {
        "cache": {**sched.cache_stats(), "speculative": sched.spec.stats()},
        "num_running": len(sched.running),
        "num_waiting": len(sched.waiting) + len(sched.grammar_queue),
        "memory": sched.runner.memory_stats(),
    }


def server_info(args, stats: dict, context_length: int, max_total_tokens: int, model_name: str, **extra: Any) -> dict:
    """Every ServerArgs field, then ``stats`` (:func:`queue_stats`), the context length and KV pool size
    (tokens), the model name, then ``extra`` (the server adds ``version`` and ``process_ids``)."""
    return {
        **args.to_dict(),
        **stats,
        "context_length": context_length,
        "max_total_tokens": max_total_tokens,
        "model_name": model_name,
        **extra,
    }
