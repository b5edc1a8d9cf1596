// The AVX-512 VNNI entry of radixrt_ggml.mm: 3 or more activation rows on gemm512.h's tiles, 1-2 rows (decode)
// on gemv512.h's (every type but Q6_K); the same bits as the AVX2 tiles, which keep every row count on a CPU
// without AVX-512 VNNI. Q4_0 never comes here: q4_0_rows.cpp has its own arithmetic and tiles.
// RADIXRT_DISABLE_AVX512=1 (read once; unset, empty or 0: enabled) keeps the AVX2 tiles, for comparisons.
#include <ATen/ATen.h>
#include <torch/library.h>
#include <cstdlib>
#include <string>
#include "gemm512.h"
#include "gemv512.h"
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

// 1-2 rows (decode): tiles of 2 NZ weight rows, two per register (gemv512.h), split over threads as run()
// does; the tile after next is prefetched. More rows in flight keep more memory reads outstanding: 8 rows
// (NZ = 4) for the 32-element types, 4 for the K-quants (whose decoded heads would not fit the registers).
template <class T, bool K256, int MB>
void gemv(const Ctx& c) {
  constexpr int NZ = K256 ? 2 : 4;
  const int64_t nb = c.K / 32;
  std::vector<int32_t> offs;
  if constexpr (!K256) {
    if (T::OFFSET_SHIFT) {
      offs.resize(MB * nb * 8);
      for (int m = 0; m < MB; ++m) v512::offsets(c.q + m * c.K, nb, T::OFFSET_SHIFT, offs.data() + m * nb * 8);
    }
  }
  const int64_t pf = 2 * NZ * c.row_bytes;
  const int64_t grain = MB * c.N * c.K < (1 << 16) ? c.N : 16;
  radixrt::parallel_for(0, c.N, grain, [&](int64_t n0, int64_t n1) {
    int64_t n = n0;
    for (; n + 2 * NZ <= n1; n += 2 * NZ) {
      int64_t rows[2 * NZ];
      for (int r = 0; r < 2 * NZ; ++r) rows[r] = n + r;
      if constexpr (K256) v512::ktile<T, NZ, MB>(c, rows, 0, pf);
      else v512::ltile<T, NZ, MB>(c, rows, 0, offs.data(), pf);
    }
    for (; n < n1; n += 2) {  // a lone last row pairs with itself
      const int64_t rows[2] = {n, std::min(n + 1, n1 - 1)};
      if constexpr (K256) v512::ktile<T, 1, MB>(c, rows, 0, pf);
      else v512::ltile<T, 1, MB>(c, rows, 0, offs.data(), pf);
    }
  });
}

template <class T, bool K256>
void gemv_m(const Ctx& c, int64_t M) {
  if (M == 1) gemv<T, K256, 1>(c);
  else gemv<T, K256, 2>(c);
}

}  // namespace

bool gemm512_enabled() {
  const char* off = std::getenv("RADIXRT_DISABLE_AVX512");
  static const bool ok = x512::supported() && (off == nullptr || !*off || std::string(off) == "0");
  return ok;
}

bool gemm512_run(int64_t type, const Ctx& c, int64_t M) {
  if (M < 1 || !gemm512_enabled()) return false;
  if (M < 3) {
    switch (type) {  // Q6_K: the AVX2 streaming tile is faster than gemv512.h's (its unpacking costs more at 512)
      case 3: gemv_m<Q4_1, false>(c, M); return true;
      case 6: gemv_m<Q5_0, false>(c, M); return true;
      case 7: gemv_m<Q5_1, false>(c, M); return true;
      case 8: gemv_m<Q8_0, false>(c, M); return true;
      case 12: gemv_m<Q4_K, true>(c, M); return true;
      case 13: gemv_m<Q5_K, true>(c, M); return true;
      default: return false;
    }
  }
  switch (type) {  // gguf's GGMLQuantizationType numbering
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
