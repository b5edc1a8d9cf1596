"""The GGUF block types radixrt runs, as the layers call them: names in, kernels of
:mod:`radixrt.kernels.quant` underneath (``radixrt_ggml.mm`` for every row count; a torch fallback that
dequantizes where the C++ library cannot be built), and the choice of the x16 layout
(:mod:`radixrt.kernels.quant.x16`) for a weight."""

from __future__ import annotations

import os

import torch

from radixrt.kernels import quant as kq
from radixrt.kernels.quant import x16

SUPPORTED = kq.SUPPORTED
X16 = x16.X16


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


def use_x16(name: str, rows: int) -> bool:
    """True if a ``[rows, K]`` weight of type ``name`` runs in its x16 layout: the type has one (Q4_0, Q4_1, Q5_0,
    Q5_1, Q8_0, Q4_K, Q5_K, Q6_K: :data:`~radixrt.kernels.quant.x16.LAYOUTS`), ``rows`` is a multiple of 16,
    the C++ kernels load, and ``RADIXRT_GGML_X16`` is not ``0`` (read at each load; ``0`` keeps every weight in
    the file's blocks, for A/B measurements)."""
    return os.environ.get("RADIXRT_GGML_X16", "1") != "0" and x16.can_repack(name, rows) and has_kernels()


def mm(x: torch.Tensor, blocks: torch.Tensor, tid: int) -> torch.Tensor:
    """``x [M, K]`` fp32 @ the blocks' weight ``[N, K]`` -> ``[M, N]`` fp32 (:func:`radixrt.kernels.quant.mm`);
    ``tid | X16``: ``blocks`` in that type's x16 layout (the torch twin where the C++ library is missing)."""
    if tid & X16 and not has_kernels():
        return x16.mm_twin(x, blocks, kq.TYPES[tid & ~X16].name)
    return kq.mm(x, blocks, tid)


def dequantize(blocks: torch.Tensor, name: str, cols: int, x16_layout: bool) -> torch.Tensor:
    """A projection's weight as fp32 ``[rows, cols]``, from the file's blocks or their x16 layout."""
    return x16.dequantize(blocks, name) if x16_layout else dequantize_rows(blocks, name, cols)
