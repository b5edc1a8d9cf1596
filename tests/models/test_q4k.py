"""``--quantization q4_k``'s quantizer (issue 26): our Q4_K blocks read back through gguf-py's reference
dequantizer (llama.cpp's layout) within the stated error, and the Q4_K kernel runs them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixrt.runtime.layers import q4k_quant
from radixrt.runtime.layers.gguf_blocks import dequantize as dequantize_legacy
from radixrt.runtime.layers.gguf_blocks import quantize_q4_1
from radixrt.runtime.layers.q4k_quant import quantize_q4_k


def _ref(blocks: torch.Tensor, shape) -> torch.Tensor:
    import gguf
    from gguf.quants import dequantize

    return torch.from_numpy(dequantize(blocks.numpy(), gguf.GGMLQuantizationType.Q4_K)).reshape(shape)


def _rel(r: torch.Tensor, w: torch.Tensor) -> float:
    return ((r - w).pow(2).mean().sqrt() / w.pow(2).mean().sqrt()).item()


def test_q4_k_round_trip_through_ggufs_dequantizer(monkeypatch):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 1024, generator=g) * torch.rand(64, 1, generator=g)  # rows of different spans
    w[3] = 0.0  # a flat row: d = dmin = 0, all zeros back
    w[5, :256] = torch.rand(256, generator=g) + 0.5  # a block of positive weights only (min clamps to 0)
    b = quantize_q4_k(w)
    assert b.shape == (64, 4 * 144) and b.dtype == torch.uint8
    r = _ref(b, w.shape)
    assert torch.equal(r[3], torch.zeros(1024))
    # Measured: 0.0719 RMS error relative to the weights' RMS (search) vs 0.0787 (plain min/max rounding,
    # steps=-1) and 0.0785 for Q4_1 (32 weights, fp16 scale and min); the worst weight is within one step.
    searched = _rel(r, w)
    monkeypatch.setattr(q4k_quant, "_sub_block_fit", lambda x, steps=20, f=q4k_quant._sub_block_fit: f(x, -1))
    plain = _rel(_ref(quantize_q4_k(w), w.shape), w)
    q41 = _rel(dequantize_legacy("Q4_1", quantize_q4_1(w)), w)
    print(f"relative RMS error: q4_k {searched:.4f}, min/max only {plain:.4f}, q4_1 {q41:.4f}")
    assert searched < 0.075 and searched < plain < 0.082
    span = w.reshape(64, 32, 32).amax(-1) - w.reshape(64, 32, 32).amin(-1).clamp(max=0)
    assert ((r - w).abs().reshape(64, 32, 32) <= span[..., None] / 15 * 1.6 + 1e-6).all()


def test_q4_k_refuses_ragged_rows():
    with pytest.raises(ValueError, match="multiple of 256"):
        quantize_q4_k(torch.zeros(4, 576))


def test_q4_k_blocks_run_in_the_kernel():
    from radixrt.runtime.layers import ggml_ops
    from radixrt.runtime.layers.ggml_linear import GGMLLinear

    g = torch.Generator().manual_seed(1)
    w = torch.randn(40, 512, generator=g)
    lin = GGMLLinear("Q4_K", quantize_q4_k(w), 512, None)
    x = torch.randn(9, 512, generator=g)
    ref = x @ _ref(lin.blocks, w.shape).T
    y = lin(x)
    # int8 activations per 256 (Q8_K): within 1 % of the product's scale
    assert (y - ref).abs().max().item() <= 0.01 * ref.abs().max().item()
    assert torch.equal(lin(x[4:5]), y[4:5])  # a row alone: the same bits
    assert np.isfinite(y.numpy()).all()
    # 48 rows: the x16 layout where the kernels run (40 above are not a multiple of 16), the same weight
    w48 = torch.cat([w, w[:8]])
    lin48 = GGMLLinear("Q4_K", quantize_q4_k(w48), 512, None)
    assert lin48.x16 == ggml_ops.use_x16("Q4_K", 48) and lin48.blocks.shape[0] == (3 if lin48.x16 else 48)
    assert torch.equal(lin48.weight_fp32(), torch.cat([lin.weight_fp32(), lin.weight_fp32()[:8]]))
    y48 = lin48(x)
    assert (y48[:, :40] - ref).abs().max().item() <= 0.01 * ref.abs().max().item()
    assert torch.equal(lin48(x[4:5]), y48[4:5])
