"""The systems compared, one module each, all driven through one interface (:class:`base.System`): ``start``,
``configure`` and ``reset`` (a cold cache before each workload), ``warmup``, ``run(workload, programs, pbar)``
-> records, ``stop``. :mod:`.radixrt` is ``radixrt serve`` and its no-cache ablation, :mod:`.hf_generate`
transformers ``generate`` in this process, :mod:`.llama_server` llama.cpp's own ``llama-server``, and
:mod:`.llama_cpp_python` llama-cpp-python's server; :mod:`.base` holds what they share (the HTTP driver and
the helpers that make every system send the same token ids and decide ``select`` the same way) and
:mod:`.process` the child-process handling of the three servers. Import this package as ``systems`` with
``benchmarks/`` on ``sys.path``; its ``radixrt`` module is ``systems.radixrt``, never the ``radixrt`` package."""

from __future__ import annotations

from .base import (
    HTTPSystem,
    RestartedServer,
    System,
    call_key,
    choices_grammar,
    common_prefix,
    decide,
    eos_ids_of,
    gbnf_literal,
    now,
    prompt_ids,
    select_boundaries,
    sse_lines,
    stream_json,
)
from .hf_generate import HFGenerate
from .llama_cpp_python import LlamaCpp
from .llama_server import LlamaServer
from .radixrt import RadixRT

__all__ = [
    "System",
    "HTTPSystem",
    "RestartedServer",
    "RadixRT",
    "HFGenerate",
    "LlamaServer",
    "LlamaCpp",
    "call_key",
    "choices_grammar",
    "common_prefix",
    "decide",
    "eos_ids_of",
    "gbnf_literal",
    "now",
    "prompt_ids",
    "select_boundaries",
    "sse_lines",
    "stream_json",
]
