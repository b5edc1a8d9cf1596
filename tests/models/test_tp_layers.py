"""Tensor-parallel layers on CPU (gloo): a sharded model's logits and greedy tokens equal the unsharded one's.

Random-weight Llama directories (transformers ``save_pretrained``) whose head counts split: tp=2 splits
the KV heads, tp=4 replicates them (2 KV heads over 4 ranks), tp=3 splits 6 query / 3 KV heads. Every rank
is a real process joined by torch.distributed (gloo) over TCP on 127.0.0.1.
"""

from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp

PROMPT = [1, 17, 402, 9, 3321, 88, 15, 47000, 5, 12, 640]
STEPS = 6


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_dir(path, heads: int, kv_heads: int, tied: bool) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(heads * 10 + kv_heads)
    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=96,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=16,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
    )
    LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


def run_rank(model_dir: str, tp=None):
    """Prefill PROMPT, then STEPS greedy decodes, on one rank of ``tp`` (a TPGroup; None: unsharded).
    Returns (tokens, logits of every step ``[STEPS+1, vocab]`` fp32)."""
    from radixrt.kernels.attention import get_backend
    from radixrt.kernels.attention.metadata import AttentionMetadata
    from radixrt.runtime.layers.tp_shard import local_heads, shard_model
    from radixrt.runtime.mem.kv_pool import KVPool
    from radixrt.runtime.models.loader import load_config, load_state_dict
    from radixrt.runtime.models.args import ModelArgs
    from radixrt.runtime.models.llama import LlamaForCausalLM

    a = ModelArgs.from_hf(load_config(model_dir))
    model = LlamaForCausalLM(a)
    model.load_hf_state_dict(load_state_dict(model_dir))
    if tp is not None:
        shard_model(model, tp)
    model.eval()
    _, nkv = local_heads(a.num_heads, a.num_kv_heads, tp.size if tp else 1)
    kv = KVPool(8, 4, a.num_layers, nkv, a.head_dim)
    attn = get_backend("torch_native", "cpu", torch.float32)
    table, tokens, logits = list(range(8)), list(PROMPT), []
    q = len(PROMPT)
    for _ in range(STEPS + 1):
        attn.plan(AttentionMetadata.build([table], [q], [len(tokens)], 4))
        hidden = model(torch.tensor(tokens[-q:]), torch.arange(len(tokens) - q, len(tokens)), attn, kv)
        row = model.compute_logits(hidden[-1:])[0]
        logits.append(row)
        tokens.append(int(row.argmax()))
        q = 1
    return tokens[len(PROMPT) :], torch.stack(logits)


def _worker(rank: int, init: str, cases: list, q) -> None:
    """One process of a 4-rank world; every case runs on the subgroup of its first ``tp`` ranks."""
    import torch.distributed as dist

    from radixrt.runtime.layers.parallel import RowParallelLinear, TPGroup

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
        out = {}
        for name, model_dir, size in cases:
            group = dist.new_group(list(range(size)))  # every process takes part in creating each group
            if rank < size:
                tokens, logits = run_rank(model_dir, TPGroup(rank, size, group, group))
                out[name] = (tokens, logits.numpy())  # numpy pickles by value; a tensor goes by shared fd
        group = dist.new_group([0, 1])
        if rank < 2:  # row-parallel with a bias: rank 0 alone adds it
            layer = RowParallelLinear(_W[:, rank * 4 : (rank + 1) * 4], _B, TPGroup(rank, 2, group, group))
            out["bias"] = (layer.bias is not None, layer(_X[:, rank * 4 : (rank + 1) * 4]).detach().numpy())
        dist.barrier()
        dist.destroy_process_group()
        q.put((rank, out))
    except BaseException as e:  # report instead of leaving the parent waiting
        q.put((rank, f"{type(e).__name__}: {e}"))


WORLD = 4
CASES = [("tp2_split_kv", 4, 2, 2, True), ("tp4_replicated_kv", 8, 2, 4, False), ("tp3", 6, 3, 3, True)]
_G = torch.Generator().manual_seed(0)  # the same tensors in every spawned rank (they re-import this module)
_X, _W, _B = torch.randn(3, 8, generator=_G), torch.randn(5, 8, generator=_G), torch.randn(5, generator=_G)


@pytest.fixture(scope="module")
def tp_runs(tmp_path_factory):
    """Spawn the 4 ranks once for every case; returns (case -> model dir, rank -> results)."""
    dirs = {name: make_dir(tmp_path_factory.mktemp(name), h, kvh, tied) for name, h, kvh, _, tied in CASES}
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init = f"tcp://127.0.0.1:{_port()}"
    cases = [(name, dirs[name], tp) for name, _, _, tp, _ in CASES]
    procs = [ctx.Process(target=_worker, args=(r, init, cases, q)) for r in range(WORLD)]
    for p in procs:
        p.start()
    out = dict(q.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    for r, v in out.items():
        assert not isinstance(v, str), f"rank {r}: {v}"
    return dirs, out


@pytest.mark.parametrize("name,tp", [(c[0], c[3]) for c in CASES])
def test_sharded_model_matches_single_device(tp_runs, name, tp):
    dirs, out = tp_runs
    ref_tokens, ref_logits = run_rank(dirs[name])
    for rank in range(tp):
        tokens, logits = out[rank][name]
        assert tokens == ref_tokens, f"rank {rank}"
        logits = torch.from_numpy(logits)
        assert logits.shape == ref_logits.shape == (STEPS + 1, 49152)
        torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=1e-4)
        assert torch.equal(logits, torch.from_numpy(out[0][name][1]))  # all-gathered: identical everywhere


def test_partitioning_and_bad_splits():
    from radixrt.runtime.layers.parallel import kv_heads, q_heads, vocab_range
    from radixrt.runtime.layers.tp_shard import local_heads

    assert local_heads(9, 3, 3) == (3, 1)  # SmolLM2 at tp=3
    assert [kv_heads(r, 4, 2) for r in range(4)] == [[0], [0], [1], [1]]  # replicated
    assert q_heads(3, 4, 8) == [6, 7]
    assert [vocab_range(r, 3, 10) for r in range(3)] == [(0, 4), (4, 8), (8, 10)]
    with pytest.raises(ValueError, match="num_attention_heads"):
        q_heads(0, 2, 9)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        kv_heads(0, 4, 3)


def test_row_parallel_bias_counted_once(tp_runs):
    """Row-parallel with a bias at tp=2: the bias is added on rank 0 only, so the sum has it once."""
    _, out = tp_runs
    full = torch.nn.functional.linear(_X, _W, _B)
    assert [out[r]["bias"][0] for r in range(2)] == [True, False]
    for r in range(2):
        torch.testing.assert_close(torch.from_numpy(out[r]["bias"][1]), full, atol=1e-5, rtol=1e-5)
