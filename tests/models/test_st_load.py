"""Safetensors directories load tensor by tensor into their format (issue 26): a bf16 directory stays 2
bytes per parameter and gives HF fp32's greedy tokens on the same (exactly widened) weights; ``none``
widens to fp32; ``q4_k`` quantizes while loading (Q4_1 for rows Q4_K cannot split)."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import close_engine, hf_greedy, make_engine, wait_idle
from model_dirs import make_model_dir
from radixrt.runtime.layers.dense_embed import PanelEmbedding, RowEmbedding
from radixrt.kernels.quant import x16
from radixrt.runtime.layers.ggml_linear import GGMLEmbedding, GGMLLinear
from radixrt.runtime.layers.ggml_ops import use_x16
from radixrt.runtime.layers.quant import DenseLinear

GREEDY = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def prompts(passage_ids):
    return [passage_ids[13 * i : 13 * i + n] for i, n in enumerate([3, 9, 20, 37])]


def _stored(d) -> tuple[int, int]:
    """(parameters in 2-D tensors, parameters in 1-D tensors) of a directory's safetensors files."""
    raw = (d / "model.safetensors").read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    mats = vecs = 0
    for k, v in header.items():
        if k != "__metadata__":
            n = 1
            for s in v["shape"]:
                n *= s
            mats, vecs = (mats + n, vecs) if len(v["shape"]) == 2 else (mats, vecs + n)
    return mats, vecs


@pytest.fixture(scope="module", params=["llama3", "qwen2"])  # an untied head; a tied head with biases
def bf16_dir(request, tmp_path_factory, tokenizer, prompts):
    from radixrt.runtime.models.loader import load_hf_model

    d = make_model_dir(request.param, tmp_path_factory.mktemp(f"bf16-{request.param}"), tokenizer, dtype=torch.bfloat16)
    hf = load_hf_model(str(d), dtype=torch.float32)  # the same bf16 values, widened exactly
    ref = [hf_greedy(hf, p, GREEDY["max_new_tokens"]) for p in prompts]
    del hf
    return request.param, d, ref


@pytest.mark.parametrize("fmt", ["auto", "none"])
def test_bf16_dir_held_in_its_dtype_and_equal_to_hf(bf16_dir, fmt, prompts):
    fam, d, ref = bf16_dir
    e = make_engine(model=str(d), quantization=fmt, max_total_tokens=1024, chunked_prefill_size=16)
    try:
        m = e.runner.model
        assert e.runner.quantization == ("bf16" if fmt == "auto" else "none")
        lin = m.layers[0].mlp.down_proj
        assert isinstance(lin, DenseLinear) and lin.fp32.dtype == (torch.bfloat16 if fmt == "auto" else torch.float32)
        tied = fam == "qwen2"
        assert isinstance(m.embed_tokens, PanelEmbedding if tied else RowEmbedding)
        if tied:
            assert m.embed_tokens.head is m.lm_head.fp32  # one copy of the table
        mats, vecs = _stored(d)
        rotary = sum(b.numel() * b.element_size() for b in m.rotary.buffers())
        width = 2 if fmt == "auto" else 4
        # every matrix at its width once, norms and biases in fp32, and the rotary tables: nothing else
        assert e.runner.memory_stats()["weight_bytes"] == width * mats + 4 * vecs + rotary
        for p, want in zip(prompts, ref):
            assert e.generate(input_ids=p, sampling_params=GREEDY)["output_ids"] == want
        outs = e.generate(input_ids=prompts, sampling_params=GREEDY)
        assert [o["output_ids"] for o in outs] == ref
        wait_idle(e)
    finally:
        close_engine(e)


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory, tokenizer):
    """fp32, tied, hidden 256 (Q4_K's row length) and an MLP of 384 (not a multiple of 256)."""
    return make_model_dir(
        "qwen2",
        tmp_path_factory.mktemp("wide"),
        tokenizer,
        hidden_size=256,
        intermediate_size=384,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
    )


def test_q4_k_quantizes_while_loading(wide_dir, prompts):
    e = make_engine(model=str(wide_dir), quantization="q4_k", max_total_tokens=1024, chunked_prefill_size=8)
    try:
        m = e.runner.model
        layer = m.layers[0]
        assert e.runner.quantization == "q4_k"
        assert layer.self_attn.qkv_proj.type_name == "Q4_K" and layer.mlp.gate_up_proj.type_name == "Q4_K"
        assert layer.mlp.down_proj.type_name == "Q4_1"  # 384 columns: the Q4_1 fallback
        assert isinstance(m.embed_tokens, GGMLEmbedding) and isinstance(m.lm_head, GGMLLinear)
        # the tied head: the embedding's own Q8_0 bytes, repacked once into the x16 layout where that runs
        assert m.lm_head.type_name == "Q8_0" and m.lm_head.x16 == use_x16("Q8_0", m.embed_tokens.blocks.shape[0])
        if m.lm_head.x16:
            assert torch.equal(m.lm_head.blocks, x16.repack(m.embed_tokens.blocks, "Q8_0"))
        else:
            assert m.lm_head.blocks is m.embed_tokens.blocks
        alone = [e.generate(input_ids=p, sampling_params=GREEDY)["output_ids"] for p in prompts]
        e.flush_cache()
        batched = [o["output_ids"] for o in e.generate(input_ids=prompts, sampling_params=GREEDY)]
        warm = [o["output_ids"] for o in e.generate(input_ids=prompts[::-1], sampling_params=GREEDY)][::-1]
        assert batched == alone and warm == alone
        wait_idle(e)
    finally:
        close_engine(e)


def test_missing_tensor_is_named(tmp_path, tokenizer):
    from safetensors.torch import load_file, save_file

    d = make_model_dir("llama3", tmp_path / "cut", tokenizer)
    sd = load_file(d / "model.safetensors")
    del sd["model.layers.1.mlp.up_proj.weight"]
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    from radixrt import Engine

    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight is missing"):
        Engine(model=str(d), max_total_tokens=256)
