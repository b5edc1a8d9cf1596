// The register tiles of radixrt_gemv's dense product (dense_gemm.cpp): y (+)= x @ w over one K block.
//
// Every tile computes each output as one FMA chain in k order, acc = fma(x[k], w[k], acc), starting from +0
// at the first K block and from the stored partial sum (exact: fp32 in, fp32 out) at later ones. The
// tiles differ only in how many outputs they hold at once and where they read x and w from, never in the
// order of the chain, so any tile, any row count and any thread gives a row the same bits. The weight's
// fp16 and bf16 values widen to fp32 exactly, so widening on the fly or into a buffer first is the same too.
#pragma once
#include <ATen/ATen.h>
#include <immintrin.h>
#include <cstdint>

namespace radixrt::dense {

constexpr int64_t PANEL = 32;  // output columns per weight panel (kernels/gemv/__init__.py: pack_panels)
constexpr int MR = 6;          // rows of x per packed block: 6 x 2 accumulators + 2 weights + 1 broadcast

inline __m256 widen8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 widen8(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// bf16 is the top half of an fp32: zero-extend to 32 bits, shift into place.
inline __m256 widen8(const at::BFloat16* p) {
  const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}
inline float widen1(float v) { return v; }
inline float widen1(at::Half v) { return static_cast<float>(v); }
inline float widen1(at::BFloat16 v) { return static_cast<float>(v); }

// The accumulators are named variables, not an array: GCC keeps an array of __m256 in memory and stores
// it on every k (measured: 30 vs 80 GFLOP/s for oneDNN), where named variables stay in registers.
#define RADIXRT_ACC_INIT(v, off) v = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + (off))

// Few rows (decode): R <= 2 rows of x (ldx apart, k contiguous) times a whole panel block w [kc, 32] of T,
// widened as it is read. 4 accumulators per row keep 4 chains in flight, which a memory-bound stream needs
// to hide the FMA latency; the weight is read from memory once per R rows.
template <int R, class T>
inline void stream_tile(const float* x, int64_t ldx, const T* w, int64_t kc, float* y, int64_t ldy, bool first) {
  static_assert(R == 1 || R == 2);
  __m256 a0, a1, a2, a3, b0, b1, b2, b3;
  RADIXRT_ACC_INIT(a0, 0); RADIXRT_ACC_INIT(a1, 8); RADIXRT_ACC_INIT(a2, 16); RADIXRT_ACC_INIT(a3, 24);
  if constexpr (R == 2) {
    RADIXRT_ACC_INIT(b0, ldy); RADIXRT_ACC_INIT(b1, ldy + 8); RADIXRT_ACC_INIT(b2, ldy + 16);
    RADIXRT_ACC_INIT(b3, ldy + 24);
  }
  for (int64_t k = 0; k < kc; ++k) {
    const T* wk = w + k * PANEL;
    const __m256 w0 = widen8(wk), w1 = widen8(wk + 8), w2 = widen8(wk + 16), w3 = widen8(wk + 24);
    const __m256 xa = _mm256_broadcast_ss(x + k);
    a0 = _mm256_fmadd_ps(xa, w0, a0), a1 = _mm256_fmadd_ps(xa, w1, a1);
    a2 = _mm256_fmadd_ps(xa, w2, a2), a3 = _mm256_fmadd_ps(xa, w3, a3);
    if constexpr (R == 2) {
      const __m256 xb = _mm256_broadcast_ss(x + ldx + k);
      b0 = _mm256_fmadd_ps(xb, w0, b0), b1 = _mm256_fmadd_ps(xb, w1, b1);
      b2 = _mm256_fmadd_ps(xb, w2, b2), b3 = _mm256_fmadd_ps(xb, w3, b3);
    }
  }
  _mm256_storeu_ps(y, a0), _mm256_storeu_ps(y + 8, a1), _mm256_storeu_ps(y + 16, a2), _mm256_storeu_ps(y + 24, a3);
  if constexpr (R == 2) {
    float* yb = y + ldy;
    _mm256_storeu_ps(yb, b0), _mm256_storeu_ps(yb + 8, b1), _mm256_storeu_ps(yb + 16, b2);
    _mm256_storeu_ps(yb + 24, b3);
  }
}

// Many rows: R <= MR rows of a packed x block (xp [kc, MR], the MR values of one k adjacent) times a half
// panel w [kc, 16] fp32 (rows ldw apart). Per k: 2 weight loads and R broadcasts feed 2R FMAs, so at R = 6
// the two FMA pipes, not the loads, set the pace. Packing x keeps its 6 rows in one stream: 6 rows K floats
// apart would share L1 sets when K is a multiple of 1024.
#define RADIXRT_ROW_INIT(i)                                                        \
  if constexpr (R > i) {                                                           \
    RADIXRT_ACC_INIT(a##i, i * ldy), RADIXRT_ACC_INIT(b##i, i * ldy + 8);          \
  }
#define RADIXRT_ROW_FMA(i)                                                         \
  if constexpr (R > i) {                                                           \
    const __m256 x##i = _mm256_broadcast_ss(xk + i);                               \
    a##i = _mm256_fmadd_ps(x##i, w0, a##i), b##i = _mm256_fmadd_ps(x##i, w1, b##i); \
  }
#define RADIXRT_ROW_STORE(i)                                                       \
  if constexpr (R > i) {                                                           \
    _mm256_storeu_ps(y + i * ldy, a##i), _mm256_storeu_ps(y + i * ldy + 8, b##i);  \
  }
template <int R>
inline void block_tile(const float* xp, const float* w, int64_t ldw, int64_t kc, float* y, int64_t ldy, bool first) {
  static_assert(R >= 1 && R <= MR);
  __m256 a0, a1, a2, a3, a4, a5, b0, b1, b2, b3, b4, b5;
  RADIXRT_ROW_INIT(0) RADIXRT_ROW_INIT(1) RADIXRT_ROW_INIT(2) RADIXRT_ROW_INIT(3) RADIXRT_ROW_INIT(4)
  RADIXRT_ROW_INIT(5)
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 w0 = _mm256_loadu_ps(w + k * ldw), w1 = _mm256_loadu_ps(w + k * ldw + 8);
    const float* xk = xp + k * MR;
    RADIXRT_ROW_FMA(0) RADIXRT_ROW_FMA(1) RADIXRT_ROW_FMA(2) RADIXRT_ROW_FMA(3) RADIXRT_ROW_FMA(4)
    RADIXRT_ROW_FMA(5)
  }
  RADIXRT_ROW_STORE(0) RADIXRT_ROW_STORE(1) RADIXRT_ROW_STORE(2) RADIXRT_ROW_STORE(3) RADIXRT_ROW_STORE(4)
  RADIXRT_ROW_STORE(5)
}
#undef RADIXRT_ROW_INIT
#undef RADIXRT_ROW_FMA
#undef RADIXRT_ROW_STORE
#undef RADIXRT_ACC_INIT

inline void block_rows(int rows, const float* xp, const float* w, int64_t ldw, int64_t kc, float* y, int64_t ldy,
                       bool first) {
  switch (rows) {
    case 1: return block_tile<1>(xp, w, ldw, kc, y, ldy, first);
    case 2: return block_tile<2>(xp, w, ldw, kc, y, ldy, first);
    case 3: return block_tile<3>(xp, w, ldw, kc, y, ldy, first);
    case 4: return block_tile<4>(xp, w, ldw, kc, y, ldy, first);
    case 5: return block_tile<5>(xp, w, ldw, kc, y, ldy, first);
    default: return block_tile<6>(xp, w, ldw, kc, y, ldy, first);
  }
}

}  // namespace radixrt::dense
