"""Shared bits of the examples: the --backend argument and token accounting."""

from __future__ import annotations

import argparse
from typing import Any, Iterable

import radixrt as rt

DEFAULT_BACKEND = "tcp://127.0.0.1:30001"


def add_backend_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        default=DEFAULT_BACKEND,
        help="tcp://HOST:PORT (ZMQ, `radixrt serve`'s HTTP port + 1), http://HOST:PORT (native "
        "HTTP) or 'engine' (load the model in this process)",
    )


def make_backend(url_or_backend: Any) -> Any:
    """A DSL backend: an object passes through; 'engine' starts an in-process Engine; else an endpoint."""
    if not isinstance(url_or_backend, str):
        return url_or_backend
    if url_or_backend == "engine":
        return rt.Engine(max_total_tokens=16384)
    return rt.RuntimeEndpoint(url_or_backend)


def _flat(m: Any) -> Iterable[dict]:
    if isinstance(m, dict):
        yield m
    elif isinstance(m, list):  # fork().join() gathers the children's meta info as lists
        for x in m:
            yield from _flat(x)


def _metas(states: Iterable[Any]) -> Iterable[dict]:
    for st in states:
        for m in st.stream_executor.meta_info.values():
            yield from _flat(m)


def token_usage(states: Iterable[Any]) -> dict:
    """Sum prompt / cached / completion tokens over every gen and select of ``states``."""
    out = {"prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0, "requests": 0}
    seen: set = set()
    for m in _metas(states):
        key = id(m)
        if key in seen:  # a fork child carries its parent's meta: count it once
            continue
        seen.add(key)
        for k in ("prompt_tokens", "cached_tokens", "completion_tokens"):
            v = m.get(k) or 0
            out[k] += sum(v) if isinstance(v, list) else v
        out["requests"] += len(m["prompt_tokens"]) if isinstance(m.get("prompt_tokens"), list) else 1
    out["cached_share"] = out["cached_tokens"] / max(out["prompt_tokens"], 1)
    return out
