// torch.ops.radixrt_ggml.mm(x, w, ggml_type): x [M, K] fp32 @ the GGUF tensor's bytes w [N, K / block *
// type_size] uint8 (one row of blocks per output channel) -> [M, N] fp32, for every type with a kernel in
// legacy_blocks.cpp / kquants.cpp. The activations are quantized once per call, per row (q8_act.h); the
// weight is read in place, never expanded to fp32. Batch-invariant: see mm_driver.h.
#include <ATen/ATen.h>
#include <torch/library.h>
#include <vector>
#include "../alloc.h"
#include "../parallel.h"
#include "mm_driver.h"
#include "q8_act.h"

namespace {

struct TypeInfo {
  int64_t type;
  const char* name;
  int64_t block, bytes;
};

// gguf's GGMLQuantizationType numbers and gguf.constants.GGML_QUANT_SIZES
constexpr TypeInfo TYPES[] = {{2, "Q4_0", 32, 18},  {3, "Q4_1", 32, 20},   {6, "Q5_0", 32, 22},
                              {7, "Q5_1", 32, 24},  {8, "Q8_0", 32, 34},   {12, "Q4_K", 256, 144},
                              {13, "Q5_K", 256, 176}, {14, "Q6_K", 256, 210}};

const TypeInfo* find_type(int64_t type) {
  for (const TypeInfo& t : TYPES)
    if (t.type == type) return &t;
  return nullptr;
}

}  // namespace

namespace radixrt {
namespace ggml {

at::Tensor mm(const at::Tensor& x, const at::Tensor& w, int64_t ggml_type) {
  if (ggml_type & 256) return x16::mm(x, w, ggml_type & 255);  // the weight is in the type's x16 layout
  const TypeInfo* t = find_type(ggml_type);
  TORCH_CHECK(t != nullptr, "radixrt_ggml.mm: no kernel for ggml type ", ggml_type,
              " (supported: Q4_0=2, Q4_1=3, Q5_0=6, Q5_1=7, Q8_0=8, Q4_K=12, Q5_K=13, Q6_K=14)");
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
              "radixrt_ggml.mm(", t->name, "): x must be a contiguous fp32 CPU tensor [M, K], got ",
              x.scalar_type(), " ", x.sizes());
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K % t->block == 0, "radixrt_ggml.mm(", t->name, "): K = ", K, " is not a multiple of the block size ",
              t->block);
  const int64_t row_bytes = K / t->block * t->bytes;
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kByte && w.dim() == 2 && w.is_contiguous() &&
                  w.size(1) == row_bytes,
              "radixrt_ggml.mm(", t->name, "): w must be contiguous uint8 [N, K / ", t->block, " * ", t->bytes,
              "] = [N, ", row_bytes, "] for K = ", K, ", got ", w.scalar_type(), " ", w.sizes());
  const int64_t N = w.size(0);
  auto out = radixrt::empty_like_dtype({M, N}, x);
  if (M == 0 || N == 0) return out;
  if (K == 0) return out.zero_();

  const bool k256 = t->block == 256;
  std::vector<int8_t> q(M * K);
  std::vector<float> d(M * (K / t->block)), s(k256 ? 0 : M * (K / 32));
  std::vector<int16_t> bsums(k256 ? M * (K / 16) : 0);
  const float* xp = x.data_ptr<float>();
  // rows are independent: any split over threads gives the same bytes
  radixrt::parallel_for(0, M, std::max<int64_t>(1, (1 << 16) / K), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      if (k256)
        radixrt::q8::quantize_row_256(xp + m * K, K, q.data() + m * K, d.data() + m * (K / 256),
                                      bsums.data() + m * (K / 16));
      else
        radixrt::q8::quantize_row_32(xp + m * K, K, q.data() + m * K, d.data() + m * (K / 32),
                                     s.data() + m * (K / 32));
    }
  });
  radixrt::ggml::Ctx c{w.data_ptr<uint8_t>(), row_bytes, K, N, q.data(), d.data(), s.data(), bsums.data(),
                       out.data_ptr<float>()};
  const bool ran = k256 ? radixrt::ggml::kquant_run(ggml_type, c, M) : radixrt::ggml::legacy_run(ggml_type, c, M);
  TORCH_CHECK(ran, "radixrt_ggml.mm: no kernel for ggml type ", t->name);
  return out;
}

}  // namespace ggml
}  // namespace radixrt

// ggml_gemv.cpp owns TORCH_LIBRARY(radixrt_ggml); this file adds to it.
TORCH_LIBRARY_FRAGMENT(radixrt_ggml, m) {
  // x [M, K] fp32 @ GGUF blocks of `ggml_type` [N, K / block * type_size] uint8 -> [M, N] fp32; with
  // ggml_type | 256, w is that type's x16 layout [N / 16, ...] (x16_mm.cpp)
  m.def("mm(Tensor x, Tensor w, int ggml_type) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixrt_ggml, CPU, m) { m.impl("mm", &radixrt::ggml::mm); }
