// The AVX-512 VNNI entry of radixrt_ggml.mm: 1 activation row (decode) on gemv512.h's tiles (every type
// but Q6_K; only with RADIXRT_GGML_DECODE512=1), 2 .. mid_rows(type) rows on the same tiles by passes of up
// to 8 rows (midrows512.h), more on gemm512.h's; the same bits as the AVX2 tiles, which keep every row count
// on a CPU without AVX-512 VNNI.
// Q4_0 never comes here: q4_0_rows.cpp has its own arithmetic and tiles.
// RADIXRT_DISABLE_AVX512=1 (read once; unset, empty or 0: enabled) keeps the AVX2 tiles, for comparisons;
// RADIXRT_GGML_MID_ROWS=n (read once) replaces every type's mid_rows by n (0: gemm512.h from 3 rows).
// 1 row runs the AVX2 tiles unless RADIXRT_GGML_DECODE512=1 (decode512() below says why).
#include <ATen/ATen.h>
#include <torch/library.h>
#include <cstdlib>
#include <string>
#include "gemm512.h"
#include "gemv512.h"
#include "midrows512.h"
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

// c with its activation sums transposed (Ctx::st) for the types with a minimum; else c as it is. st holds them.
template <class T>
Ctx with_sums(const Ctx& c, int64_t M, std::vector<float>& st) {
  if (!T::MIN) return c;
  const int64_t nb = c.K / 32;
  st.assign(nb * M + 8, 0.0f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < nb; ++b) st[b * M + m] = c.s[m * nb + b];
  Ctx t = c;
  t.st = st.data();
  t.st_ld = M;
  return t;
}

// 1-2 rows (decode): tiles of 2 NZ weight rows, two per register (gemv512.h), split over threads as run()
// does; the tile after next is prefetched. More rows in flight keep more memory reads outstanding: 8 rows
// (NZ = 4) for the 32-element types, 4 for the K-quants (whose decoded heads would not fit the registers).
template <class T, bool K256, int MB>
void gemv(const Ctx& c0) {
  constexpr int NZ = K256 ? 2 : 4;
  std::vector<float> st;
  const Ctx c = K256 ? c0 : with_sums<T>(c0, MB, st);
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

// 3 .. mid_rows rows: every row's pass over a tile of weight rows (midrows512.h), split over threads as run().
template <class T, bool K256>
void mid(const Ctx& c0, int64_t M) {
  std::vector<float> st;
  const Ctx c = K256 ? c0 : with_sums<T>(c0, M, st);
  const int64_t nb = c.K / 32;
  std::vector<int32_t> offs;
  if constexpr (!K256) {
    if (T::OFFSET_SHIFT) {
      offs.resize(M * nb * 8);
      for (int64_t m = 0; m < M; ++m) v512::offsets(c.q + m * c.K, nb, T::OFFSET_SHIFT, offs.data() + m * nb * 8);
    }
  }
  const int64_t grain = M * c.N * c.K < (1 << 16) ? c.N : 16;
  radixrt::parallel_for(0, c.N, grain, [&](int64_t n0, int64_t n1) {
    mid512::rows<T, K256>(c, M, offs.data(), n0, n1);
  });
}

// The most activation rows that run midrows512.h rather than gemm512.h (Q4_1 / Q5_1: rather than the AVX2
// tiles), where the two cross. Measured, one row of T tokens through the whole model (benchmarks/
// step_curve.py, 2 threads): Llama-3.2-1B Q4_K_M t16 134 -> 92 ms, t20 157 -> 147 (three passes), t24 172
// vs 175, t32 208 vs 217. Q8_0 (standalone harness, 8192 x 2048 from memory): 0.9x gemm512.h's time at 16.
// Q4_1 / Q5_1 at every row count: since their minimums share one register per weight-row pair (gemv512.h
// ltile) the mid-row tiles beat the AVX2 ones from 2 rows to 128 (Xeon with AVX-512 VNNI, 2026-12-05,
// 3072 x 1024: Q4_1 113 vs 57 GMAC/s, Q5_1 98 vs 40-49; SmolLM2-135M t48 126 -> 88 ms).
int64_t mid_rows(int64_t type) {
  static const int64_t forced = [] {
    const char* v = std::getenv("RADIXRT_GGML_MID_ROWS");
    return v != nullptr && *v ? std::atoll(v) : -1;
  }();
  if (forced >= 0) return forced;
  if (type == 3 || type == 7) return INT64_MAX;
  return type == 12 || type == 13 || type == 14 ? 20 : 16;
}

bool mid_run(int64_t type, const Ctx& c, int64_t M) {
  switch (type) {
    case 3: mid<Q4_1, false>(c, M); return true;
    case 6: mid<Q5_0, false>(c, M); return true;
    case 7: mid<Q5_1, false>(c, M); return true;
    case 8: mid<Q8_0, false>(c, M); return true;
    case 12: mid<Q4_K, true>(c, M); return true;
    case 13: mid<Q5_K, true>(c, M); return true;
    case 14: mid<Q6_K, true>(c, M); return true;
    default: return false;
  }
}

}  // namespace

bool gemm512_enabled() {
  const char* off = std::getenv("RADIXRT_DISABLE_AVX512");
  static const bool ok = x512::supported() && (off == nullptr || !*off || std::string(off) == "0");
  return ok;
}

// 1 row (decode) on gemv512.h's tiles only with RADIXRT_GGML_DECODE512=1 (read once): by default the AVX2
// streaming tiles (same bits). Measured on this host (2026-12-04, gemv_probe.py, alternating processes, 2
// threads, weights cycled from memory): Q4_K 20-22 GB/s on gemv512.h vs 31-38 on the AVX2 tile, Q8_0 25-27
// vs 32-34; in cache both ~45 (Q4_K). The AVX2 tile reads each weight row in address order, one stream the
// hardware prefetcher follows; gemv512.h's 4-8 interleaved rows leaned on software prefetch, which lost here.
bool decode512() {
  static const bool on = [] {
    const char* v = std::getenv("RADIXRT_GGML_DECODE512");
    return v != nullptr && *v && std::string(v) != "0";
  }();
  return on;
}

bool gemm512_run(int64_t type, const Ctx& c, int64_t M) {
  if (M < 1 || !gemm512_enabled()) return false;
  if (M == 1 && !decode512()) return false;
  // 2 rows too: the K-quants' 2-row tiles here beat gemv512.h's (1B Q4_K_M step 34 -> 30 ms; Q6_K's
  // 512-bit unpacking pays off from 2 rows); the 32-element types' are gemv512.h's own (NZ = 4)
  if (M >= 2 && M <= mid_rows(type) && mid_run(type, c, M)) return true;
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
