"""Weight formats (issue 12): GGUF blocks read exactly, the C++ GEMV against torch's kernel, each format's
agreement with HF fp32, and the fp32 fallback by batch rows."""
from __future__ import annotations

import pytest
import torch

from conftest import close_engine, hf_greedy, make_engine
from radixrt.kernels.attention import get_backend
from radixrt.kernels.attention.metadata import AttentionMetadata
from radixrt.kernels.quant import ggml_gemv
from radixrt.runtime.layers.gguf_blocks import dequantize, q4_0_to_q4_1, quantize_q4_1, read_gguf_blocks
from radixrt.runtime.layers.quant import (MAX_ROWS, Q8_0_HEAD_MAX_ROWS, GGMLLinear, Int4PackLinear, QuantLinear,
                                         quantize_model)
from radixrt.runtime.mem.kv_pool import KVPool
from radixrt.runtime.models.loader import default_gguf_path, load_state_dict

LENGTHS = [1, 5, 9, 16, 24, 33, 48, 64]
NEW = 32


@pytest.fixture(scope="module")
def blocks():
    return read_gguf_blocks(default_gguf_path(), 30, 9, 3, True)


@pytest.fixture(scope="module")
def prompts(passage_ids):
    return [passage_ids[11 * i:11 * i + n] for i, n in enumerate(LENGTHS)]


@pytest.fixture(scope="module")
def hf_logits(prompts, hf_model):
    """HF fp32 greedy continuations ``[NEW]`` and the logits that chose them ``[NEW, vocab]``, per prompt."""
    out = []
    for p in prompts:
        cont = hf_greedy(hf_model, p, NEW)
        with torch.no_grad():
            logits = hf_model(torch.tensor([p + cont])).logits[0, len(p) - 1:len(p) - 1 + NEW].float()
        out.append((cont, logits))
    return out


def test_gguf_blocks_equal_transformers_dequantization(blocks):
    """Our raw-block reader + row un-permutation gives exactly the fp32 weights transformers loads."""
    sd = load_state_dict()
    assert len(blocks) == 121 and blocks["lm_head"][0] == "Q8_0"
    for i in (0, 17, 29):
        kind, qkv = blocks[f"layers.{i}.self_attn.qkv_proj"]
        assert kind == "Q4_1" and qkv.shape == (576 + 2 * 192, 18 * 20)
        ref = torch.cat([sd[f"model.layers.{i}.self_attn.{n}_proj.weight"] for n in "qkv"])
        assert torch.equal(dequantize(kind, qkv), ref)
        ref = torch.cat([sd[f"model.layers.{i}.mlp.{n}_proj.weight"] for n in ("gate", "up")])
        assert torch.equal(dequantize(*blocks[f"layers.{i}.mlp.gate_up_proj"]), ref)
    assert torch.equal(dequantize(*blocks["lm_head"]), sd["model.embed_tokens.weight"])


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


