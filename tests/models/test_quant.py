"""Weight formats (issue 26): a GGUF read straight from its memory map equals transformers' weights; every
format holds one copy of each weight and one kernel for every row count, so greedy tokens do not depend
on the batch or the cache; each format's agreement with HF fp32; bad files are refused naming the file."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import close_engine, hf_greedy, make_engine, wait_idle
from radixrt.kernels.attention import get_backend
from radixrt.kernels.attention.metadata import AttentionMetadata
from radixrt.kernels.quant import x16
from radixrt.runtime.layers.ggml_linear import ConcatLinear, GGMLEmbedding, GGMLLinear
from radixrt.runtime.layers.ggml_ops import use_x16
from radixrt.runtime.layers.gguf_blocks import dequantize, q4_0_to_q4_1, quantize_q4_1
from radixrt.runtime.layers.quant import DenseLinear, quantize_model
from radixrt.runtime.mem.kv_pool import KVPool
from radixrt.runtime.models.gguf_weights import GGUF_TYPES, GGUFWeights
from radixrt.runtime.models.loader import default_gguf_path

LENGTHS = [1, 5, 9, 16, 24, 33, 48, 64]
NEW = 32


@pytest.fixture(scope="module")
def prompts(passage_ids):
    return [passage_ids[11 * i : 11 * i + n] for i, n in enumerate(LENGTHS)]


@pytest.fixture(scope="module")
def hf_logits(prompts, hf_model):
    """HF fp32 greedy continuations ``[NEW]`` and the logits that chose them ``[NEW, vocab]``, per prompt."""
    out = []
    for p in prompts:
        cont = hf_greedy(hf_model, p, NEW)
        with torch.no_grad():
            logits = hf_model(torch.tensor([p + cont])).logits[0, len(p) - 1 : len(p) - 1 + NEW].float()
        out.append((cont, logits))
    return out


def test_gguf_weights_equal_transformers(hf_model):
    """Tensors read from the memory map (q/k rows un-permuted) dequantize to exactly transformers' weights."""
    w = GGUFWeights(default_gguf_path(), 9, 3, GGUF_TYPES)
    sd = w.hf_state_dict(30, True)
    ref = hf_model.state_dict()
    assert len(sd) == 272
    for k, v in sd.items():
        assert torch.equal(v, ref[k]), k
    qkv, _ = w.projection(0, "self_attn.qkv_proj")
    assert [t.type_name for t in qkv] == ["Q4_1"] * 3 and [t.shape for t in qkv] == [(576, 576), (192, 576), (192, 576)]
    assert w.get("token_embd.weight").type_name == "Q8_0"


def test_q4_block_conversions():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 64, generator=g)
    b = quantize_q4_1(w)
    assert b.shape == (8, 40) and b.dtype == torch.uint8
    err = (dequantize("Q4_1", b) - w).abs().reshape(8, 2, 32)
    span = w.reshape(8, 2, 32)
    assert (err <= (span.amax(-1) - span.amin(-1))[..., None] / 30 * 1.01 + 1e-3).all()  # half a step
    q40 = torch.randint(0, 256, (4, 2 * 18), dtype=torch.uint8, generator=g)
    d = torch.tensor([[0.5], [1.25]], dtype=torch.float16)  # one scale per block
    q40.view(4, 2, 18)[..., :2] = d.view(torch.uint8)
    v = q4_0_to_q4_1(q40.numpy())
    qs = q40.view(4, 2, 18)[..., 2:]
    q = torch.cat([qs & 15, qs >> 4], dim=-1).float()
    assert torch.equal(dequantize("Q4_1", torch.from_numpy(v)), ((q - 8) * d.float()).reshape(4, 64))


