"""An F16 GGUF runs in its own dtype (issue 26): ``auto`` holds every matrix at 2 bytes (the dense panel
kernel widens in registers), exactly the file's tensor bytes plus the rotary tables, a tied table once
(the embedding reads the head's panels), and gives transformers' greedy tokens on the same weights
(fp16-rounded, widened exactly to fp32)."""

from __future__ import annotations

import pytest
import torch

from conftest import close_engine, hf_greedy, make_engine
from gguf_writer import write_gguf
from model_dirs import make_model_dir
from radixrt.runtime.layers.dense_embed import PanelEmbedding, RowEmbedding
from radixrt.runtime.layers.quant import DenseLinear

GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}


@pytest.mark.parametrize("family", ["mistral", "qwen2"])  # an untied head; a tied head with biases
def test_f16_gguf_held_at_two_bytes_and_equal_to_hf(
    family, tmp_path, tokenizer, passage_ids, monkeypatch, cpp_kernels_loaded
):
    from transformers import AutoModelForCausalLM

    from radixrt.runtime.models.gguf_weights import GGUF_TYPES, GGUFWeights
    from radixrt.runtime.models.loader import default_gguf_path

    monkeypatch.setenv("RADIXRT_CACHE_DIR", str(tmp_path / "cache"))
    d = make_model_dir(family, tmp_path / family, tokenizer)
    hf = AutoModelForCausalLM.from_pretrained(d).eval()
    with torch.no_grad():  # the reference runs on the values the file holds: matrices rounded to fp16
        for p in hf.parameters():
            if p.dim() == 2:
                p.copy_(p.half().float())
    path = write_gguf(hf, tmp_path / f"{family}-f16.gguf", default_gguf_path(), f"{family}-tiny", f16=True)
    prompts = [passage_ids[:9], passage_ids[40:90]]
    ref = [hf_greedy(hf, p, GREEDY["max_new_tokens"]) for p in prompts]
    cfg = hf.config
    e = make_engine(model=str(path), max_total_tokens=1024, chunked_prefill_size=32, quantization="auto")
    try:
        m = e.runner.model
        lin = m.layers[0].mlp.down_proj
        assert isinstance(lin, DenseLinear) and lin.fp32.dtype == torch.float16
        if cfg.tie_word_embeddings:
            assert isinstance(m.embed_tokens, PanelEmbedding) and m.embed_tokens.head is m.lm_head.fp32
        else:
            assert isinstance(m.embed_tokens, RowEmbedding) and m.embed_tokens.weight.dtype == torch.float16
        stored = GGUFWeights(str(path), cfg.num_attention_heads, cfg.num_key_value_heads, GGUF_TYPES).nbytes()
        rotary = sum(b.numel() * b.element_size() for b in m.rotary.buffers())
        assert e.runner.memory_stats()["weight_bytes"] == stored + rotary
        outs = e.generate(input_ids=prompts, sampling_params=GREEDY)
        assert [o["output_ids"] for o in outs] == ref
    finally:
        close_engine(e)
