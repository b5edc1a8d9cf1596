// One Llama decoder layer as one op, for any step the C++ attention kernels take (a pool of any kv_chunk.h type:
// decode rows, shared-prefix groups and extends in any mix):
//
//   h = add_rms_norm(x, residual, ln1)   (residual += x; the first layer: residual = x, h = rms_norm(x))
//   qkv = h @ W_qkv; rope_(q, k); o = paged_attention(q, k, v)   (writes k, v into the pool)
//   block_attention(o): the groups' and extends' blocks merged into o (cascade_cpu.cpp), if any
//   h = add_rms_norm(o @ W_o, residual, ln2)
//   out = silu_mul(h @ W_gate_up) @ W_down                        -> (out, residual)
//
// Why: at decode batch sizes a layer is ~10 small ops, and calling each from Python (module call, argument
// parsing, dispatch) cost ~80 us per layer, as much as a 4-bit layer's weight GEMVs. Here the same ops run
// through the dispatcher from C++, in the same order with the same kernels, so results are bit-identical
// to the Python path, and each still shows in the torch profiler under its own name.
//
// A projection is (kind, weight): DENSE_T torch mm with w_t [K, N]; GEMV radixrt_gemv::gemv over its panel layout;
// Q4_1X8 / Q4_1 / Q8_0 radixrt_ggml's kernels over GGUF blocks; GGML_BASE + t radixrt_ggml::mm over blocks of
// ggml type t; ONEDNN mkldnn::_linear_pointwise over its
// packed weight. The caller picks the kind for the step's row
// count (runtime/layers/quant.py, kernel_weight). A projection may be several parts whose outputs are
// concatenated (kinds[i] | CONT on every part after the first: a Q4_K_M file's qkv with attn_v in Q6_K);
// each part is the same product the module path runs, so the same bits as its torch.cat.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>
#include <cstdint>
#include <tuple>
#include <vector>

namespace {

enum Kind : int64_t { DENSE_T = 0, GEMV = 1, Q4_1X8 = 2, Q4_1 = 3, Q8_0 = 4, ONEDNN = 5, GGML_BASE = 100 };
constexpr int64_t CONT = 1 << 16;  // flag: this part's output is concatenated onto the previous part's

using Mm = at::Tensor(const at::Tensor&, const at::Tensor&);
using TypedMm = at::Tensor(const at::Tensor&, const at::Tensor&, int64_t);
using Norm = at::Tensor(const at::Tensor&, const at::Tensor&, double);
// The types must be the kernels' own (typed() checks them): a mutated tensor is taken by value there.
using AddNorm = at::Tensor(const at::Tensor&, at::Tensor, const at::Tensor&, double);
using Unary = at::Tensor(const at::Tensor&);
using Rope = void(at::Tensor, const at::Tensor&, const at::Tensor&);
using Attn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                const at::Tensor&, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                                                const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                const at::Tensor&, const at::Tensor&, int64_t, double);
using Blocks = void(const at::Tensor&, at::Tensor, at::Tensor, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                    int64_t, double);

template <class Sig>
c10::TypedOperatorHandle<Sig> handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

// The handles, looked up once (the other sources of the library registered them when it was loaded).
struct Ops {
  c10::TypedOperatorHandle<Mm> gemv = handle<Mm>("radixrt_gemv::gemv");
  c10::TypedOperatorHandle<Mm> q4_1x8 = handle<Mm>("radixrt_ggml::q4_1x8_mm");
  c10::TypedOperatorHandle<Mm> q4_1 = handle<Mm>("radixrt_ggml::q4_1_mm");
  c10::TypedOperatorHandle<Mm> q8_0 = handle<Mm>("radixrt_ggml::q8_0_mm");
  c10::TypedOperatorHandle<TypedMm> ggml = handle<TypedMm>("radixrt_ggml::mm");
  c10::TypedOperatorHandle<Norm> rms_norm = handle<Norm>("radixrt_fused::rms_norm");
  c10::TypedOperatorHandle<AddNorm> add_rms_norm = handle<AddNorm>("radixrt_fused::add_rms_norm");
  c10::TypedOperatorHandle<Unary> silu_mul = handle<Unary>("radixrt_fused::silu_mul");
  c10::TypedOperatorHandle<Rope> rope_ = handle<Rope>("radixrt_fused::rope_");
  c10::TypedOperatorHandle<Attn> attention = handle<Attn>("radixrt_attn::paged_attention");
  c10::TypedOperatorHandle<Blocks> blocks = handle<Blocks>("radixrt_attn::block_attention");
};

const Ops& ops() {
  static const Ops o;
  return o;
}