def _logits(model, ids: list[int]) -> torch.Tensor:
    """Teacher-forced logits ``[len(ids), vocab]`` of ``model`` on its own KV pool (one extend)."""
    a = model.args
    kv = KVPool(len(ids) // 16 + 1, 16, a.num_layers, a.num_kv_heads, a.head_dim, torch.float32, torch.device("cpu"))
    attn = get_backend("torch_native", torch.device("cpu"), torch.float32)
    attn.plan(AttentionMetadata.build([list(range(kv.num_pages))], [len(ids)], [len(ids)], 16))
    with torch.inference_mode():
        hidden = model(torch.tensor(ids), torch.arange(len(ids)), attn, kv)
        return model.compute_logits(hidden)


# Measured 2026-12-02 against HF fp32, 8 prompts x 32 teacher-forced tokens, every format running its own
# kernel at every row count: (tokens whose top-1 agrees, largest logit difference) = none (256, 1e-4),
# bf16 (253, 0.18), fp16 (255, 0.045), int8 (244, 1.67), q4 (249, 1.50), auto (249, 1.50; the file's Q4_1
# and Q8_0, the same values as q4 here). int8 and q4 quantize the activations to int8 per 32 values, as
# llama.cpp does. q4_k (2026-12-03): (246, 2.53): on SmolLM2 only down_proj (1536 columns) is Q4_K,
# re-quantized from the file's Q4_1 values; the 576-column matrices keep the file's Q4_1 (the fallback).
# 2026-12-07, with the x16 layout (Q8_0 and Q4_K weights, the tied Q8_0 head; another rounding of the same
# int8 products): int8 (245, 1.76), q4 and auto (251, 1.50), q4_k (243, 2.68).
# 2026-12-08, the Q4_1 projections (q4_k's 576-column ones too) in their x16 layout as well (one fp32 lane per
# output where there were 8 summed at the end: the same int8 products rounded once more differently, which
# flips a few int8 activation roundings in later layers): q4 and auto (248, 1.7504), q4_k (240, 2.48).
# Asserted with a small margin: at least the first figure, at most the second.
MEASURED = {
    "none": (256, 3e-4),
    "bf16": (251, 0.25),
    "fp16": (253, 0.08),
    "int8": (242, 1.9),
    "q4": (245, 1.95),
    "auto": (245, 1.95),
    "q4_k": (237, 2.8),
}


@pytest.mark.parametrize("fmt", list(MEASURED))
def test_format_agreement_with_hf(fmt, prompts, hf_logits):
    e = make_engine(quantization=fmt, max_total_tokens=2048)
    try:
        assert e.runner.quantization == ("gguf" if fmt == "auto" else fmt)
        agree, worst = 0, 0.0
        for p, (cont, ref) in zip(prompts, hf_logits):
            ours = _logits(e.runner.model, p + cont)[len(p) - 1 : len(p) - 1 + NEW]
            agree += int((ours.argmax(-1) == torch.tensor(cont)).sum())
            worst = max(worst, (ours - ref).abs().max().item())
        min_agree, max_diff = MEASURED[fmt]
        print(f"{fmt}: top-1 agreement {agree}/{len(prompts) * NEW}, largest logit difference {worst:.4f}")
        assert agree >= min_agree and worst <= max_diff
    finally:
        close_engine(e)


def test_auto_runs_the_files_blocks_with_one_copy():
    """``auto`` on the Q4_1 GGUF: projections in Q4_1, the embedding on the file's Q8_0 bytes and the tied
    head on the same bytes, or (where the x16 layout runs) on their x16 repack, the same size; the bytes
    held are exactly the file's tensors plus that repack and the rotary tables, not an fp32 copy."""
    e = make_engine(quantization="auto", max_total_tokens=2048)
    try:
        m = e.runner.model
        assert isinstance(m.layers[0].mlp.down_proj, GGMLLinear) and m.layers[0].mlp.down_proj.type_name == "Q4_1"
        assert isinstance(m.embed_tokens, GGMLEmbedding) and m.lm_head.x16 == use_x16("Q8_0", 49152)
        if m.lm_head.x16:
            assert torch.equal(m.lm_head.blocks, x16.repack(m.embed_tokens.blocks, "Q8_0"))
        else:
            assert m.lm_head.blocks is m.embed_tokens.blocks
        repacked = m.lm_head.blocks.numel() if m.lm_head.x16 else 0
        assert repacked in (0, m.embed_tokens.blocks.numel())  # Q8_0's x16 blocks are 16 x 34 bytes
        stored = GGUFWeights(default_gguf_path(), 9, 3, GGUF_TYPES).nbytes()
        held = e.runner.memory_stats()["weight_bytes"]
        rotary = sum(b.numel() * b.element_size() for b in m.rotary.buffers())
        assert rotary == 2 * 8192 * 64 * 4 and held == stored + rotary + repacked
    finally:
        close_engine(e)


INVARIANCE_PROMPTS = [
    "The capital of France is",
    "def fib(n):",
    "List three colors:",
    "Once upon a time",
    "Translate to French: good morning",
    "2 + 2 =",
    "The quick brown fox",
    "Write a haiku about the sea.",
]


# (weight format, KV dtype): every format at its auto KV dtype (fp16 for auto/q4/int8, fp32 for none),
# and each KV dtype with at least two formats
@pytest.mark.parametrize(
    "fmt,kv",
    [
        ("auto", "auto"),
        ("q4", "auto"),
        ("int8", "auto"),
        ("none", "auto"),
        ("auto", "int8"),
        ("none", "int8"),
        ("q4", "fp32"),
        ("none", "fp16"),
        ("q4_k", "auto"),
    ],
)
def test_greedy_tokens_do_not_depend_on_batch_or_cache(fmt, kv):
    """Alone, batched, and again with every prompt cached: the same greedy ids at every format and KV dtype."""
    e = make_engine(quantization=fmt, kv_cache_dtype=kv, max_total_tokens=4096, chunked_prefill_size=8)
    try:
        want = {"auto": "fp32" if fmt == "none" else "fp16"}.get(kv, kv)
        assert e.runner.kv_dtype_name == want and e.get_server_info()["memory"]["kv_dtype"] == want
        sp = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
        alone = [e.generate(p, sp)["output_ids"] for p in INVARIANCE_PROMPTS]
        e.flush_cache()
        batched = [o["output_ids"] for o in e.generate(INVARIANCE_PROMPTS, sp)]
        warm = [o["output_ids"] for o in e.generate(INVARIANCE_PROMPTS[::-1], sp)][::-1]
        assert batched == alone
        assert warm == alone
        wait_idle(e)
    finally:
        close_engine(e)


def test_mixed_types_in_one_projection_concatenate(tmp_path):
    g = torch.Generator().manual_seed(3)
    w = torch.randn(96, 64, generator=g)
    a, b = GGMLLinear("Q4_1", quantize_q4_1(w[:64]), 64, None), DenseLinear(w[64:], None)
    x = torch.randn(5, 64, generator=g)
    y = ConcatLinear([a, b])(x)
    assert torch.equal(y[:, :64], a(x)) and torch.equal(y[:, 64:], b(x))


def test_bad_files_are_refused_naming_the_file(tmp_path):
    from radixrt import Engine

    src = open(default_gguf_path(), "rb").read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(src[: len(src) // 3])
    with pytest.raises(ValueError, match="cut.gguf"):
        Engine(model=str(cut), max_total_tokens=256)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ValueError, match="junk.gguf"):
        Engine(model=str(junk), max_total_tokens=256)
    # the server says so in one line and exits 2, before starting any child process
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "radixrt.runtime.server.launch", "serve", "--model", str(cut)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert last.startswith("radixrt: error: ") and "cut.gguf: not a readable GGUF file (truncated or corrupt?" in last


def test_unsupported_type_is_refused_naming_tensor_and_type(tmp_path):
    import gguf

    path = tmp_path / "q2k.gguf"
    wr = gguf.GGUFWriter(str(path), "llama")
    wr.add_tensor("blk.0.attn_q.weight", np.zeros((4, 84), np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q2_K)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    with pytest.raises(ValueError, match=r"blk\.0\.attn_q\.weight has type Q2_K.*supported"):
        GGUFWeights(str(path), 1, 1, GGUF_TYPES)


def test_quantize_model_rejects_bad_format():
    from radixrt.runtime.config import ServerArgs

    with pytest.raises(ValueError, match="quantization"):
        ServerArgs(quantization="q3")
    with pytest.raises(ValueError, match="quantization"):
        quantize_model(torch.nn.Sequential(torch.nn.Linear(32, 4)), "int4")
