"""Weight formats for CPU decode: ``--quantization none|fp16|int8|q4``, swapped into a loaded fp32 model.

:func:`quantize_model` replaces every projection (``nn.Linear``: fused qkv, o, fused gate/up, down) and the
LM head with one of the modules below. Embeddings, norms, the residual stream, rotary and attention stay fp32.

- ``none``  fp32: up to 8 rows radixrt's C++ GEMV over the weight packed in column panels, more rows oneDNN
  over its own packed copy (:mod:`radixrt.kernels.gemv`; two copies, twice the fp32 weight memory).
  Token-for-token parity with HF fp32.
- ``fp16``  fp16 weights; fp32 activations cast to fp16 for the product.
- ``int8``  per-output-channel symmetric int8 (``scale = max|w_row| / 127``), bf16 activations into
  ``torch.ops.aten._weight_int8pack_mm``. A module with a GGUF's own Q8_0 blocks runs those instead (below).
- ``q4``    the GGUF's own Q4_1 blocks (Q4_0 rewritten as Q4_1) kept at 4 bits; other sources are quantized
  to Q4_1 here (llama.cpp's ``quantize_row_q4_1_ref``). The LM head keeps a GGUF's Q8_0 blocks (or int8
  per channel when the file has none).

Native GGUF blocks run in ``radixrt/kernels/quant/ggml_gemv.cpp`` (AVX2, activations quantized per 32-block
to int8, as llama.cpp's ``vec_dot_q4_1_q8_1``). Where it cannot be built, Q4_1 falls back to torch's
``_weight_int4pack_mm_for_cpu`` (group size 32, scale ``d``, zero ``m + 8 d``: exact for Q4_1) with bf16
activations, and Q8_0 to int8 per channel.

**Fallback to fp32 by batch rows.** A quantized module also keeps the fp32 copy of the *same* values it holds
(the dequantized blocks), and a product with more than :data:`MAX_ROWS` ``[fmt]`` rows (tokens in the
step) runs on that copy, so prefill and large decode batches never run slower than ``none``. A format
runs up to the largest row count at which it still beats fp32, measured with ``benchmarks/bench_quant.py``
(figures beside :data:`MAX_ROWS`).
"""
from __future__ import annotations

import logging
import os
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

from radixrt.kernels import gemv
from radixrt.kernels import layer as layer_kernels
from radixrt.kernels.gemv import DenseWeight
from radixrt.kernels.quant import ggml_gemv
from radixrt.runtime.layers.gguf_blocks import (dequantize, quantize_q4_1, read_gguf_blocks, repack_q4_1_x8,
                                                tensor_kinds)

logger = logging.getLogger(__name__)
FORMATS = ("none", "fp16", "int8", "q4")
# Largest number of rows (tokens in one product) a format runs at; more rows run the fp32 copy (the panel
# GEMV up to 8 rows, oneDNN above, kernels/gemv). Measured with benchmarks/bench_quant.py (formats interleaved in
# each round, 2-core AVX2 box), whole-model projections in ms, format vs fp32: rows 1: fp16 13.7/21.3 (wins),
# 2: 25.3/18.4 (loses); int8 1: 14.2/21.3, 2: 15.1/18.4, 3: 17.2/17.1 (a tie), 4: 19.0/22.3 (wins), 6: 25.8/23.2
# (loses); q4 1: 5.0, 8: 12.7/27.5, 12: 17.4/32.8; q4 64: 98.3/101.0 and 101.5/105.2 (wins), 96: 166.6/160.2,
# 128: 198.4/187.6 (loses), 1024: 1611.0/1406.5 (against oneDNN).
MAX_ROWS = {"none": 1 << 62, "fp16": 1, "int8": 4, "q4": 64}
# Under q4 the LM head keeps the GGUF's Q8_0 blocks, whose kernel loses to fp32 far sooner than Q4_1's: the
# tied SmolLM2 head [49152, 576], ms, Q8_0 vs fp32: rows 8 3.8/5.8, 16 7.3/6.8, 32 16.6/12.6, 64 30.4/18.8.
Q8_0_HEAD_MAX_ROWS = 12


