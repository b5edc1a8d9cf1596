"""Issue 26: bit-identical logits whatever the chunking, the cached prefix and the batch, at every weight format
and KV dtype. The model (SmolLM2) runs its real fused layers over a pool of each dtype through the C++
kernels, whose attention reduces each row over 64-token chunks of absolute positions in a fixed order
(``kernels/attention/kv_chunk.h``) and whose products are the same for a row at every row count.
"""

from __future__ import annotations

import pytest
import torch

from conftest import close_engine, make_engine
from radixrt.kernels.attention.metadata import AttentionMetadata
from kernel_util import _kernels_built, needs_cpp  # noqa: F401 - the autouse build check
from radixrt.kernels.attention.torch_native import TorchNativeBackend
from radixrt.runtime.mem.kv_pool import KV_DTYPES, KVPool

pytestmark = needs_cpp  # a failed build on a capable CPU fails (_kernels_built), never skips
P, N = 16, 70  # page size; the prompt's tokens (two 64-token chunks: a chunk boundary inside)


@pytest.fixture(scope="module", params=["none", "q4", "int8", "auto"])
def model(request):
    e = make_engine(quantization=request.param, max_total_tokens=256)
    yield e.runner.model
    close_engine(e)


@pytest.fixture(scope="module")
def seqs(passage_ids):
    """Request 0: the prompt under test; 1-7: others of ragged lengths (with tokens to decode after)."""
    return [passage_ids[:N]] + [passage_ids[100 + 40 * i : 100 + 40 * i + 5 + 9 * i] for i in range(7)]


def _run(model, kv: str, seqs, steps) -> torch.Tensor:
    """Run ``steps`` (each a list of (request, new tokens)) on a fresh pool; returns request 0's logits."""
    a = model.args
    pool = KVPool(8 * 8, P, a.num_layers, a.num_kv_heads, a.head_dim, KV_DTYPES[kv])
    attn = TorchNativeBackend("cpu", kernel=True, kv_dtype=pool.dtype)
    done, out = [0] * len(seqs), []
    for step in steps:
        ids, pos, tables, q_lens, kv_lens = [], [], [], [], []
        for r, n in step:
            ids += seqs[r][done[r] : done[r] + n]
            pos += range(done[r], done[r] + n)
            tables.append(list(range(8 * r, 8 * r + 8)))
            q_lens.append(n)
            done[r] += n
            kv_lens.append(done[r])
        attn.plan(AttentionMetadata.build(tables, q_lens, kv_lens, P))
        with torch.inference_mode():
            logits = model.compute_logits(model(torch.tensor(ids), torch.tensor(pos), attn, pool))
        if step[0][0] == 0:
            out.append(logits[: step[0][1]])
    return torch.cat(out)


def _chunks(c: int, others: bool = False) -> list:
    """Request 0 in steps of c tokens; with others: their prefills in the first step, then a token each."""
    steps = [[(0, min(c, N - s))] for s in range(0, N, c)]
    if others:
        steps[0] += [(r, 5 + 9 * (r - 1) - 3) for r in range(1, 8)]
        for st in steps[1:4]:
            st += [(r, 1) for r in range(1, 8)]
    return steps


@pytest.mark.parametrize("kv", ["fp32", "fp16", "int8"])
def test_logits_bit_identical_across_chunking_cache_and_batch(model, kv, seqs):
    once = _run(model, kv, seqs, _chunks(N))
    assert once.shape == (N, model.args.vocab_size)
    for c in (1, 7, 16, 64):
        assert torch.equal(_run(model, kv, seqs, _chunks(c)), once), f"chunked prefill {c}"
    assert torch.equal(_run(model, kv, seqs, [[(0, 37)], [(0, N - 37)]]), once), "after a cached prefix"
    assert torch.equal(_run(model, kv, seqs, _chunks(N, others=True)), once), "batched with 7 others"
    assert torch.equal(_run(model, kv, seqs, _chunks(16, others=True)), once), "chunks of 16 beside decodes"
