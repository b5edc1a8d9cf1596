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
    cfg = LlamaConfig(vocab_size=49152, hidden_size=96, intermediate_size=192, num_hidden_layers=2,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=16,
                      max_position_embeddings=256, tie_word_embeddings=tied)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


def run_rank(model_dir: str, rank: int, size: int, init: str | None):
    """Prefill PROMPT, then STEPS greedy decodes. Returns (tokens, logits of every step [STEPS+1, vocab])."""
    from radixrt.kernels.attention import get_backend
    from radixrt.kernels.attention.metadata import AttentionMetadata
    from radixrt.runtime.layers.parallel import init_tp
    from radixrt.runtime.layers.tp_shard import local_heads, shard_model
    from radixrt.runtime.mem.kv_pool import KVPool
    from radixrt.runtime.model_loader import load_config, load_state_dict
    from radixrt.runtime.models.llama import LlamaArgs, LlamaForCausalLM

    torch.set_num_threads(1)
    tp = init_tp(rank, size, torch.device("cpu"), init) if size > 1 else None
    a = LlamaArgs.from_hf(load_config(model_dir))
    model = LlamaForCausalLM(a)
    model.load_hf_state_dict(load_state_dict(model_dir))
    if tp is not None:
        shard_model(model, tp)
    model.eval()
    _, nkv = local_heads(a.num_heads, a.num_kv_heads, size)
    kv = KVPool(8, 4, a.num_layers, nkv, a.head_dim)
    attn = get_backend("torch_native", "cpu", torch.float32)
    table, tokens, logits = list(range(8)), list(PROMPT), []
    q = len(PROMPT)
    for _ in range(STEPS + 1):
        meta = AttentionMetadata.build([table], [q], [len(tokens)], 4)
        attn.plan(meta)
        ids = torch.tensor(tokens[-q:])
        pos = torch.arange(len(tokens) - q, len(tokens))
        hidden = model(ids, pos, attn, kv)
        row = model.compute_logits(hidden[-1:])
        logits.append(row[0])
        tokens.append(int(row[0].argmax()))
        q = 1
    if tp is not None:
        torch.distributed.destroy_process_group()
    return tokens[len(PROMPT):], torch.stack(logits)


def _worker(model_dir, rank, size, init, q):
    try:
        tokens, logits = run_rank(model_dir, rank, size, init)
        q.put((rank, (tokens, logits.numpy())))  # numpy pickles by value; a tensor would go by shared fd
    except BaseException as e:  # report instead of hanging the parent
        q.put((rank, f"{type(e).__name__}: {e}"))


def run_tp(model_dir: str, size: int):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init = f"tcp://127.0.0.1:{_port()}"
    procs = [ctx.Process(target=_worker, args=(model_dir, r, size, init, q)) for r in range(size)]
    for p in procs:
        p.start()
    out = dict(q.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    for r, v in out.items():
        assert not isinstance(v, str), f"rank {r}: {v}"
    return [(out[r][0], torch.from_numpy(out[r][1])) for r in range(size)]


@pytest.mark.parametrize("heads,kv_heads,tp,tied", [(4, 2, 2, True), (8, 2, 4, False), (6, 3, 3, True)])
def test_sharded_model_matches_single_device(tmp_path, heads, kv_heads, tp, tied):
    d = make_dir(tmp_path / "m", heads, kv_heads, tied)
    ref_tokens, ref_logits = run_rank(d, 0, 1, None)
    ranks = run_tp(d, tp)
    for rank, (tokens, logits) in enumerate(ranks):
        assert tokens == ref_tokens, f"rank {rank}"
        assert logits.shape == ref_logits.shape == (STEPS + 1, 49152)
        torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=1e-4)
    assert all(torch.equal(ranks[0][1], r[1]) for r in ranks)  # all-gathered: identical on every rank


def test_partitioning_and_bad_splits():
    from radixrt.runtime.layers.parallel import kv_heads, q_heads, vocab_range
    from radixrt.runtime.layers.tp_shard import local_heads
    assert local_heads(9, 3, 3) == (3, 1)          # SmolLM2 at tp=3
    assert [kv_heads(r, 4, 2) for r in range(4)] == [[0], [0], [1], [1]]  # replicated
    assert q_heads(3, 4, 8) == [6, 7]
    assert [vocab_range(r, 3, 10) for r in range(3)] == [(0, 4), (4, 8), (8, 10)]
    with pytest.raises(ValueError, match="num_attention_heads"):
        q_heads(0, 2, 9)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        kv_heads(0, 4, 3)


def test_row_parallel_bias_counted_once():
    """Row-parallel with a bias at tp=2: the bias is added on rank 0 only, so the sum has it once."""
    ranks = _spawn_bias()
    full = torch.nn.functional.linear(_X, _W, _B)
    for y in ranks:
        torch.testing.assert_close(y, full, atol=1e-5, rtol=1e-5)


_G = torch.Generator().manual_seed(0)  # the same tensors in every spawned rank (they re-import this module)
_X, _W, _B = torch.randn(3, 8, generator=_G), torch.randn(5, 8, generator=_G), torch.randn(5, generator=_G)


def _bias_worker(rank, init, q):
    from radixrt.runtime.layers.parallel import RowParallelLinear, init_tp
    tp = init_tp(rank, 2, torch.device("cpu"), init)
    layer = RowParallelLinear(_W[:, rank * 4:(rank + 1) * 4], _B, tp)
    assert (layer.bias is not None) == (rank == 0)
    q.put((rank, layer(_X[:, rank * 4:(rank + 1) * 4]).detach().numpy()))
    torch.distributed.destroy_process_group()


def _spawn_bias():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init = f"tcp://127.0.0.1:{_port()}"
    procs = [ctx.Process(target=_bias_worker, args=(r, init, q)) for r in range(2)]
    for p in procs:
        p.start()
    out = dict(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    return [torch.from_numpy(out[0]), torch.from_numpy(out[1])]
