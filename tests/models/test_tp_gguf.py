"""``--tp`` over a GGUF file's own blocks (models/gguf_tp.py): each rank reads its slices of the file, no
fp32 state dict.

SmolLM2-135M's Q4_1 file (9 query / 3 KV heads, intermediate 1,536, a Q8_0 embedding) split over 3 ranks,
every rank a real process joined by torch.distributed (gloo) over TCP on 127.0.0.1: greedy tokens equal the
unsharded model's, and so do the logits, bit for bit, at ``auto`` (the file's Q4_1 blocks) and at ``none``
(fp32, dequantized per slice): every output value is computed by one rank with the one-device arithmetic;
each rank holds a third of the projections, in their blocks.
"""

from __future__ import annotations

import socket

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

STEPS = 12
FORMATS = ("auto", "none")
TP = 3


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rank(fmt: str, prompt: list[int], tp=None) -> dict:
    """Prefill ``prompt`` then STEPS greedy decodes on one rank of ``tp`` (None: unsharded); the tokens, the
    logits of each step, this rank's weight bytes and the types of layer 0's projections."""
    from radixrt.kernels.attention import get_backend
    from radixrt.kernels.attention.metadata import AttentionMetadata
    from radixrt.runtime.executor.memory import weight_bytes
    from radixrt.runtime.layers.tp_shard import local_heads
    from radixrt.runtime.mem.kv_pool import KVPool
    from radixrt.runtime.models.args import ModelArgs
    from radixrt.runtime.models.gguf_load import build_from_gguf
    from radixrt.runtime.models.loader import load_config, resolve_model

    src = resolve_model(None)
    a = ModelArgs.from_hf(load_config(None))
    model = build_from_gguf(f"{src.directory}/{src.gguf_file}", a, fmt, 256, tp)
    _, nkv = local_heads(a.num_heads, a.num_kv_heads, tp.size if tp else 1)
    kv = KVPool(16, 16, a.num_layers, nkv, a.head_dim)
    attn = get_backend("torch_native", "cpu", torch.float32)
    table, tokens, logits = list(range(16)), list(prompt), []
    q = len(prompt)
    for _ in range(STEPS + 1):
        attn.plan(AttentionMetadata.build([table], [q], [len(tokens)], 16))
        hidden = model(torch.tensor(tokens[-q:]), torch.arange(len(tokens) - q, len(tokens)), attn, kv)
        row = model.compute_logits(hidden[-1:])[0]
        logits.append(row.numpy())
        tokens.append(int(row.argmax()))
        q = 1
    layer = model.layers[0]
    kinds = {
        n: type(m).__name__ + "/" + str(getattr(getattr(m, "inner", m), "type_name", "-"))
        for n, m in [
            ("qkv", layer.self_attn.qkv_proj),
            ("o", layer.self_attn.o_proj),
            ("gate_up", layer.mlp.gate_up_proj),
            ("down", layer.mlp.down_proj),
            ("embed", model.embed_tokens),
        ]
    }
    return {"tokens": tokens[len(prompt) :], "logits": np.stack(logits), "bytes": weight_bytes(model), "kinds": kinds}


def _worker(rank: int, init: str, prompt: list[int], q) -> None:
    import torch.distributed as dist

    from radixrt.runtime.layers.parallel import TPGroup

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=TP)
        group = dist.group.WORLD
        out = {fmt: run_rank(fmt, prompt, TPGroup(rank, TP, group, group)) for fmt in FORMATS}
        dist.barrier()
        dist.destroy_process_group()
        q.put((rank, out))
    except BaseException as e:  # report instead of leaving the parent waiting
        q.put((rank, f"{type(e).__name__}: {e}"))


@pytest.fixture(scope="module")
def runs(passage_ids):
    prompt = passage_ids[:40]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init = f"tcp://127.0.0.1:{_port()}"
    procs = [ctx.Process(target=_worker, args=(r, init, prompt, q)) for r in range(TP)]
    for p in procs:
        p.start()
    ranks = dict(q.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    for r, v in ranks.items():
        assert not isinstance(v, str), f"rank {r}: {v}"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank runs (one thread each)
    try:
        single = {fmt: run_rank(fmt, prompt) for fmt in FORMATS}
    finally:
        torch.set_num_threads(threads)  # not 1 for the rest of the session's tests in this process
    return single, ranks


@pytest.mark.parametrize("fmt", FORMATS)
def test_sharded_gguf_matches_single_device(runs, fmt):
    single, ranks = runs
    ref = single[fmt]
    for r in range(TP):
        got = ranks[r][fmt]
        assert got["tokens"] == ref["tokens"], f"rank {r}"
        np.testing.assert_array_equal(got["logits"], ref["logits"])


def test_each_rank_holds_a_third_in_the_files_blocks(runs):
    single, ranks = runs
    assert single["auto"]["kinds"] == {
        "qkv": "GGMLLinear/Q4_1",
        "o": "GGMLLinear/Q4_1",
        "gate_up": "GGMLLinear/Q4_1",
        "down": "GGMLLinear/Q4_1",
        "embed": "GGMLEmbedding/Q8_0",
    }
    for r in range(TP):
        assert ranks[r]["auto"]["kinds"] == {
            "qkv": "GGMLLinear/Q4_1",
            "o": "GatherLinear/Q4_1",
            "gate_up": "GGMLLinear/Q4_1",
            "down": "GatherLinear/Q4_1",
            "embed": "VocabShard/Q8_0",
        }
    full = single["auto"]["bytes"]
    shares = [ranks[r]["auto"]["bytes"] for r in range(TP)]
    # the norms (fp32, 577 KB in all) are the only weights every rank holds whole
    assert all(abs(s - full / TP) < 0.01 * full for s in shares), (full, shares)
    assert full < sum(shares) < full * 1.02


def test_head_counts_that_do_not_split_are_refused():
    from radixrt.runtime.layers.parallel import TPGroup
    from radixrt.runtime.models.args import ModelArgs
    from radixrt.runtime.models.gguf_tp import TPSlices
    from radixrt.runtime.models.loader import load_config

    from radixrt.runtime.config import ServerArgs
    from radixrt.runtime.scheduler.process import _check_split

    a = ModelArgs.from_hf(load_config(None))
    with pytest.raises(ValueError, match=r"tp=2 must divide num_attention_heads=9"):
        TPSlices(a, TPGroup(0, 2))
    # rank 0 checks before it spawns a rank (--tp 100 used to start 99 processes first)
    with pytest.raises(ValueError, match=r"tp=100 must divide num_attention_heads=9"):
        _check_split(ServerArgs(tp=100))
