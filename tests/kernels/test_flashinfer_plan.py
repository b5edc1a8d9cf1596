"""The FlashInfer backend's planning, checked on CPU against the torch-native backend's view of a batch.

No GPU and no flashinfer needed: the planning functions are pure torch, and so is the CUDA-graph
bucket arithmetic.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from radixrt.kernels.attention import get_backend
from radixrt.kernels.attention.flashinfer_plan import (
    DUMMY_PAGE,
    pad_decode_plan,
    pad_out_cache_loc,
    plan_args,
    slots_from_plan,
)
from radixrt.kernels.attention.metadata import AttentionMetadata
from radixrt.kernels.attention.torch_native import TorchNativeBackend
from radixrt.runtime.executor.cuda_graph_runner import capture_bucket_sizes, pad_tokens, padded_batch_size

H, HKV, D = 9, 3, 64


def make_batch(q_lens, kv_lens, page_size, seed=0):
    """Page tables drawn from a shuffled pool, so page ids are not in order."""
    g = torch.Generator().manual_seed(seed)
    need = [(kv + page_size - 1) // page_size for kv in kv_lens]
    perm = torch.randperm(sum(need) + 7, generator=g).tolist()
    tables, at = [], 0
    for n in need:
        tables.append(perm[at : at + n])
        at += n
    return AttentionMetadata.build(tables, q_lens, kv_lens, page_size)


BATCHES = {
    "prefill": ([5, 17], [5, 17]),
    "decode": ([1, 1, 1, 1, 1], [1, 16, 17, 33, 100]),
    "mixed": ([1, 9, 1, 32, 3], [40, 9, 16, 48, 3]),  # decodes, a fresh prefill, cached-prefix extends
    "extend_on_prefix": ([4, 16], [36, 16]),
}


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", sorted(BATCHES))
def test_plan_matches_torch_native_view(name, page_size):
    q_lens, kv_lens = BATCHES[name]
    meta = make_batch(q_lens, kv_lens, page_size)
    args = plan_args(meta, H, HKV, D)
    tn = TorchNativeBackend("cpu")
    tn.plan(meta)
    # Same KV slots and KV length per request as the torch-native backend attends over.
    slots = slots_from_plan(args)
    assert len(slots) == len(tn.slots)
    for mine, ref, kv in zip(slots, tn.slots, kv_lens):
        assert mine.shape[0] == kv
        assert torch.equal(mine, ref[:kv])  # torch-native pads each row to the longest request
    p = args["plan"]
    if args["mode"] == "decode":
        indptr, last = p["indptr"], p["last_page_len"]
        assert p["indices"] is meta.kv_indices
        assert p["head_dim"] == D
    else:
        indptr, last = p["paged_kv_indptr"], p["paged_kv_last_page_len"]
        assert torch.equal(p["qo_indptr"], meta.qo_indptr)
        assert p["qo_indptr"].tolist() == tn.qo
        assert p["causal"] is True and p["head_dim_qk"] == D
    # The host-side recomputation equals the metadata's own tensors.
    assert torch.equal(indptr, meta.kv_indptr) and torch.equal(last, meta.kv_last_page_len)
    assert indptr.device.type == "cpu" and indptr.dtype == torch.int32 and last.dtype == torch.int32
    assert ((last >= 1) & (last <= page_size)).all()
    assert p["num_qo_heads"] == H and p["num_kv_heads"] == HKV and p["page_size"] == page_size
    assert args["kv_lens"] == kv_lens


def test_decode_vs_prefill_choice():
    assert plan_args(make_batch([1, 1], [3, 9], 16), H, HKV, D)["mode"] == "decode"
    assert plan_args(make_batch([1, 2], [3, 9], 16), H, HKV, D)["mode"] == "prefill"
    assert plan_args(make_batch([7], [7], 16), H, HKV, D)["mode"] == "prefill"
    # A single-token prefill (prompt of one token) is a decode-shaped step: same math, decode kernel.
    assert plan_args(make_batch([1], [1], 16), H, HKV, D)["mode"] == "decode"


def test_plan_args_rejects_bad_heads():
    meta = make_batch([1], [4], 16)
    with pytest.raises(ValueError, match="multiple"):
        plan_args(meta, 9, 2, D)


def test_pad_decode_plan_and_loc():
    meta = make_batch([1] * 5, [1, 16, 17, 33, 100], 16)
    plan = plan_args(meta, H, HKV, D)["plan"]
    padded = pad_decode_plan(plan, 8)
    assert padded["indptr"].tolist() == plan["indptr"].tolist() + [plan["indptr"][-1].item() + i for i in (1, 2, 3)]
    assert padded["indices"].tolist() == plan["indices"].tolist() + [DUMMY_PAGE] * 3
    assert padded["last_page_len"].tolist() == plan["last_page_len"].tolist() + [1, 1, 1]
    # Real rows keep their slots; padded rows read one token of the dummy page.
    slots = slots_from_plan({"mode": "decode", "plan": padded})
    tn = TorchNativeBackend("cpu")
    tn.plan(meta)
    for i, kv in enumerate(meta.kv_lens):
        assert torch.equal(slots[i], tn.slots[i, :kv])
    for i in range(5, 8):
        assert slots[i].tolist() == [DUMMY_PAGE * 16]
    loc, valid = pad_out_cache_loc(meta.out_cache_loc, 8)
    assert loc.tolist() == meta.out_cache_loc.tolist() + [meta.out_cache_loc[0].item()] * 3
    assert valid.tolist() == [True] * 5 + [False] * 3
    assert pad_decode_plan(plan, 5)["indptr"].tolist() == plan["indptr"].tolist()
    with pytest.raises(ValueError):
        pad_decode_plan(plan, 4)


def test_padded_write_keeps_pool_unchanged_outside_batch():
    """The graph-mode write rule: padded rows write row 0's K/V into row 0's slot."""
    from radixrt.kernels.attention.base import write_kv
    from radixrt.runtime.mem.kv_pool import KVPool

    meta = make_batch([1, 1, 1], [5, 20, 2], 16)
    pool = KVPool(16, 16, 1, HKV, D)
    before = pool.k[0].clone()
    loc, valid = pad_out_cache_loc(meta.out_cache_loc, 4)
    k = torch.randn(4, HKV, D)
    keep = valid[:, None, None]
    write_kv(pool, 0, loc, torch.where(keep, k, k[:1]), torch.where(keep, k, k[:1]))
    flat = pool.k[0].view(-1, HKV, D)
    changed = (flat != before.view(-1, HKV, D)).flatten(1).any(1).nonzero().flatten().tolist()
    assert sorted(changed) == sorted(meta.out_cache_loc.tolist())
    assert torch.equal(flat[meta.out_cache_loc], k[:3])


def test_cuda_graph_buckets():
    assert capture_bucket_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert capture_bucket_sizes(160) == [1, 2, 4, 8, 16, 32, 64, 128, 160]
    assert capture_bucket_sizes(256) == [1, 2, 4, 8, 16, 32, 64, 128, 192, 256]
    assert capture_bucket_sizes(5) == [1, 2, 4, 5]
    assert capture_bucket_sizes(1) == [1]
    with pytest.raises(ValueError):
        capture_bucket_sizes(0)
    b = capture_bucket_sizes(160)
    assert padded_batch_size(5, b) == 8
    assert padded_batch_size(1, b) == 1
    assert padded_batch_size(64, b) == 64
    assert padded_batch_size(65, b) == 128
    assert padded_batch_size(129, b) == 160
    assert padded_batch_size(160, b) == 160
    for bad in (0, 161):
        with pytest.raises(ValueError):
            padded_batch_size(bad, b)
    assert pad_tokens([7, 8, 9, 10, 11], 8) == [7, 8, 9, 10, 11, 0, 0, 0]


def test_registry_on_cpu():
    with pytest.raises(ValueError, match="CUDA"):
        get_backend("flashinfer", "cpu")
    assert isinstance(get_backend("auto", "cpu"), TorchNativeBackend)
    with pytest.raises(ValueError):
        get_backend("nope", "cpu")


def test_backend_constructor_refuses_cpu():
    from radixrt.kernels.attention.flashinfer import FlashInferBackend

    with pytest.raises(ValueError, match="CUDA"):
        FlashInferBackend("cpu")


def test_importing_attention_does_not_import_flashinfer():
    code = (
        "import sys, radixrt.kernels.attention, radixrt.kernels.attention.flashinfer, "
        "radixrt.runtime.executor.cuda_graph_runner; print('flashinfer' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
