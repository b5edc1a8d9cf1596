"""Write a transformers Llama/Mistral/Qwen2/Qwen3 model as an fp32 GGUF file with the ``gguf`` package,
the tokenizer fields copied from the SmolLM2 GGUF (the stand-in tokenizer of these tests).

Tensor names follow llama.cpp's (``blk.N.attn_q.weight``, ...). For the ``llama`` GGUF architecture
(which Mistral shares) llama.cpp stores q and k rows permuted for its rotary layout; transformers undoes
that permutation on load, so the writer applies it (see llama.cpp convert_hf_to_gguf.py, ``permute``).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

_LAYER = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@functools.lru_cache(maxsize=None)
def _tokenizer_fields(tokenizer_gguf: str) -> tuple:
    """``(key, value type, contents)`` of every ``tokenizer.*`` field of ``tokenizer_gguf``. Read once per
    process: ``GGUFReader`` parses the 49,152-entry vocabulary and merges in Python (~6 s on 2 cores), and
    every GGUF these tests write copies the same fields (the file is the installed, read-only SmolLM2)."""
    import gguf

    reader = gguf.GGUFReader(tokenizer_gguf)
    out = []
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            vtype = field.types[0]
            out.append((key, vtype, tuple(field.contents()) if vtype == gguf.GGUFValueType.ARRAY else field.contents()))
    return tuple(out)


def write_gguf(model, path: Path, tokenizer_gguf: str, name: str, f16: bool = False) -> Path:
    """Write ``model`` (a transformers causal LM of a supported family) to ``path``; ``name`` becomes
    ``general.name`` (transformers reads a llama-architecture file named "mistral..." as Mistral).
    ``f16``: matrices stored F16 (rounded to nearest), norms and biases F32, as ``convert_hf_to_gguf.py
    --outtype f16`` writes them."""
    import gguf

    cfg = model.config
    arch = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}[cfg.model_type]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    for key, vtype, value in _tokenizer_fields(tokenizer_gguf):
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(key, list(value))
        else:
            w.add_key_value(key, value, vtype)
    for hf_name, t in model.state_dict().items():
        a = t.detach().float().numpy()
        if hf_name == "lm_head.weight":
            if cfg.tie_word_embeddings:
                continue
            out = "output.weight"
        elif hf_name == "model.embed_tokens.weight":
            out = "token_embd.weight"
        elif hf_name == "model.norm.weight":
            out = "output_norm.weight"
        else:
            _, _, i, rest = hf_name.split(".", 3)
            mod, kind = rest.rsplit(".", 1)
            out = f"blk.{i}.{_LAYER[mod]}.{kind}"
            if arch == "llama" and mod == "self_attn.q_proj":
                a = _permute(a, cfg.num_attention_heads)
            elif arch == "llama" and mod == "self_attn.k_proj":
                a = _permute(a, cfg.num_key_value_heads)
        if f16 and a.ndim == 2:
            a = a.astype(np.float16)
        w.add_tensor(out, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
