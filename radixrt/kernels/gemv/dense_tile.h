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
#include <type_traits>

namespace radixrt::dense {

constexpr int64_t PANEL = 32;  // output columns per weight panel (kernels/gemv/__init__.py: pack_panels)
constexpr int MR = 6;          // rows of x per packed block: 6 x 2 accumulators + 2 weights + 1 broadcast

// 16 weights widened to fp32, into (lo, hi). fp32 and fp16: columns 0-7 and 8-15. bf16 is the top half
// of an fp32, so one 32-byte load and two interleaves with zero widen 16 at once (where a zero-extend and a
// shift per 8 cost twice the instructions: measured, batch-1 bf16 at half of fp16's speed from cache); the
// interleave leaves columns 0-3, 8-11 in lo and 4-7, 12-15 in hi, which order16 puts back in place. The
// FMA chains do not care which lane holds a column, so accumulators stay in that order until stored.
inline void widen16(const float* p, __m256& lo, __m256& hi) { lo = _mm256_loadu_ps(p), hi = _mm256_loadu_ps(p + 8); }
inline void widen16(const at::Half* p, __m256& lo, __m256& hi) {
  lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
}
inline void widen16(const at::BFloat16* p, __m256& lo, __m256& hi) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), z = _mm256_setzero_si256();
  lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v)), hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v));
}
// bf16's lane order <-> column order (its own inverse); nothing for the others.
template <class T>
inline void order16(__m256& lo, __m256& hi) {
  if constexpr (std::is_same_v<T, at::BFloat16>) {
    const __m256 a = _mm256_permute2f128_ps(lo, hi, 0x20), b = _mm256_permute2f128_ps(lo, hi, 0x31);
    lo = a, hi = b;
  }
}
inline float widen1(float v) { return v; }
inline float widen1(at::Half v) { return static_cast<float>(v); }
inline float widen1(at::BFloat16 v) { return static_cast<float>(v); }

// Accumulators are named variables, not an array: GCC keeps an array of __m256 in memory and stores it on
// every k (measured: 30 vs 80 GFLOP/s for oneDNN), where named variables stay in registers.
#define RADIXRT_ACC_INIT(v, off) v = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + (off))

// 32 accumulators' worth of y at y (lane order of T) <- / -> memory.
template <class T>
inline void load32(const float* y, bool first, __m256& a0, __m256& a1, __m256& a2, __m256& a3) {
  RADIXRT_ACC_INIT(a0, 0), RADIXRT_ACC_INIT(a1, 8), RADIXRT_ACC_INIT(a2, 16), RADIXRT_ACC_INIT(a3, 24);
  order16<T>(a0, a1), order16<T>(a2, a3);
}
template <class T>
inline void store32(float* y, __m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  order16<T>(a0, a1), order16<T>(a2, a3);
  _mm256_storeu_ps(y, a0), _mm256_storeu_ps(y + 8, a1), _mm256_storeu_ps(y + 16, a2), _mm256_storeu_ps(y + 24, a3);
}

// Few rows (decode): R <= 2 rows of x (ldx apart, k contiguous) times a whole panel block w [kc, 32] of T,
// widened as it is read. 4 accumulators per row keep 4 chains in flight, which a memory-bound stream needs
// to hide the FMA latency; the weight is read from memory once per R rows.
template <int R, class T>
inline void stream_tile(const float* x, int64_t ldx, const T* w, int64_t kc, float* y, int64_t ldy, bool first) {
  static_assert(R == 1 || R == 2);
  __m256 a0, a1, a2, a3, b0, b1, b2, b3;
  load32<T>(y, first, a0, a1, a2, a3);
  if constexpr (R == 2) load32<T>(y + ldy, first, b0, b1, b2, b3);
  for (int64_t k = 0; k < kc; ++k) {
    __m256 w0, w1, w2, w3;
    widen16(w + k * PANEL, w0, w1), widen16(w + k * PANEL + 16, w2, w3);
    const __m256 xa = _mm256_broadcast_ss(x + k);
    a0 = _mm256_fmadd_ps(xa, w0, a0), a1 = _mm256_fmadd_ps(xa, w1, a1);
    a2 = _mm256_fmadd_ps(xa, w2, a2), a3 = _mm256_fmadd_ps(xa, w3, a3);
    if constexpr (R == 2) {
      const __m256 xb = _mm256_broadcast_ss(x + ldx + k);
      b0 = _mm256_fmadd_ps(xb, w0, b0), b1 = _mm256_fmadd_ps(xb, w1, b1);
      b2 = _mm256_fmadd_ps(xb, w2, b2), b3 = _mm256_fmadd_ps(xb, w3, b3);
    }
  }
  store32<T>(y, a0, a1, a2, a3);
  if constexpr (R == 2) store32<T>(y + ldy, b0, b1, b2, b3);
}

// One row (batch-1 decode) times two panels at once, the second `next` elements after the first: 8 chains
// in flight instead of 4, so that widening and the FMA latency stay hidden under the memory read.
template <class T>
inline void stream_tile_pair(const float* x, const T* w, int64_t next, int64_t kc, float* y) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  const T* v = w + next;
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 xk = _mm256_broadcast_ss(x + k);
    __m256 w0, w1, w2, w3, v0, v1, v2, v3;
    widen16(w + k * PANEL, w0, w1), widen16(w + k * PANEL + 16, w2, w3);
    a0 = _mm256_fmadd_ps(xk, w0, a0), a1 = _mm256_fmadd_ps(xk, w1, a1);
    a2 = _mm256_fmadd_ps(xk, w2, a2), a3 = _mm256_fmadd_ps(xk, w3, a3);
    widen16(v + k * PANEL, v0, v1), widen16(v + k * PANEL + 16, v2, v3);
    b0 = _mm256_fmadd_ps(xk, v0, b0), b1 = _mm256_fmadd_ps(xk, v1, b1);
    b2 = _mm256_fmadd_ps(xk, v2, b2), b3 = _mm256_fmadd_ps(xk, v3, b3);
  }
  store32<T>(y, a0, a1, a2, a3);
  store32<T>(y + PANEL, b0, b1, b2, b3);
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
