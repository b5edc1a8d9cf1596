"""Tiny random-weight model directories of each supported family, built with transformers (no hub).

The SmolLM2 tokenizer stands in for each family's own (its vocabulary size is the model's), and a family's
chat template, when given, replaces SmolLM2's in ``tokenizer_config.json``.
"""

from __future__ import annotations

from pathlib import Path

import torch

FIXTURES = Path(__file__).resolve().parent / "data" / "templates"

# 2 layers, 4 query heads over 2 KV heads (GQA), head_dim 16.
SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    initializer_range=0.2,
)

FAMILIES = {
    "llama3": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
    ),
    "llama-linear": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(tie_word_embeddings=True, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
    ),
    "llama-yarn": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            tie_word_embeddings=True,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 128,
            },
        ),
    ),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(tie_word_embeddings=False, sliding_window=None)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(tie_word_embeddings=True)),
}


QWEN_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]  # added (non-special) tokens, as in Qwen's


def make_model_dir(
    family: str,
    path: Path,
    tokenizer,
    chat_template: str | None = None,
    seed: int = 0,
    added_tokens: list[str] | None = None,
    dtype: torch.dtype = torch.float32,
    **overrides,
) -> Path:
    """Save a random-weight ``family`` model (safetensors in ``dtype``, default fp32), ``tokenizer`` (plus
    ``added_tokens``) and optionally a chat template file from :data:`FIXTURES` into ``path``; returns ``path``.
    ``overrides`` replace entries of :data:`SMALL`."""
    import copy

    import transformers

    if added_tokens:
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer.add_tokens(added_tokens)

    cfg_name, model_name, extra = FAMILIES[family]
    eos = tokenizer.eos_token_id
    cfg = getattr(transformers, cfg_name)(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos,
        pad_token_id=eos,
        **{**SMALL, **overrides},
        **extra,
    )
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(cfg).eval()
    with torch.no_grad():  # transformers initialises biases to 0 and norms to 1: make them matter too
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.2)
            elif "norm" in name:
                p.normal_(1.0, 0.2)
    path.mkdir(parents=True, exist_ok=True)
    model.to(dtype).save_pretrained(path)
    tokenizer.save_pretrained(path)
    if chat_template is not None:
        import json

        tc = path / "tokenizer_config.json"
        d = json.loads(tc.read_text())
        d["chat_template"] = (FIXTURES / chat_template).read_text()
        tc.write_text(json.dumps(d, indent=1))
        (path / "chat_template.jinja").unlink(missing_ok=True)
    return path