def test_cpp_gemv_matches_torch_int4_kernel(blocks):
    """The C++ kernel is built here (first use) and agrees with torch's int4 kernel and the fp32 product."""
    ext = ggml_gemv()
    assert ext is not None, "the C++ kernel must build on this AVX2 machine"
    kind, raw = blocks["layers.3.mlp.gate_up_proj"]
    ours, theirs = GGMLLinear(kind, raw, None, 64, ext), Int4PackLinear(raw, None, 64)
    g = torch.Generator().manual_seed(1)
    for m in (1, 2, 3, 4, 5, 9):
        x = torch.randn(m, 576, generator=g)
        ref = ours.dense(x)
        a, b = ours(x), theirs(x)
        rel = lambda y: ((y - ref).norm() / ref.norm()).item()  # noqa: E731
        assert rel(a) < 8e-3 and rel(b) < 5e-3, (m, rel(a), rel(b))
        assert ((a - b).norm() / ref.norm()).item() < 1e-2
    # the 8-row layout holds the same bytes: the row-by-row kernel (kept for row counts not a multiple of 8)
    # quantizes the activations the same way, so the two differ only in fp32 summation order
    assert ours.blocks.shape == (3072 // 8, 18 * 160) and ours._mm == ext.q4_1x8_mm
    for m in (1, 4, 7):
        x = torch.randn(m, 576, generator=g)
        torch.testing.assert_close(ext.q4_1_mm(x, raw), ours(x), rtol=1e-4, atol=1e-4)
    odd = GGMLLinear(kind, raw[:12].contiguous(), None, 64, ext)  # 12 rows: not a multiple of 8
    assert odd._mm == ext.q4_1_mm
    torch.testing.assert_close(odd(x), ours(x)[:, :12], rtol=1e-4, atol=1e-4)
    kind, raw = blocks["lm_head"]
    head = GGMLLinear(kind, raw[:4096].contiguous(), None, 64, ext)
    x = torch.randn(3, 576, generator=g)
    ref = head.dense(x)
    assert ((head(x) - ref).norm() / ref.norm()).item() < 8e-3


def test_fallback_to_fp32_above_max_rows(blocks):
    """At most MAX_ROWS rows run the quantized product; one more row runs fp32 on the same values."""
    kind, raw = blocks["layers.0.self_attn.o_proj"]
    lin = GGMLLinear(kind, raw, None, MAX_ROWS["q4"], ggml_gemv())
    w = dequantize(kind, raw)
    # one fp32 copy: oneDNN's (q4's own kernel takes every row count the GEMV would)
    assert lin.fp32.w_t is None and lin.fp32.panels is None and torch.equal(lin.fp32.dense(), w)
    g = torch.Generator().manual_seed(2)
    n = MAX_ROWS["q4"]
    x = torch.randn(n + 1, 576, generator=g)
    assert torch.equal(lin(x), lin.fp32(x))
    torch.testing.assert_close(lin(x), x @ w.t(), rtol=1e-5, atol=1e-5)
    small = lin(x[:n])
    assert not torch.equal(small, lin.fp32(x[:n]))
    assert torch.equal(small, lin.quant(x[:n]))
    assert MAX_ROWS == {"none": 1 << 62, "fp16": 1, "int8": 4, "q4": 64}


def _logits(model, ids: list[int]) -> torch.Tensor:
    """Teacher-forced logits ``[len(ids), vocab]`` of ``model`` on its own KV pool (one extend)."""
    a = model.args
    kv = KVPool(len(ids) // 16 + 1, 16, a.num_layers, a.num_kv_heads, a.head_dim, torch.float32, torch.device("cpu"))
    attn = get_backend("torch_native", torch.device("cpu"), torch.float32)
    attn.plan(AttentionMetadata.build([list(range(kv.num_pages))], [len(ids)], [len(ids)], 16))
    with torch.inference_mode():
        hidden = model(torch.tensor(ids), torch.arange(len(ids)), attn, kv)
        return model.compute_logits(hidden)


# Measured 2026-12-01 against HF fp32, 8 prompts x 32 teacher-forced tokens: (tokens whose top-1 agrees,
# largest logit difference) = none (256, 1.0e-4), fp16 (254, 0.073), int8 (246, 2.19), q4 (251, 2.01);
# q4 again after the fused C++ norm/SwiGLU/rope and the paged attention kernel: (248, 2.10) (three
# near-ties flip: activations are int8 there, so its logits already sit ~2 from HF's).
# Asserted with a small margin: at least the first figure, at most the second.
MEASURED = {"none": (256, 3e-4), "fp16": (253, 0.1), "int8": (244, 2.5), "q4": (246, 2.3)}


@pytest.mark.parametrize("fmt", ["none", "fp16", "int8", "q4"])
def test_format_agreement_with_hf(fmt, prompts, hf_logits):
    e = make_engine(quantization=fmt, max_total_tokens=2048)
    try:
        model = e.runner.model
        assert e.runner.quantization == fmt
        saved = {m: m.max_rows for m in model.modules() if isinstance(m, QuantLinear)}
        for m in saved:  # measure the quantized products themselves, not the fp32 fallback
            m.max_rows = 1 << 30
        agree, worst = 0, 0.0
        for p, (cont, ref) in zip(prompts, hf_logits):
            ours = _logits(model, p + cont)[len(p) - 1:len(p) - 1 + NEW]
            agree += int((ours.argmax(-1) == torch.tensor(cont)).sum())
            worst = max(worst, (ours - ref).abs().max().item())
        min_agree, max_diff = MEASURED[fmt]
        print(f"{fmt}: top-1 agreement {agree}/{len(prompts) * NEW}, largest logit difference {worst:.4f}")
        assert agree >= min_agree and worst <= max_diff
    finally:
        for m, rows in saved.items():
            m.max_rows = rows
        close_engine(e)


def test_gguf_default_is_q4_and_generates(prompts, hf_logits):
    """``auto`` on the Q4_1 GGUF runs its own blocks; greedy decode through the engine (batch 8, so the
    quantized products run) stays close to HF's tokens."""
    e = make_engine(quantization="auto", max_total_tokens=2048)
    try:
        assert e.runner.quantization == "q4"
        assert isinstance(e.runner.model.layers[0].mlp.down_proj, (GGMLLinear, Int4PackLinear))
        head = e.runner.model.lm_head  # the file's Q8_0 head: its own crossover to fp32, 12 rows
        assert head.max_rows == Q8_0_HEAD_MAX_ROWS == 12 and e.runner.model.layers[0].mlp.down_proj.max_rows == 64
        outs = e.generate(input_ids=prompts, sampling_params={"max_new_tokens": NEW, "temperature": 0,
                                                             "ignore_eos": True})
        same = sum(a == b for o, (cont, _) in zip(outs, hf_logits) for a, b in zip(o["output_ids"], cont))
        print(f"q4 engine greedy: {same}/{len(prompts) * NEW} tokens equal to HF at the same position")
        assert same >= 0.5 * len(prompts) * NEW
    finally:
        close_engine(e)


def test_quantize_model_rejects_bad_format():
    from radixrt.runtime.config import ServerArgs

    with pytest.raises(ValueError, match="quantization"):
        ServerArgs(quantization="q3")
    with pytest.raises(ValueError, match="quantization"):
        quantize_model(torch.nn.Sequential(torch.nn.Linear(32, 4)), "int4")
