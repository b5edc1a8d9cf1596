"""Memory of ``radixrt serve`` (issue 26): the weight, KV pool and per-process peak RSS figures of
``/get_server_info`` and ``/metrics``, and the detokenizer running without torch (it needs a tokenizer, not a
model)."""

from __future__ import annotations

import pytest

from radixrt.runtime.layers.ggml_ops import use_x16
from radixrt.runtime.models.gguf_weights import GGUF_TYPES, GGUFWeights
from radixrt.runtime.models.loader import default_gguf_path
from server_util import CONTEXT, start_server

SMOLLM2_KV_FP16_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 2  # layers x (K, V) x KV heads x head_dim x fp16


@pytest.fixture(scope="module")
def server():
    s = start_server("--enable-metrics", "--quantization", "auto")
    yield s
    assert s.stop() == 0, s.logs()


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _maps_torch(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return "libtorch_cpu" in f.read()


def test_weights_kv_and_peak_rss_are_reported(server):
    with server.client() as c:
        mem = c.get("/get_server_info").json()["memory"]
        metrics = c.get("/metrics").text
    w = GGUFWeights(default_gguf_path(), 9, 3, GGUF_TYPES)
    stored = w.nbytes()
    rotary = 2 * CONTEXT * 64 * 4  # cos and sin, fp32, at the served context length
    # the tied head: the embedding's Q8_0 bytes, or (where the x16 layout runs) their repack, the same size
    head = w.need("token_embd.weight")
    repacked = head.torch_bytes(copy=False).numel() if use_x16("Q8_0", head.shape[0]) else 0
    assert mem["weight_bytes"] == stored + rotary + repacked
    assert mem["kv_dtype"] == "fp16" and mem["kv_pool_bytes"] == 8192 * SMOLLM2_KV_FP16_BYTES_PER_TOKEN
    peaks = mem["peak_rss_by_process"]
    assert set(peaks) == {"main", "scheduler", "detokenizer", "total"}
    assert peaks["total"] == peaks["main"] + peaks["scheduler"] + peaks["detokenizer"]
    assert peaks["scheduler"] == mem["peak_rss_bytes"] > mem["weight_bytes"]
    values = {
        line.split("{")[0]: float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith(("radixrt:weight_bytes", "radixrt:kv_pool_bytes", "radixrt:peak_rss_bytes"))
    }
    assert values["radixrt:weight_bytes"] == mem["weight_bytes"]
    assert values["radixrt:kv_pool_bytes"] == mem["kv_pool_bytes"]
    assert values["radixrt:peak_rss_bytes"] >= peaks["total"]


def test_only_the_scheduler_loads_torch(server):
    """The detokenizer reads tokenizer.json with ``tokenizers`` alone; the main process tokenizes and compiles
    grammars (its start-up warm-up included, ``constrained.grammar_step.warm_up`` without masks) without
    torch: only the scheduler maps libtorch."""
    main = server.proc.pid
    kids = [p for p in _children(main) if "resource_tracker" not in open(f"/proc/{p}/cmdline").read()]
    assert len(kids) == 2  # scheduler and detokenizer
    assert sorted(_maps_torch(p) for p in kids) == [False, True]
    assert not _maps_torch(main)
