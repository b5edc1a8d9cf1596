// The many-row dense product (dense_gemm.cpp) on AVX-512: the same arithmetic as dense_tile.h's block_tile,
// in 16-lane registers and taller row blocks.
//
// Same bits: every output is still one fp32 FMA chain in k order, from +0 at the first K block and from the
// stored partial sum at later ones (exact), the weight widened exactly to fp32. A zmm FMA is 16 independent
// fp32 FMAs, each rounded as the ymm one is, so which register width holds a column changes nothing; the
// AVX2 tiles (RADIXRT_DISABLE_AVX512=1, or a CPU without AVX-512F) give every row the same bits.
//
// Shape: a whole 32-column panel is two zmm per row, and MR512 rows of a packed x block run at once:
// 2 x MR512 accumulators + 2 weights, the x values broadcast from memory inside the FMA ({1to16}). Per k,
// 2 weight loads feed 2 x MR512 FMAs. The weight block is widened once per (panel, K block) into a dense
// [kc, 32] fp32 buffer in column order (bf16 put back in order there), which every row block then sweeps.
#pragma once
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include "dense_tile.h"

#define RADIXRT_D512 __attribute__((target("avx2,fma,f16c,avx512f")))

namespace radixrt::dense {

constexpr int MR512 = 12;  // rows of x per packed block on AVX-512 (2 x 12 accumulators of the 32 zmm)

// The CPU has AVX-512F and RADIXRT_DISABLE_AVX512 is unset, empty or 0 (read once).
inline bool avx512_enabled() {
  static const bool ok = [] {
    __builtin_cpu_init();
    const char* off = std::getenv("RADIXRT_DISABLE_AVX512");
    return __builtin_cpu_supports("avx512f") && (off == nullptr || !*off || std::string(off) == "0");
  }();
  return ok;
}

// Panel block w [kc, PANEL] of T -> out [kc, PANEL] fp32, columns in order.
template <class T>
RADIXRT_D512 inline void widen_panel(const T* w, int64_t kc, float* out) {
  for (int64_t k = 0; k < kc; ++k)
    for (int h = 0; h < 2; ++h) {
      __m256 lo, hi;
      widen16(w + k * PANEL + 16 * h, lo, hi);
      order16<T>(lo, hi);
      _mm256_store_ps(out + k * PANEL + 16 * h, lo), _mm256_store_ps(out + k * PANEL + 16 * h + 8, hi);
    }
}

#define RADIXRT_Z_INIT(i)                                                                  \
  if constexpr (R > i) {                                                                   \
    a##i = first ? _mm512_setzero_ps() : _mm512_loadu_ps(y + i * ldy);                     \
    b##i = first ? _mm512_setzero_ps() : _mm512_loadu_ps(y + i * ldy + 16);                \
  }
#define RADIXRT_Z_FMA(i)                                                                   \
  if constexpr (R > i) {                                                                   \
    const __m512 x##i = _mm512_set1_ps(xk[i]);                                             \
    a##i = _mm512_fmadd_ps(x##i, w0, a##i), b##i = _mm512_fmadd_ps(x##i, w1, b##i);         \
  }
#define RADIXRT_Z_STORE(i)                                                                 \
  if constexpr (R > i) {                                                                   \
    _mm512_storeu_ps(y + i * ldy, a##i), _mm512_storeu_ps(y + i * ldy + 16, b##i);         \
  }
#define RADIXRT_Z_ROWS(M)                                                                  \
  M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11)

// R <= MR512 rows of a packed x block (xp [kc, MR512]) times a widened panel block w [kc, PANEL] fp32.
template <int R>
RADIXRT_D512 inline void block_tile512(const float* xp, const float* w, int64_t kc, float* y, int64_t ldy,
                                       bool first) {
  static_assert(R >= 1 && R <= MR512 && MR512 == 12);
  __m512 a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11;
  RADIXRT_Z_ROWS(RADIXRT_Z_INIT)
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 w0 = _mm512_load_ps(w + k * PANEL), w1 = _mm512_load_ps(w + k * PANEL + 16);
    const float* xk = xp + k * MR512;
    RADIXRT_Z_ROWS(RADIXRT_Z_FMA)
  }
  RADIXRT_Z_ROWS(RADIXRT_Z_STORE)
}
#undef RADIXRT_Z_INIT
#undef RADIXRT_Z_FMA
#undef RADIXRT_Z_STORE
#undef RADIXRT_Z_ROWS

RADIXRT_D512 inline void block_rows512(int rows, const float* xp, const float* w, int64_t kc, float* y,
                                       int64_t ldy, bool first) {
  switch (rows) {
    case 1: return block_tile512<1>(xp, w, kc, y, ldy, first);
    case 2: return block_tile512<2>(xp, w, kc, y, ldy, first);
    case 3: return block_tile512<3>(xp, w, kc, y, ldy, first);
    case 4: return block_tile512<4>(xp, w, kc, y, ldy, first);
    case 5: return block_tile512<5>(xp, w, kc, y, ldy, first);
    case 6: return block_tile512<6>(xp, w, kc, y, ldy, first);
    case 7: return block_tile512<7>(xp, w, kc, y, ldy, first);
    case 8: return block_tile512<8>(xp, w, kc, y, ldy, first);
    case 9: return block_tile512<9>(xp, w, kc, y, ldy, first);
    case 10: return block_tile512<10>(xp, w, kc, y, ldy, first);
    case 11: return block_tile512<11>(xp, w, kc, y, ldy, first);
    default: return block_tile512<12>(xp, w, kc, y, ldy, first);
  }
}

// Full panels [p0, p1) of w [.., K] (panel p at w + p * K * PANEL) times M rows packed in xp
// [ceil(M / MR512), K, MR512] -> y [M, ldy] (panel p's outputs at column p * PANEL); K blocks of kcb <= 256,
// row chunks of mcb blocks. K blocks outermost, then row chunks, so a chunk's x block (mcb x 12 x kcb floats)
// stays in L2 across every panel, while each panel block is widened once per chunk into L1.
template <class T>
RADIXRT_D512 void panels512(const float* xp, int64_t M, int64_t K, const T* w, int64_t p0, int64_t p1, float* y,
                            int64_t ldy, int64_t kcb, int64_t mcb) {
  alignas(64) float buf[256 * PANEL];
  const int64_t blocks = (M + MR512 - 1) / MR512;
  for (int64_t k0 = 0; k0 < K; k0 += kcb) {
    const int64_t kc = std::min(kcb, K - k0);
    for (int64_t c0 = 0; c0 < blocks; c0 += mcb)
      for (int64_t p = p0; p < p1; ++p) {
        widen_panel(w + p * K * PANEL + k0 * PANEL, kc, buf);
        for (int64_t b = c0; b < std::min(blocks, c0 + mcb); ++b)
          block_rows512(static_cast<int>(std::min<int64_t>(MR512, M - b * MR512)),
                        xp + b * K * MR512 + k0 * MR512, buf, kc, y + b * MR512 * ldy + p * PANEL, ldy, k0 == 0);
      }
  }
}

}  // namespace radixrt::dense
