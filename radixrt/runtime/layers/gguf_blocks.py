"""A GGUF file's quantized blocks, raw, keyed by radixrt's module names; and Q4_1 blocks made from fp32.

Block formats (llama.cpp ``ggml-common.h``), 32 weights along the input dimension per block:

- Q4_1, 20 bytes: fp16 scale ``d``, fp16 minimum ``m``, 16 bytes of nibbles. Weight ``j`` is the low nibble of
  byte ``j`` and weight ``j + 16`` the high nibble; its value is ``q * d + m``.
- Q4_0, 18 bytes: fp16 ``d`` and the nibbles; value ``(q - 8) * d``. Rewritten here as Q4_1 with
  ``m = -8 d`` (exact: a power-of-two multiple of an fp16 stays an fp16).
- Q8_0, 34 bytes: fp16 ``d`` and 32 int8; value ``q * d``.

llama.cpp's converter permutes the rows of ``attn_q`` / ``attn_k`` for its interleaved rotary form; the rows are
put back exactly as transformers does when it dequantizes (``LlamaTensorProcessor._reverse_permute_weights``).
Blocks run along the input dimension, so a row permutation moves whole rows of blocks and is exact.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

QK = 32
BLOCK_BYTES = {"Q4_1": 20, "Q4_0": 18, "Q8_0": 34}
# GGUF tensor suffix -> (radixrt module, part index within the fused module)
_LAYER_PARTS = {"attn_q": ("self_attn.qkv_proj", 0), "attn_k": ("self_attn.qkv_proj", 1),
                "attn_v": ("self_attn.qkv_proj", 2), "attn_output": ("self_attn.o_proj", 0),
                "ffn_gate": ("mlp.gate_up_proj", 0), "ffn_up": ("mlp.gate_up_proj", 1),
                "ffn_down": ("mlp.down_proj", 0)}


def unpermute_rows(n_rows: int, n_head: int) -> np.ndarray:
    """Row order that undoes llama.cpp's rotary permutation of a ``[n_head * head_dim, K]`` matrix.

    ``new[i] = old[idx[i]]``; the same reshape/swap transformers applies to the dequantized matrix.
    """
    dim = n_rows // n_head // 2
    return np.arange(n_rows).reshape(n_head, dim, 2).swapaxes(2, 1).reshape(n_rows)


def q4_0_to_q4_1(raw: np.ndarray) -> np.ndarray:
    """``[N, nb * 18]`` uint8 Q4_0 -> ``[N, nb * 20]`` uint8 Q4_1 holding the same values."""
    n, nb = raw.shape[0], raw.shape[1] // 18
    b = raw.reshape(n, nb, 18)
    d = b[..., :2].copy().view(np.float16)
    out = np.empty((n, nb, 20), dtype=np.uint8)
    out[..., :2] = b[..., :2]
    out[..., 2:4] = (d * np.float16(-8)).view(np.uint8)
    out[..., 4:] = b[..., 2:]
    return out.reshape(n, nb * 20)


def quantize_q4_1(w: torch.Tensor) -> torch.Tensor:
    """fp32 ``[N, K]`` (K a multiple of 32) -> Q4_1 blocks ``[N, K / 32 * 20]`` uint8.

    Per block: ``m = min``, ``d = (max - min) / 15``, ``q = round((w - m) / d)`` clamped to 0..15, as
    llama.cpp's ``quantize_row_q4_1_ref``.
    """
    n, k = w.shape
    if k % QK:
        raise ValueError(f"Q4_1 needs an input dimension divisible by {QK}, got {k}")
    b = w.detach().float().reshape(n, k // QK, QK)
    lo, hi = b.amin(-1), b.amax(-1)
    d = ((hi - lo) / 15).half()
    m = lo.half()
    inv = torch.where(d.float() > 0, 1.0 / d.float(), torch.zeros_like(lo))
    q = ((b - m.float()[..., None]) * inv[..., None]).round().clamp(0, 15).to(torch.uint8)
    qs = q[..., :16] | (q[..., 16:] << 4)
    hdr = torch.stack([d, m], dim=-1).view(torch.uint8).reshape(n, k // QK, 4)
    return torch.cat([hdr, qs], dim=-1).reshape(n, k // QK * 20).contiguous()


def repack_q4_1_x8(raw: torch.Tensor) -> torch.Tensor:
    """Q4_1 blocks ``[N, nb * 20]`` (N a multiple of 8) -> the kernel's 8-row layout ``[N / 8, nb * 160]`` uint8.

    Per group of 8 rows and block: 4 chunks of 32 bytes (chunk ``k``: bytes ``4k..4k+3`` of the nibbles of
    each of the 8 rows in turn), then the 8 fp16 ``d``, then the 8 fp16 ``m``: the same bytes, reordered so
    that one 32-byte load feeds 8 rows (``q4_1x8_mm`` in ``kernels/quant/ggml_gemv.cpp``).

    Raises:
        ValueError: N not a multiple of 8.
    """
    n, nb = raw.shape[0], raw.shape[1] // 20
    if n % 8:
        raise ValueError(f"the 8-row Q4_1 layout needs a multiple of 8 rows, got {n}")
    b = raw.reshape(n // 8, 8, nb, 20).permute(0, 2, 1, 3)                 # [G, nb, 8 rows, 20]
    qs = b[..., 4:].reshape(n // 8, nb, 8, 4, 4).transpose(2, 3)            # [G, nb, 4 chunks, 8 rows, 4]
    d, m = b[..., 0:2], b[..., 2:4]                                         # [G, nb, 8, 2]
    out = torch.cat([qs.reshape(n // 8, nb, 128), d.reshape(n // 8, nb, 16), m.reshape(n // 8, nb, 16)], -1)
    return out.reshape(n // 8, nb * 160).contiguous()


def dequantize(kind: str, raw: torch.Tensor) -> torch.Tensor:
    """Q4_1 or Q8_0 blocks ``[N, nb * bytes]`` uint8 -> fp32 ``[N, nb * 32]`` (the exact stored values)."""
    n = raw.shape[0]
    nb = raw.shape[1] // BLOCK_BYTES[kind]
    b = raw.reshape(n, nb, BLOCK_BYTES[kind])
    d = b[..., :2].contiguous().view(torch.float16).float()
    if kind == "Q8_0":
        return (b[..., 2:].contiguous().view(torch.int8).float() * d).reshape(n, nb * QK)
    m = b[..., 2:4].contiguous().view(torch.float16).float()
    qs = b[..., 4:]
    q = torch.cat([qs & 15, qs >> 4], dim=-1).float()
    return (q * d + m).reshape(n, nb * QK)


@lru_cache(maxsize=2)
def gguf_reader(path: str):
    """A ``gguf.GGUFReader`` (memory-mapped); parsing the metadata of a 49k-token vocabulary takes seconds,
    so one reader per file serves every engine of the process."""
    from gguf import GGUFReader

    return GGUFReader(path)


def tensor_kinds(path: str) -> dict[str, str]:
    """``{tensor name: ggml type name}`` of the 2-D tensors (weights) of a GGUF file."""
    return {t.name: t.tensor_type.name for t in gguf_reader(path).tensors if len(t.shape) == 2}


@lru_cache(maxsize=2)
def read_gguf_blocks(path: str, num_layers: int, num_heads: int, num_kv_heads: int,
                     tie_word_embeddings: bool) -> dict[str, tuple[str, torch.Tensor]]:
    """The file's Q4_0/Q4_1/Q8_0 matrices, as ``{module name: (kind, blocks [N, nb * bytes] uint8)}``.

    Module names are those of :class:`~radixrt.runtime.models.llama.LlamaForCausalLM`
    (``layers.3.self_attn.qkv_proj``, ``lm_head``). Q4_0 comes back as Q4_1. A fused module appears only
    when all its parts share one kind; other tensors (F32, F16, K-quants) are left out, and the caller
    quantizes those from fp32. Cached per file: the tensors are shared, read-only, by every engine.
    """
    reader = gguf_reader(path)
    arch = reader.fields["general.architecture"].contents() if "general.architecture" in reader.fields else "llama"
    permuted = arch == "llama"  # llama.cpp permutes q/k only for the llama architecture (Mistral too), not Qwen
    raw: dict[str, tuple[str, np.ndarray]] = {}
    for t in reader.tensors:
        kind = t.tensor_type.name
        if kind in BLOCK_BYTES:
            arr = np.asarray(t.data)
            raw[t.name] = ("Q4_1", q4_0_to_q4_1(arr)) if kind == "Q4_0" else (kind, arr)
    out: dict[str, tuple[str, torch.Tensor]] = {}
    for i in range(num_layers):
        fused: dict[str, list] = {}
        for suffix, (module, part) in _LAYER_PARTS.items():
            fused.setdefault(module, []).append((part, raw.get(f"blk.{i}.{suffix}.weight")))
        for module, parts in fused.items():
            parts = [p for _, p in sorted(parts, key=lambda x: x[0])]
            if any(p is None for p in parts) or len({k for k, _ in parts}) != 1:
                continue
            blocks = []
            for j, (kind, arr) in enumerate(parts):
                if permuted and module.endswith("qkv_proj") and j < 2:  # q (j = 0), k (j = 1): rotary permutation
                    arr = arr[unpermute_rows(arr.shape[0], num_heads if j == 0 else num_kv_heads)]
                blocks.append(arr)
            out[f"layers.{i}.{module}"] = (parts[0][0], torch.from_numpy(np.ascontiguousarray(np.concatenate(blocks))))
    head = raw.get("token_embd.weight" if tie_word_embeddings else "output.weight")
    if head is not None:
        out["lm_head"] = (head[0], torch.from_numpy(np.array(head[1])))
    return out
