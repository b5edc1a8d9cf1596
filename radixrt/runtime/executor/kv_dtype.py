"""``--kv-cache-dtype``: the KV pool's element type, resolved from the weights the model runs.

``auto`` keeps fp32 K/V where the weights run fp32 (``--quantization none``, fp32 safetensors or an all-F32
GGUF: the HF parity tests stay exact) and takes fp16 where they are quantized or 2-byte (any GGUF block
format, ``q4``, ``int8``, ``fp16``, ``bf16``): half the bytes per token, and the weights' own rounding
already exceeds fp16's on K/V. On CUDA ``auto`` is the model dtype (FlashInfer's kernels take fp16/bf16).
"""

from __future__ import annotations

import torch

from radixrt.runtime.mem.kv_pool import KV_DTYPES
from radixrt.runtime.models.args import ModelArgs


def fp32_params(a: ModelArgs) -> int:
    """Parameters of the projections and embeddings (norms left out): what an fp32 file holds x 4 bytes."""
    hd = a.head_dim
    per_layer = (
        a.hidden_size * (a.num_heads + 2 * a.num_kv_heads) * hd
        + a.num_heads * hd * a.hidden_size
        + 3 * a.hidden_size * a.intermediate_size
    )
    return a.vocab_size * a.hidden_size * (1 if a.tie_word_embeddings else 2) + a.num_layers * per_layer


def resolve_kv_dtype(
    name: str, device: torch.device, dtype: torch.dtype, quantization: str, weight_bytes: int, margs: ModelArgs
) -> torch.dtype:
    """The pool's torch dtype for ``--kv-cache-dtype name``.

    Args:
        dtype: the model's compute dtype; quantization: the weight format the runner applied ("gguf" for a
            GGUF's own blocks); weight_bytes: bytes the weights hold (tells an all-F32 GGUF from the rest).

    Raises:
        ValueError: int8 on CUDA (no FlashInfer path wired for it), or fp32 there (FlashInfer has no fp32).
    """
    if name == "auto":
        if device.type == "cuda" or dtype != torch.float32:
            return dtype
        if quantization == "none" or (quantization == "gguf" and weight_bytes >= 3.5 * fp32_params(margs)):
            return torch.float32
        return torch.float16
    kv = KV_DTYPES[name]
    if device.type == "cuda" and kv not in (torch.float16, torch.bfloat16):
        raise ValueError(f"kv_cache_dtype {name!r} runs on the cpu only; on cuda use fp16 or bf16 (FlashInfer)")
    return kv