class Fp32Linear(nn.Module):
    """fp32 ``y = x @ w.T (+ bias)``: the C++ GEMV at a few rows, oneDNN above (:class:`DenseWeight`).
    Input ``[M, in]`` fp32, output ``[M, out]`` fp32. ``gemv=False``: no GEMV copy (one fp32 copy only)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, gemv: bool = True):
        super().__init__()
        self.fp32 = DenseWeight(weight, gemv)
        self.bias = bias

    def dense(self, x: torch.Tensor) -> torch.Tensor:
        return self.fp32(x, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense(x)

    def kernel_weight(self, rows: int) -> tuple[int, torch.Tensor] | None:
        """``(kind, weight)`` for ``radixrt_layer.decode_layer`` (:mod:`radixrt.kernels.layer`): the product
        :meth:`forward` runs for ``rows`` rows; ``None`` where that op cannot run it (a bias)."""
        if self.bias is not None:
            return None
        how, w = self.fp32.kernel(rows)
        return layer_kernels.KINDS[how], w


class QuantLinear(Fp32Linear):
    """A quantized product for up to ``max_rows`` rows, the fp32 copy of the same values (``fp32``) above
    that: oneDNN's layout, and the GEMV's as well where ``max_rows`` is below the GEMV's row limit."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, max_rows: int):
        super().__init__(weight, bias, gemv=max_rows < gemv.MAX_ROWS)
        self.max_rows = max_rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.max_rows:
            return self.dense(x)
        y = self.quant(x)
        return y if self.bias is None else y + self.bias

    def quant(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def kernel_weight(self, rows: int) -> tuple[int, torch.Tensor] | None:
        return super().kernel_weight(rows) if rows > self.max_rows else None  # the formats below say


class Fp16Linear(QuantLinear):
    def __init__(self, weight, bias, max_rows):
        super().__init__(weight, bias, max_rows)
        self.register_buffer("w16", weight.detach().half().contiguous(), persistent=False)

    def quant(self, x):
        return F.linear(x.half(), self.w16).float()


class Int8Linear(QuantLinear):
    """Per-output-channel int8: ``w ≈ q [out, in] int8 * scale [out]``; the fp32 copy is ``q * scale``."""

    def __init__(self, weight, bias, max_rows):
        w = weight.detach().float()
        scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12).to(torch.bfloat16)
        q = (w / scale.float()[:, None]).round().clamp(-127, 127).to(torch.int8)
        super().__init__(q.float() * scale.float()[:, None], bias, max_rows)
        self.register_buffer("q", q.contiguous(), persistent=False)
        self.register_buffer("scale", scale, persistent=False)

    def quant(self, x):
        return torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), self.q, self.scale).float()


class GGMLLinear(QuantLinear):
    """A GGUF's own Q4_1 or Q8_0 blocks ``[out, in / 32 * bytes]`` uint8 (see :mod:`.gguf_blocks`).

    Q4_1 with ``out`` a multiple of 8 is held in the kernel's 8-row layout (:func:`repack_q4_1_x8`, the same
    bytes reordered): 2-5x faster than the row-by-row kernel at batch 1 (measured: whole-model projections of
    SmolLM2 7.3 -> 2.5 ms per step on one core).
    """

    def __init__(self, kind: str, blocks: torch.Tensor, bias, max_rows: int, kernel):
        super().__init__(dequantize(kind, blocks), bias, max_rows)
        self.kind, self.kernel = kind, kernel
        self.x8 = x8 = kind == "Q4_1" and blocks.shape[0] % 8 == 0
        self.register_buffer("blocks", repack_q4_1_x8(blocks) if x8 else blocks.contiguous(), persistent=False)
        self._mm = kernel.q4_1x8_mm if x8 else kernel.q4_1_mm if kind == "Q4_1" else kernel.q8_0_mm

    def quant(self, x):
        return self._mm(x.contiguous(), self.blocks)

    def kernel_weight(self, rows):
        if rows > self.max_rows or self.bias is not None:
            return super().kernel_weight(rows)
        kind = layer_kernels.Q4_1X8 if self.x8 else layer_kernels.Q4_1 if self.kind == "Q4_1" else layer_kernels.Q8_0
        return kind, self.blocks


class Int4PackLinear(QuantLinear):
    """Q4_1 blocks through torch's ``_weight_int4pack_mm_for_cpu`` (bf16 activations, group size 32)."""

    def __init__(self, blocks: torch.Tensor, bias, max_rows: int):
        w = dequantize("Q4_1", blocks)
        super().__init__(w, bias, max_rows)
        n, nb = blocks.shape[0], blocks.shape[1] // 20
        b = blocks.reshape(n, nb, 20)
        d = b[..., :2].contiguous().view(torch.float16).float()[..., 0]  # [out, nb]
        m = b[..., 2:4].contiguous().view(torch.float16).float()[..., 0]
        qs = b[..., 4:].to(torch.int32)
        q = torch.cat([qs & 15, qs >> 4], dim=-1).reshape(n, nb * 32)
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1),
                             persistent=False)
        # (q - 8) * d + (m + 8 d) = q * d + m: torch's int4 zero point sits at 8
        sz = torch.stack([d.t(), (m + 8 * d).t()], dim=-1).to(torch.bfloat16).contiguous()  # [nb, out, 2]
        self.register_buffer("scale_zeros", sz, persistent=False)

    def quant(self, x):
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self.packed, 32,
                                                          self.scale_zeros).float()


def _native(kind: str, blocks: torch.Tensor, bias, max_rows: int, kernel) -> QuantLinear:
    if kernel is not None:
        return GGMLLinear(kind, blocks, bias, max_rows, kernel)
    if kind == "Q4_1":
        return Int4PackLinear(blocks, bias, max_rows)
    return Int8Linear(dequantize(kind, blocks), bias, max_rows)


