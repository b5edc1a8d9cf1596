"""Attention backend registry: ``get_backend(name, device)``.

``auto`` picks FlashInfer on CUDA when it is installed, torch-native otherwise.
"""

from __future__ import annotations

import importlib.util

import torch

from radixrt.kernels.attention.base import AttentionBackend
from radixrt.kernels.attention.metadata import AttentionMetadata

BACKENDS = ("auto", "torch_native", "flashinfer")


def get_backend(
    name: str,
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
    kv_dtype: torch.dtype | None = None,
    cpu_cascade: bool = False,
) -> AttentionBackend:
    """Return an attention backend instance.

    ``auto`` is FlashInfer on CUDA for fp16/bf16 when flashinfer is installed (FlashInfer has no fp32
    kernels), torch-native otherwise. ``kv_dtype``: the pool's element type (default ``dtype``);
    ``cpu_cascade``: the torch-native C++ kernels attend shared-prefix groups once per group (opt-in: not
    batch-invariant).

    Raises:
        ValueError: an unknown name, or ``flashinfer`` without CUDA or without the package installed.
    """
    device = torch.device(device)
    if name not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {BACKENDS}, got {name!r}")
    if name == "auto":
        has_fi = importlib.util.find_spec("flashinfer") is not None
        fi_ok = device.type == "cuda" and has_fi and dtype in (torch.float16, torch.bfloat16)
        name = "flashinfer" if fi_ok else "torch_native"
    if name == "flashinfer":
        if device.type != "cuda":
            raise ValueError("attention_backend 'flashinfer' needs a CUDA device; use 'torch_native' on CPU")
        if importlib.util.find_spec("flashinfer") is None:
            raise ValueError("attention_backend 'flashinfer' needs flashinfer-python: pip install 'radixrt[cuda]'")
        from radixrt.kernels.attention.flashinfer import FlashInferBackend

        return FlashInferBackend(device)
    from radixrt.kernels.attention.torch_native import TorchNativeBackend

    return TorchNativeBackend(device, dtype=dtype, cascade=cpu_cascade, kv_dtype=kv_dtype)


__all__ = ["AttentionBackend", "AttentionMetadata", "get_backend", "BACKENDS"]
