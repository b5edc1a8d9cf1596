// The AVX-512 VNNI entry of radixrt_ggml.mm for 3 or more activation rows (tiles in gemm512.h; same bits as
// the AVX2 tiles, which keep every row count on a CPU without AVX-512 VNNI, and 1-2 rows everywhere: decode
// is memory-bound, and there the AVX2 streaming tile already reads at the memory's speed).
// RADIXRT_DISABLE_AVX512=1 (read once; unset, empty or 0: enabled) keeps the AVX2 tiles, for comparisons.
#include <ATen/ATen.h>
#include <torch/library.h>
#include <cstdlib>
#include <string>
#include "gemm512.h"
#include "mm_driver.h"

namespace radixrt {
namespace ggml {
namespace {

template <class T, bool K256>
void run512(const Ctx& c, int64_t M, bool xor80, int shift) {
  x512::Pairs a;
  x512::alloc_pairs(a, M, c.K, K256, shift);
  radixrt::parallel_for(0, a.P, std::max<int64_t>(1, (1 << 15) / c.K), [&](int64_t p0, int64_t p1) {
    x512::make_pairs(c, M, K256, xor80, shift, a, p0, p1);
  });
  // rows split over threads as run() does (mm_driver.h); each output is computed by one thread either way
  const int64_t grain = M * c.N * c.K < (1 << 16) ? c.N : 16;
  radixrt::parallel_for(0, c.N, grain, [&](int64_t n0, int64_t n1) {
    if constexpr (K256) x512::krows<T>(c, M, a, n0, n1);
    else x512::lrows<T>(c, M, a, n0, n1);
  });
}

}  // namespace

bool gemm512_enabled() {
  const char* off = std::getenv("RADIXRT_DISABLE_AVX512");
  static const bool ok = x512::supported() && (off == nullptr || !*off || std::string(off) == "0");
  return ok;
}

bool gemm512_run(int64_t type, const Ctx& c, int64_t M) {
  if (M < 3 || !gemm512_enabled()) return false;
  switch (type) {  // gguf's GGMLQuantizationType numbering
    case 2: run512<Q4_0, false>(c, M, false, 3); return true;
    case 6: run512<Q5_0, false>(c, M, false, 4); return true;
    case 8: run512<Q8_0, false>(c, M, true, 0); return true;
    case 12: run512<Q4_K, true>(c, M, false, 0); return true;
    case 13: run512<Q5_K, true>(c, M, false, 0); return true;
    case 14: run512<Q6_K, true>(c, M, false, 0); return true;
    default: return false;  // Q4_1 / Q5_1: the AVX2 tiles
  }
}

}  // namespace ggml
}  // namespace radixrt

// ggml_gemv.cpp owns TORCH_LIBRARY(radixrt_ggml); this file adds to it.
TORCH_LIBRARY_FRAGMENT(radixrt_ggml, m) {
  // whether mm runs products of >= 3 rows on the AVX-512 VNNI tiles (the CPU has them, not disabled)
  m.def("gemm512_enabled() -> bool");
}

TORCH_LIBRARY_IMPL(radixrt_ggml, CatchAll, m) { m.impl("gemm512_enabled", &radixrt::ggml::gemm512_enabled); }
