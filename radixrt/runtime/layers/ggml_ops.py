"""The GGUF block types radixrt runs, as the layers call them: names in, kernels of
:mod:`radixrt.kernels.quant` underneath (``radixrt_ggml.mm`` for every row count; a torch fallback that
dequantizes where the C++ library cannot be built)."""

from __future__ import annotations

import torch

from radixrt.kernels import quant as kq

SUPPORTED = kq.SUPPORTED


def type_id(name: str) -> int:
    """gguf's ``GGMLQuantizationType`` number of ``name``. Raises ValueError naming the supported types."""
    if name not in kq.BY_NAME:
        raise ValueError(f"ggml type {name!r} has no kernel here; supported: {list(SUPPORTED)}")
    return kq.BY_NAME[name].ggml_type


def check_blocks(blocks: torch.Tensor, name: str, cols: int) -> None:
    """Raises ValueError unless ``blocks`` is uint8 ``[rows, cols / block * type_size]`` of type ``name``."""
    kq.check(torch.empty(0, cols), blocks, type_id(name))


def has_kernels() -> bool:
    """True where the C++ block kernels are built (``radixrt_layer.decode_layer`` can call them)."""
    return kq.ggml_gemv() is not None


def dequantize_rows(blocks: torch.Tensor, name: str, cols: int) -> torch.Tensor:
    """``blocks [n, cols / block * type_size]`` uint8 of type ``name`` -> fp32 ``[n, cols]``."""
    return kq.dequantize(blocks, type_id(name)).reshape(-1, cols)


def mm(x: torch.Tensor, blocks: torch.Tensor, tid: int) -> torch.Tensor:
    """``x [M, K]`` fp32 @ the blocks' weight ``[N, K]`` -> ``[M, N]`` fp32 (:func:`radixrt.kernels.quant.mm`)."""
    return kq.mm(x, blocks, tid)
