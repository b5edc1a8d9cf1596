"""Model families (issue 14): greedy parity with transformers, token for token, for random-weight models of
Llama (llama3, linear and yarn rope), Mistral, Qwen2 and Qwen3, in fp32 at batch 1 and 8 with the radix
cache on, 16-token pages and prefill chunks of 32 tokens (smaller than most prompts)."""

from __future__ import annotations

import pytest
import torch

from conftest import close_engine, hf_greedy, make_engine, wait_idle
from model_dirs import FAMILIES, make_model_dir

NEW = 16
GREEDY = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
# Prompt lengths: the first seven share a 40-token prefix (so batch 8 hits the cache), the last does not.
SUFFIX_LENGTHS = [1, 9, 17, 30, 47, 80, 130]


@pytest.fixture(scope="module")
def prompts(passage_ids):
    prefix = passage_ids[:40]
    out = [prefix + passage_ids[100 + 7 * i : 100 + 7 * i + n] for i, n in enumerate(SUFFIX_LENGTHS)]
    return out + [passage_ids[300:305]]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_model(request, tmp_path_factory, tokenizer, prompts):
    """(family, model dir, engine, HF greedy reference per prompt)."""
    from radixrt.runtime.models.loader import load_hf_model

    d = make_model_dir(request.param, tmp_path_factory.mktemp(request.param), tokenizer)
    hf = load_hf_model(str(d))
    ref = [hf_greedy(hf, p, NEW) for p in prompts]
    del hf
    e = make_engine(
        model=str(d),
        page_size=16,
        chunked_prefill_size=32,
        max_num_batched_tokens=96,
        max_total_tokens=4096,
        dtype="float32",
        device="cpu",
        quantization="none",
    )
    yield request.param, d, e, ref
    close_engine(e)


def test_parity_batch_1_and_8(family_model, prompts):
    fam, _, e, ref = family_model
    assert max(len(p) for p in prompts) > 32  # chunked: the longest prompts take several prefill steps
    for i in (0, 5, 7):
        assert e.generate(input_ids=prompts[i], sampling_params=GREEDY)["output_ids"] == ref[i], (fam, i)
    outs = e.generate(input_ids=prompts, sampling_params=GREEDY)
    assert [o["output_ids"] for o in outs] == ref, fam
    # the shared 40-token prefix (two whole 16-token pages) came from the radix cache
    assert all(o["meta_info"]["cached_tokens"] >= 32 for o in outs[:7])
    wait_idle(e)


def test_family_layout(family_model):
    """The loaded model carries each family's switches (so parity is not vacuous)."""
    fam, _, e, _ = family_model
    m = e.runner.model
    attn = m.layers[0].self_attn
    assert (attn.qkv_proj.bias is not None) == (fam == "qwen2")
    assert (attn.q_norm is not None) == (fam == "qwen3")
    # the fused projections keep the names the weight-format swap (layers/quant.py) looks for
    assert {"qkv_proj", "o_proj"} <= dict(attn.named_children()).keys()
    assert {"gate_up_proj", "down_proj"} <= dict(m.layers[0].mlp.named_children()).keys()
    default = 1.0 / (
        m.args.inv_freq.new_tensor(e.runner.config.rope_parameters["rope_theta"])
        ** (torch.arange(0, 16, 2).float() / 16)
    )
    scaled = fam in ("llama3", "llama-linear", "llama-yarn")
    assert (not torch.allclose(m.args.inv_freq, default)) == scaled


def test_unsupported_architecture_names_supported_list(tmp_path):
    from transformers import GPT2Config, LlamaConfig

    from radixrt import Engine

    GPT2Config(n_layer=1, n_embd=32, n_head=2).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(
        ValueError,
        match=r"model_type 'gpt2' is not supported; Supported: \['LlamaForCausalLM', "
        r"'MistralForCausalLM', 'Qwen2ForCausalLM', 'Qwen3ForCausalLM'\]",
    ):
        Engine(model=str(tmp_path / "gpt2"))
    LlamaConfig(rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}).save_pretrained(
        tmp_path / "dyn"
    )
    with pytest.raises(
        ValueError,
        match=r"rope_type 'dynamic' is not supported; supported: \['default', "
        r"'linear', 'llama3', 'yarn'\]",
    ):
        Engine(model=str(tmp_path / "dyn"))
