"""A whole decoder layer as one C++ op (``decoder_cpu.cpp``), built at first use (:mod:`..cpp`).

``torch.ops.radixrt_layer.decode_layer(x, residual, ln1, ln2, eps, kinds, weights, cos, sin, num_heads,
num_kv_heads, scale, k_pool, v_pool, out_loc, rows, page_ptr, kv_start, kv_end, kv_indices, page_size,
blocks, members, scatter)
-> (out, residual)`` runs the Llama layer's ops (norms, the four projections, RoPE, paged attention and the
block attention of shared-prefix groups and extends, SwiGLU)
through the dispatcher from C++: the same kernels in the same order as the module-by-module path, so the
same bits, without ~80 us of Python per layer. ``kinds[i]`` says how ``weights[i]`` (qkv, o, gate_up, down)
multiplies: one of the constants below; a projection stored in parts of different types (a Q4_K_M file's
qkv with ``attn_v`` in Q6_K) is one weight per part, every part after the first with ``| CONT``.
"""

from __future__ import annotations

from radixrt.kernels import cpp

DENSE_T = 0  # torch mm with w_t [in, out] fp32
GEMV = 1  # radixrt_gemv.gemv over the weight's panel layout (kernels/gemv.pack_panels)
Q4_1X8 = 2  # radixrt_ggml.q4_1x8_mm over the 8-row Q4_1 layout
Q4_1 = 3  # radixrt_ggml.q4_1_mm over Q4_1 blocks
Q8_0 = 4  # radixrt_ggml.q8_0_mm over Q8_0 blocks
ONEDNN = 5  # mkldnn._linear_pointwise over oneDNN's packed copy
GGML_BASE = 100  # + a GGMLQuantizationType value: radixrt_ggml.mm over that type's GGUF blocks
CONT = 1 << 16  # | on a part's kind: its output is concatenated onto the previous part's (one projection)
KINDS = {"dense_t": DENSE_T, "gemv": GEMV, "onednn": ONEDNN}  # by DenseWeight.kernel's names


def layer_ops():
    """``torch.ops.radixrt_layer`` once the library is built, else ``None`` (callers run layer by layer)."""
    return cpp.ops("radixrt_layer")