def make_linear(fmt: str, name: str, weight: torch.Tensor, bias: torch.Tensor | None,
                blocks: tuple[str, torch.Tensor] | None, kernel) -> nn.Module:
    """The module for one projection ``name`` (``weight [out, in]`` fp32) in format ``fmt``."""
    rows = MAX_ROWS[fmt]
    if fmt == "none":
        return Fp32Linear(weight, bias)
    if fmt == "fp16":
        return Fp16Linear(weight, bias, rows)
    head = name == "lm_head"
    if fmt == "int8" or (fmt == "q4" and head):
        if blocks is not None and blocks[0] == "Q8_0":
            return _native("Q8_0", blocks[1], bias, Q8_0_HEAD_MAX_ROWS if fmt == "q4" else rows, kernel)
        return Int8Linear(weight, bias, MAX_ROWS["int8"])
    if blocks is None or blocks[0] != "Q4_1":
        blocks = ("Q4_1", quantize_q4_1(weight))
    return _native("Q4_1", blocks[1], bias, rows, kernel)


@torch.no_grad()
def quantize_model(model: nn.Module, fmt: str,
                   gguf_blocks: dict[str, tuple[str, torch.Tensor]] | None = None) -> nn.Module:
    """Swap ``model``'s projections and LM head for ``fmt`` modules, in place; returns ``model``.

    ``gguf_blocks``: ``{module name: (kind, blocks)}`` from
    :func:`~radixrt.runtime.layers.gguf_blocks.read_gguf_blocks`. A tied LM head becomes its own module
    (``model.lm_head``) reading the embedding's values; ``compute_logits`` calls it.

    Raises:
        ValueError: ``fmt`` not in :data:`FORMATS`, or a model that is not fp32 on the CPU.
    """
    if fmt not in FORMATS:
        raise ValueError(f"quantization must be one of {FORMATS}, got {fmt!r}")
    p = next(model.parameters())
    if p.device.type != "cpu" or p.dtype != torch.float32:
        raise ValueError(f"quantization {fmt!r} needs an fp32 model on the cpu, got {p.dtype} on {p.device}")
    blocks = gguf_blocks or {}
    has_q8 = any(kind == "Q8_0" for kind, _ in blocks.values())
    kernel = ggml_gemv() if fmt == "q4" or (fmt == "int8" and has_q8) else None
    targets = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    for name, lin in targets:
        parent, _, attr = name.rpartition(".")
        new = make_linear(fmt, name, lin.weight, lin.bias, blocks.get(name), kernel)
        setattr(model.get_submodule(parent) if parent else model, attr, new)
    if fmt != "none" and getattr(model, "lm_head", 0) is None:  # tied embeddings: quantize a copy for the head
        model.lm_head = make_linear(fmt, "lm_head", model.embed_tokens.weight, None, blocks.get("lm_head"), kernel)
    logger.info("weights: %s (%d projections%s)", fmt, len(targets),
                "" if fmt in ("none", "fp16") else f", C++ kernel {'on' if kernel is not None else 'off'}")
    return model


def default_format(gguf_path: str | None) -> str:
    """``auto``: a GGUF's own quantization where a kernel for it wins (``q4`` for Q4_0/Q4_1, ``int8`` for
    Q8_0, by the most common kind among its 2-D weights), else ``none``; ``none`` for safetensors."""
    if gguf_path is None:
        return "none"
    kinds = Counter(tensor_kinds(gguf_path).values())
    top = kinds.most_common(1)[0][0] if kinds else "F32"
    return {"Q4_0": "q4", "Q4_1": "q4", "Q8_0": "int8"}.get(top, "none")


def quantize_for_source(model: nn.Module, fmt: str, source, device: torch.device) -> str:
    """Resolve ``auto`` and quantize ``model`` (fp32, loaded from ``source``, a ``ModelSource``); returns
    the format used. On cuda only ``none`` runs (``auto`` means ``none`` there).

    Raises:
        ValueError: a format other than ``auto``/``none`` on cuda, or an unknown format.
    """
    gguf = os.path.join(source.directory, source.gguf_file) if source.gguf_file else None
    if device.type != "cpu":
        if fmt not in ("auto", "none"):
            raise ValueError(f"quantization {fmt!r} runs on the cpu only; use 'none' on {device.type}")
        return "none"
    fp32 = next(model.parameters()).dtype == torch.float32
    if fmt == "auto":
        fmt = default_format(gguf) if fp32 else "none"
    if fmt == "none" and not fp32:
        return fmt  # a bf16/fp16 model keeps its nn.Linear layers
    blocks = None
    if gguf is not None and fmt in ("int8", "q4"):
        a = model.args
        blocks = read_gguf_blocks(gguf, a.num_layers, a.num_heads, a.num_kv_heads, a.tie_word_embeddings)
    quantize_model(model, fmt, blocks)
    return fmt
