"""The one-op decoder layer (kernels/layer) equals the module-by-module layer bit for bit on every kind of
step (prefill, decode, continuation, mixed, shared-prefix groups); the fp32 products (kernels/gemv) pick
their layout."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from radixrt.kernels import cpp
from radixrt.kernels.attention import get_backend
from radixrt.kernels.attention.metadata import AttentionMetadata
from radixrt.kernels.attention.prefix_groups import PrefixGroups
from radixrt.kernels.gemv import DenseWeight
from radixrt.runtime.layers.quant import quantize_model
from radixrt.runtime.mem.kv_pool import KVPool
from radixrt.runtime.models import llama
from radixrt.runtime.models.args import ModelArgs

G = torch.Generator().manual_seed(0)
PAGE = 4


def _model(fmt: str, **cfg) -> llama.LlamaForCausalLM:
    c = LlamaConfig(
        vocab_size=300,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        **cfg,
    )
    torch.manual_seed(0)
    m = llama.LlamaForCausalLM(ModelArgs.from_hf(c))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=G) * 0.1 + (1.0 if p.dim() == 1 else 0.0))
    return quantize_model(m.eval(), fmt)


class Counting:
    """``layer_ops()`` stand-in that counts decode_layer calls."""

    def __init__(self):
        self.calls, self.ops = 0, cpp.ops("radixrt_layer")

    def __call__(self):
        return self

    def decode_layer(self, *a):
        self.calls += 1
        return self.ops.decode_layer(*a)


def _run(model, steps, fused: bool, monkeypatch) -> tuple[list[torch.Tensor], KVPool, int]:
    """Run ``steps`` ``[(tables, q_lens, kv_lens[, prefix groups])]`` in order on a fresh pool; the hidden
    states of each."""
    a = model.args
    kv = KVPool(64, PAGE, a.num_layers, a.num_kv_heads, a.head_dim)
    counter = Counting()
    monkeypatch.setattr(llama, "layer_ops", counter if fused else (lambda: None))
    attn = get_backend("torch_native", torch.device("cpu"), torch.float32)
    outs = []
    for tables, q_lens, kv_lens, *groups in steps:
        meta = AttentionMetadata.build(tables, q_lens, kv_lens, PAGE, prefix_groups=groups[0] if groups else None)
        ids = torch.randint(0, a.vocab_size, (sum(q_lens),), generator=torch.Generator().manual_seed(len(outs)))
        pos = torch.cat([torch.arange(k - q, k) for q, k in zip(q_lens, kv_lens)])
        attn.plan(meta)
        outs.append(model(ids, pos, attn, kv))
    return outs, kv, counter.calls


# Three requests: prefill (causal blocks), two decode steps, short extends (a continuation), a mixed step
# (decode rows + an extend: the kernel's rows out of token order), then a decode step in which requests 0
# and 1 hold the same first 8 pages (a shared-prefix group over 32 tokens).
TABLES = [list(range(0, 16)), list(range(16, 32)), list(range(32, 48))]
SHARED = [TABLES[0], TABLES[0][:8] + list(range(48, 56)), TABLES[2]]
STEPS = [
    (TABLES, [40, 37, 45], [40, 37, 45]),
    (TABLES, [1, 1, 1], [41, 38, 46]),
    (TABLES, [1, 1, 1], [42, 39, 47]),
    (TABLES, [5, 9, 3], [47, 48, 50]),
    (TABLES, [1, 7, 1], [48, 55, 51]),
    (
        SHARED,
        [1, 1, 1],
        [49, 56, 52],
        PrefixGroups(
            rows=[[0, 1]], starts=[0], ends=[32], pages=[TABLES[0][:8]], levels=[0], suffix_starts=[32, 32, 0]
        ),
    ),
]


@pytest.mark.parametrize("fmt", ["none", "q4"])
def test_fused_layer_is_bit_identical(fmt, monkeypatch):
    model = _model(fmt)
    ours, kv1, calls = _run(model, STEPS, True, monkeypatch)
    ref, kv2, none = _run(model, STEPS, False, monkeypatch)
    assert none == 0 and calls == 6 * 3  # every step in one op per layer
    for o, r in zip(ours, ref):
        assert torch.equal(o, r)
    for layer in range(model.args.num_layers):
        assert torch.equal(kv1.k_buffer(layer), kv2.k_buffer(layer))
        assert torch.equal(kv1.v_buffer(layer), kv2.v_buffer(layer))


def test_fused_layer_rows_above_the_gemv():
    """Every row count runs the same projection kernel inside the op: the panel kernel for fp32, the
    block kernel of the type (GGML_BASE + its number) for int8 (Q8_0) and q4 (Q4_1), each in its x16 layout
    where that runs (+ X16)."""
    from radixrt.runtime.layers.ggml_ops import X16, use_x16

    q8 = 8 | (X16 if use_x16("Q8_0", 576 + 2 * 192) else 0)
    q4 = 3 | (X16 if use_x16("Q4_1", 576 + 2 * 192) else 0)
    for fmt, kind in [("none", 1), ("int8", 100 + q8), ("q4", 100 + q4)]:
        proj = _model(fmt).layers[0].self_attn.qkv_proj
        assert [proj.kernel_weight(r)[0] for r in (1, 8, 9, 300)] == [kind] * 4


def test_layers_the_op_cannot_run_stay_python(monkeypatch):
    """Biases (Qwen2) run layer by layer, with the same results; int8 (Q8_0 blocks) runs in the op at every
    step: one call per layer per step."""
    for fmt, cfg, expected in [("none", {"attention_bias": True}, 0), ("int8", {}, 6)]:
        model = _model(fmt, **cfg)
        assert (model.layers[0].fused_args(1) is None) == (expected == 0)
        _, _, calls = _run(model, STEPS[:2], True, monkeypatch)
        assert calls == expected


def _in_parts(model: llama.LlamaForCausalLM) -> None:
    """Each layer's qkv as a Q4_K_M file stores it: parts of two types (q in Q8_0, k and v in Q5_0)."""
    from gguf import GGMLQuantizationType, quants

    from radixrt.runtime.layers.ggml_linear import ConcatLinear, GGMLLinear

    for layer in model.layers:
        a = layer.self_attn
        w, hidden = a.qkv_proj.weight_fp32().numpy(), a.qkv_proj.in_features
        q8 = torch.from_numpy(quants.quantize(w[: a.q_size], GGMLQuantizationType.Q8_0).copy())
        q5 = torch.from_numpy(quants.quantize(w[a.q_size :], GGMLQuantizationType.Q5_0).copy())
        a.qkv_proj = ConcatLinear(
            [
                GGMLLinear("Q8_0", q8.reshape(a.q_size, -1), hidden, None),
                GGMLLinear("Q5_0", q5.reshape(w.shape[0] - a.q_size, -1), hidden, None),
            ]
        )


