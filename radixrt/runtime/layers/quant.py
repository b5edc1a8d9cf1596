"""Weight formats for CPU inference: ``--quantization auto|none|fp16|bf16|int8|q4``.

Every format runs one kernel for every row count, so a row's result never depends on the rows beside it
(decode alone or batched, a cache hit or a miss, a prefill chunk of any size: the same greedy tokens), and
every format holds one copy of each weight:

- ``none``  fp32 (:class:`DenseLinear`: radixrt's panel kernel, ``kernels/gemv``). Parity with HF fp32.
- ``fp16`` / ``bf16``  the same kernel over a 2-byte copy, widened in registers.
- ``int8``  GGUF Q8_0 blocks (32 weights, one fp16 scale), quantized here from fp32 when the source has
  none (``gguf.quants.quantize``, llama.cpp's ``quantize_row_q8_0_ref``).
- ``q4``    GGUF Q4_1 blocks (or a file's own Q4_0/Q4_1), quantized here from fp32 otherwise
  (:func:`~radixrt.runtime.layers.gguf_blocks.quantize_q4_1`, llama.cpp's ``quantize_row_q4_1_ref``); the LM
  head in Q8_0.
- ``q4_k``  GGUF Q4_K blocks (256 weights, 6-bit sub-block scales and mins), quantized here
  (:func:`~radixrt.runtime.layers.q4k_quant.quantize_q4_k`, after ggml's ``quantize_row_q4_K_ref``) or a
  file's own Q4_K; a matrix whose input dimension is not a multiple of 256 (SmolLM2's 576) falls back to
  Q4_1 (llama.cpp's ``llama-quantize`` falls back to Q5_0, which we have no quantizer for); head Q8_0.
- ``auto``  a GGUF's own blocks, every type (``models/gguf_load.py``); a safetensors directory's own dtype
  (fp32, fp16 or bf16: ``models/st_load.py``).

The block formats run :class:`~radixrt.runtime.layers.ggml_linear.GGMLLinear` (int8 activations per row).
This module applies the formats to an fp32 model (safetensors, ``--tp``); a GGUF on the CPU is built in
its format directly, layer by layer (``models/gguf_load.py``).
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import nn

from radixrt.kernels import layer as layer_kernels
from radixrt.kernels.gemv import DenseWeight
from radixrt.runtime.layers.ggml_linear import GGMLLinear
from radixrt.runtime.layers.projection import Projection
from radixrt.runtime.layers.gguf_blocks import quantize_q4_1
from radixrt.runtime.layers.q4k_quant import QK_K, quantize_q4_k

logger = logging.getLogger(__name__)
FORMATS = ("none", "fp16", "bf16", "int8", "q4", "q4_k")
DTYPES = {"none": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class DenseLinear(Projection):
    """``y = x @ w.T (+ bias)`` over one copy of ``w [out, in]`` in ``dtype`` (fp32, fp16 or bf16).
    Input ``[M, in]`` fp32, output ``[M, out]`` fp32, any ``M`` through the one panel kernel."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.fp32 = DenseWeight(weight, dtype)  # the name older callers read; it holds `dtype`
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fp32(x, self.bias)

    def dense(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)

    def kernel_weight(self, rows: int) -> tuple[int, torch.Tensor] | None:
        """``(kind, weight)`` for ``radixrt_layer.decode_layer``; ``None`` with a bias (that op has none)."""
        if self.bias is not None:
            return None
        how, w = self.fp32.kernel(rows)
        return layer_kernels.KINDS[how], w

    @property
    def nbytes(self) -> int:
        return self.fp32.nbytes


Fp32Linear = DenseLinear  # the fp32 case, by the name the loaders use