// oneDNN's inner product over its packed weight; boxed, since its schema has no stable C++ signature to
// type-check against (found on first use: a torch without oneDNN never gets here, kernels/gemv).
at::Tensor onednn(const at::Tensor& x, const at::Tensor& w) {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  c10::Stack stack{x, w, c10::IValue(), c10::IValue(std::string("none")),
                   c10::IValue(c10::List<std::optional<at::Scalar>>()), c10::IValue(std::string(""))};
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

at::Tensor linear(const at::Tensor& x, int64_t kind, const at::Tensor& w) {
  switch (kind) {
    case DENSE_T: return at::mm(x, w);
    case GEMV: return ops().gemv.call(x, w);
    case Q4_1X8: return ops().q4_1x8.call(x, w);
    case Q4_1: return ops().q4_1.call(x, w);
    case Q8_0: return ops().q8_0.call(x, w);
    case ONEDNN: return onednn(x, w);
  }
  if (kind > GGML_BASE) return ops().ggml.call(x, w, kind - GGML_BASE);  // any GGUF block type, any rows
  TORCH_CHECK(false, "decode_layer: unknown projection kind ", kind);
  return {};
}

// The parts [b, e) of one projection: x @ each, concatenated along the output.
at::Tensor project(const at::Tensor& x, at::IntArrayRef kinds, at::TensorList weights, size_t b, size_t e) {
  if (e - b == 1) return linear(x, kinds[b], weights[b]);
  std::vector<at::Tensor> outs;
  for (size_t i = b; i < e; ++i) outs.push_back(linear(x, kinds[i] & ~CONT, weights[i]));
  return at::cat(outs, 1);
}

std::tuple<at::Tensor, at::Tensor> decode_layer(
    const at::Tensor& x, const c10::optional<at::Tensor>& residual_in, const at::Tensor& ln1, const at::Tensor& ln2,
    double eps, at::IntArrayRef kinds, at::TensorList weights, const at::Tensor& cos, const at::Tensor& sin,
    int64_t num_heads, int64_t num_kv_heads, double scale, at::Tensor k_pool, at::Tensor v_pool,
    at::Tensor k_scale, at::Tensor v_scale, const at::Tensor& out_loc, const at::Tensor& rows, const at::Tensor& page_ptr, const at::Tensor& kv_start,
    const at::Tensor& kv_end, const at::Tensor& kv_indices, int64_t page_size, const at::Tensor& blocks,
    const at::Tensor& members, bool scatter) {
  TORCH_CHECK(kinds.size() == weights.size() && !kinds.empty() && !(kinds[0] & CONT),
              "decode_layer: one kind per weight, the first not a continuation");
  std::vector<size_t> cut;  // projection p is parts [cut[p], cut[p + 1])
  for (size_t i = 0; i < kinds.size(); ++i)
    if (!(kinds[i] & CONT)) cut.push_back(i);
  cut.push_back(kinds.size());
  TORCH_CHECK(cut.size() == 5, "decode_layer: 4 projections (qkv, o, gate_up, down)");
  auto proj = [&](int p, const at::Tensor& in) { return project(in, kinds, weights, cut[p], cut[p + 1]); };
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "decode_layer: x must be contiguous [T, hidden]");
  const Ops& op = ops();
  const int64_t T = x.size(0), D = k_pool.size(2);
  const int64_t q_size = num_heads * D, kv_size = num_kv_heads * D;
  at::Tensor residual, h;
  if (residual_in.has_value()) {
    residual = *residual_in;
    h = op.add_rms_norm.call(x, residual, ln1, eps);
  } else {
    residual = x;
    h = op.rms_norm.call(x, ln1, eps);
  }
  at::Tensor qkv = proj(0, h);
  // q, k (together, for rope) and v as strided views of qkv [T, q_size + 2 kv_size]: one op each, where
  // narrow + view are three.
  TORCH_CHECK(qkv.is_contiguous(), "decode_layer: the qkv product must be contiguous");
  const int64_t row = qkv.size(1), off = qkv.storage_offset();
  at::Tensor qk = qkv.as_strided({T, num_heads + num_kv_heads, D}, {row, D, 1}, off);
  op.rope_.call(qk, cos, sin);
  const at::Tensor q = qkv.as_strided({T, num_heads, D}, {row, D, 1}, off);
  const at::Tensor k = qkv.as_strided({T, num_kv_heads, D}, {row, D, 1}, off + q_size);
  const at::Tensor v = qkv.as_strided({T, num_kv_heads, D}, {row, D, 1}, off + q_size + kv_size);
  auto [o, lse] = op.attention.call(q, k, v, out_loc, k_pool, v_pool, k_scale, v_scale, rows, page_ptr, kv_start,
                                    kv_end, kv_indices, page_size, scale);
  if (blocks.size(0))
    op.blocks.call(q, o, lse, rows, blocks, members, k_pool, v_pool, k_scale, v_scale, kv_indices, page_size, scale);
  TORCH_CHECK(o.size(0) == T, "decode_layer: the paged kernel must attend every row of the step");
  if (scatter) o = at::empty_like(o).index_copy_(0, rows, o);  // its rows back in token order
  h = op.add_rms_norm.call(proj(1, o.view({T, q_size})), residual, ln2, eps);
  at::Tensor out = proj(3, op.silu_mul.call(proj(2, h)));
  return {out, residual};
}

}  // namespace

TORCH_LIBRARY(radixrt_layer, m) {
  // x [T, hidden] fp32 (the previous layer's output), residual [T, hidden] (updated in place; None for the
  // first layer), pools [slots, Hkv, D] fp32/fp16/bf16/int8 and int8's scales [slots, Hkv] (else empty)
  // (written), then the attention's arguments as in
  // radixrt_attn::paged_attention and block_attention (blocks [0, 6]: none)
  // -> (out [T, hidden], residual).
  m.def("decode_layer(Tensor x, Tensor? residual, Tensor ln1, Tensor ln2, float eps, int[] kinds, "
        "Tensor[] weights, Tensor cos, Tensor sin, int num_heads, int num_kv_heads, float scale, "
        "Tensor(a!) k_pool, Tensor(b!) v_pool, Tensor(c!) k_scale, Tensor(d!) v_scale, Tensor out_loc, Tensor rows, Tensor page_ptr, "
        "Tensor kv_start, Tensor kv_end, Tensor kv_indices, int page_size, Tensor blocks, Tensor members, "
        "bool scatter) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(radixrt_layer, CPU, m) { m.impl("decode_layer", &decode_layer); }
// A oneDNN-packed weight among the arguments makes the dispatcher pick this key.
TORCH_LIBRARY_IMPL(radixrt_layer, MkldnnCPU, m) { m.impl("decode_layer", &decode_layer); }