def test_projection_in_parts_runs_in_the_op(monkeypatch):
    """A projection stored in parts of different types (ConcatLinear) runs inside the op, one weight per
    part flagged CONT after the first, concatenated as the module does: the same bits as layer by layer."""
    from radixrt.kernels.layer import CONT
    from radixrt.runtime.layers.ggml_ops import X16, use_x16

    model = _model("int8")
    _in_parts(model)
    w = model.layers[0].fused_args(1)
    q8 = 100 + model.layers[0].self_attn.o_proj.type_id  # Q8_0, x16 where that runs
    assert q8 in (108, 108 | 256) and model.layers[0].self_attn.qkv_proj.parts[0].type_id == q8 - 100
    q5 = 100 + (6 | (X16 if use_x16("Q5_0", 2 * 192) else 0))  # k and v in Q5_0, x16 where that runs
    assert w is not None and w.kinds == [q8, q5 | CONT, q8, q8, q8] and len(w.weights) == 5
    ours, kv1, calls = _run(model, STEPS, True, monkeypatch)
    ref, kv2, none = _run(model, STEPS, False, monkeypatch)
    assert none == 0 and calls == 6 * 3
    for o, r in zip(ours, ref):
        assert torch.equal(o, r)
    for layer in range(model.args.num_layers):
        assert torch.equal(kv1.k_buffer(layer), kv2.k_buffer(layer))


@pytest.mark.parametrize("m", [1, 8, 9, 32, 300])
def test_dense_weight_layouts(m):
    """One copy, the panel layout, for every row count (fp32 and a 2-byte copy); equal to a matmul to
    fp32 rounding."""
    w, b = torch.randn(96, 80, generator=G), torch.randn(96, generator=G)
    x = torch.randn(m, 80, generator=G)
    d = DenseWeight(w)
    assert d.kernel(m)[0] == "gemv" and d.w_t is None and d.nbytes == 96 * 80 * 4
    torch.testing.assert_close(d(x, b), x @ w.t() + b, rtol=1e-5, atol=1e-4)
    assert torch.equal(d.dense(), w)
    half = DenseWeight(w, torch.float16)
    assert half.kernel(m)[0] == "gemv" and half.nbytes == 96 * 80 * 2
    torch.testing.assert_close(half(x), x @ w.half().float().t(), rtol=1e-5, atol=1e-4)