def quantize_q8_0(w: torch.Tensor) -> torch.Tensor:
    """``w [N, K]`` fp32 (K a multiple of 32) -> Q8_0 blocks ``[N, K / 32 * 34]`` uint8 (``gguf.quants``)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    q = quantize(w.detach().float().contiguous().numpy(), GGMLQuantizationType.Q8_0)
    return torch.from_numpy(np.ascontiguousarray(q))


def make_linear(
    fmt: str,
    name: str,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    blocks: tuple[str, torch.Tensor] | None,
    kernel=None,
) -> nn.Module:
    """The module of one projection ``name`` (``weight [out, in]``: fp32, or fp16/bf16 for those formats
    and the block ones, which quantize from it) in format ``fmt``; ``blocks``:
    the source's own ``(ggml type, bytes)`` of the same weight when it has them (a GGUF), reused where the
    format is theirs. ``kernel`` is ignored (kept for callers of the old signature)."""
    if fmt in DTYPES:
        return DenseLinear(weight, bias, DTYPES[fmt])
    k = weight.shape[1]
    if fmt == "q4_k" and name != "lm_head":
        if blocks is not None and blocks[0] == "Q4_K":
            return GGMLLinear("Q4_K", blocks[1], k, bias)
        if k % QK_K == 0:
            return GGMLLinear("Q4_K", quantize_q4_k(weight), k, bias)
        fmt = "q4"  # the Q4_1 fallback of a row length Q4_K cannot split
    if fmt == "q4" and name != "lm_head":
        if blocks is not None and blocks[0] in ("Q4_0", "Q4_1"):
            return GGMLLinear(blocks[0], blocks[1], k, bias)
        return GGMLLinear("Q4_1", quantize_q4_1(weight), k, bias)
    if blocks is not None and blocks[0] == "Q8_0":
        return GGMLLinear("Q8_0", blocks[1], k, bias)
    return GGMLLinear("Q8_0", quantize_q8_0(weight), k, bias)


@torch.no_grad()
def quantize_model(model: nn.Module, fmt: str) -> nn.Module:
    """Swap ``model``'s projections and LM head for ``fmt`` modules, in place; returns ``model``. A tied LM
    head becomes its own module (``model.lm_head``) over the embedding's values.

    Raises:
        ValueError: ``fmt`` not in :data:`FORMATS`, or a model that is not fp32 on the CPU.
    """
    if fmt not in FORMATS:
        raise ValueError(f"quantization must be one of {FORMATS}, got {fmt!r}")
    p = next(model.parameters())
    if p.device.type != "cpu" or p.dtype != torch.float32:
        raise ValueError(f"quantization {fmt!r} needs an fp32 model on the cpu, got {p.dtype} on {p.device}")
    targets = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    for name, lin in targets:
        parent, _, attr = name.rpartition(".")
        new = make_linear(fmt, name, lin.weight, lin.bias, None)
        setattr(model.get_submodule(parent) if parent else model, attr, new)
    if model.lm_head is None:  # tied embeddings: the head's own module over their values
        model.lm_head = make_linear(fmt, "lm_head", model.embed_tokens.weight, None, None)
    logger.info("weights: %s (%d projections)", fmt, len(targets))
    return model


def quantize_for_source(model: nn.Module, fmt: str, source, device: torch.device) -> str:
    """Resolve ``auto`` and apply ``fmt`` to ``model`` (fp32, loaded from ``source``, a ``ModelSource``, on
    the fp32 state-dict path); returns the format used. On cuda only ``none`` runs.

    Raises:
        ValueError: a format other than ``auto``/``none`` on cuda, or an unknown format.
    """
    if device.type != "cpu":
        if fmt not in ("auto", "none"):
            raise ValueError(f"quantization {fmt!r} runs on the cpu only; use 'none' on {device.type}")
        return "none"
    fp32 = next(model.parameters()).dtype == torch.float32
    if fmt == "auto":
        gguf = source.gguf_file is not None
        fmt = "q4" if gguf and fp32 else "none"  # a GGUF reaches here only under --tp: its own 4 bits
    if not fp32:
        return "none"  # a bf16/fp16 model on the cpu keeps its nn.Linear layers
    quantize_model(model, fmt)
    return fmt
