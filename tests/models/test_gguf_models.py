"""GGUF files of the supported families (issue 14) load through transformers' GGUF support: a random-weight
Qwen3, Qwen2 and Mistral model written as fp32 GGUF with the ``gguf`` package (tests/gguf_writer.py)
gives the same greedy tokens in radixrt as transformers does on the original model."""

from __future__ import annotations

import pytest

from conftest import close_engine, hf_greedy, make_engine
from gguf_writer import write_gguf
from model_dirs import make_model_dir

# transformers takes Qwen3's head_dim from its config default (128): the GGUF model must use it
OVERRIDES = {"qwen3": {"head_dim": 128, "num_attention_heads": 2, "num_key_value_heads": 1}}
GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "mistral"])
def test_gguf_parity(family, tmp_path, tokenizer, passage_ids, monkeypatch, cpp_kernels_loaded):
    from transformers import AutoModelForCausalLM

    from radixrt.runtime.models.loader import default_gguf_path, load_config

    monkeypatch.setenv("RADIXRT_CACHE_DIR", str(tmp_path / "cache"))  # the converted copy stays in tmp
    d = make_model_dir(family, tmp_path / family, tokenizer, **OVERRIDES.get(family, {}))
    hf = AutoModelForCausalLM.from_pretrained(d).eval()
    path = write_gguf(hf, tmp_path / f"{family}-tiny.gguf", default_gguf_path(), f"{family}-tiny")
    prompts = [passage_ids[:9], passage_ids[40:90]]
    ref = [hf_greedy(hf, p, 12) for p in prompts]
    e = make_engine(model=str(path), max_total_tokens=1024, chunked_prefill_size=32, quantization="none")
    try:
        assert load_config(str(path)).model_type in (family, "llama")
        outs = e.generate(input_ids=prompts, sampling_params=GREEDY)
        assert [o["output_ids"] for o in outs] == ref
    finally:
        close_engine(e)
