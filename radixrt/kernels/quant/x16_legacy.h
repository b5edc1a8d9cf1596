// x16 tiles of the legacy 32-element types (Q4_0, Q4_1, Q5_0, Q5_1; x16_layout.h's Legacy32) on every
// instruction set: AVX-512 VNNI (Tile512, as x16_512.h), AVX2 (Tile256, as x16_avx2.h) and AMX (Amx, as
// x16_amx.h). A block's 4 qs planes unpack to 8 vectors of unsigned weights (the low nibbles pair with
// activation dwords 0..3, the high with 4..7; the fifth bit from the regrouped qh plane by one shift and
// mask), then the integer sum per lane is S = sum q y started at -Z Y (the zero point, exact in int32:
// |S| <= 31 x 127 x 32 + 16 x 127 x 32) and the fold is x16_layout.h's, the same operations per lane on every
// path, so the bits are the same (tests/kernels/test_x16.py).
//
// Why a header of its own: x16_512.h, x16_avx2.h and x16_amx.h hold the K-quants and Q8_0 near 300 lines each.
#pragma once
#include <immintrin.h>
#include <cstdint>
#include "x16_amx.h"
#include "x16_avx2.h"
#include "x16_layout.h"

namespace radixrt {
namespace ggml {
namespace x16 {

// Plane t of a block: lo = elements 4t .. 4t + 3 of each row (activation dword t), hi = 16 + 4t .. (dword
// 4 + t). qh: the block's fifth-bit plane (HAS_QH), bit t of a byte is lo's, bit 4 + t hi's; a 16-bit shift
// never carries another byte's bit into bit 4 here (from bits t, 4 + t of the same byte).
template <class T>
RADIXRT_X16_512 inline void legacy_plane512(const uint8_t* b, int t, __m512i qh, __m512i& lo, __m512i& hi) {
  const __m512i v = _mm512_loadu_si512(b + T::QS + 64 * t), low = _mm512_set1_epi8(0x0F);
  lo = _mm512_and_si512(v, low);
  hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
  if constexpr (T::HAS_QH) {
    const __m512i b4 = _mm512_set1_epi8(0x10);
    lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi16(qh, 4 - t), b4));
    hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_srli_epi16(qh, t), b4));
  }
}

// The float fold of one block for one activation row: dot = S (exact), ysum = Y, dy = the row's block scale.
template <class T>
RADIXRT_X16_512 inline __m512 legacy_fold512(__m512 acc, __m512i dot, __m512 dw, __m512 dm, float dy, int32_t ysum) {
  const __m512 vdy = _mm512_set1_ps(dy);
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, vdy), acc);
  if constexpr (T::MIN) acc = _mm512_fmadd_ps(_mm512_set1_ps((float)ysum), _mm512_mul_ps(dm, vdy), acc);
  return acc;
}

template <class T>
struct Legacy512 {
  template <int MB>
  RADIXRT_X16_512 __attribute__((always_inline)) static void block(const uint8_t* b, const XCtx& c, int64_t m0, int64_t s, __m512 acc[MB]) {
    const int64_t nb = c.K / 32;
    const int8_t* y[MB];
    __m512i dot[MB];
    for (int m = 0; m < MB; ++m) {
      y[m] = c.q + (m0 + m) * c.K + s * 32;
      dot[m] = _mm512_set1_epi32(-T::ZERO * c.ysum[(m0 + m) * nb + s]);  // subtracts Z sum y (0 for _1 types)
    }
    const __m512i qh = T::HAS_QH ? _mm512_loadu_si512(b + T::QH) : _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) {
      __m512i lo, hi;
      legacy_plane512<T>(b, t, qh, lo, hi);
      for (int m = 0; m < MB; ++m) {
        dot[m] = _mm512_dpbusd_epi32(dot[m], lo, bcast4(y[m] + 4 * t));
        dot[m] = _mm512_dpbusd_epi32(dot[m], hi, bcast4(y[m] + 16 + 4 * t));
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
    const __m512 dm = T::MIN ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + T::MN))) : dw;
    for (int m = 0; m < MB; ++m) {
      const int64_t a = (m0 + m) * nb + s;
      acc[m] = legacy_fold512<T>(acc[m], dot[m], dw, dm, c.d[a], c.ysum[a]);
    }
  }
};

template <>
struct Tile512<Q4_0> : Legacy512<Q4_0> {};
template <>
struct Tile512<Q4_1> : Legacy512<Q4_1> {};
template <>
struct Tile512<Q5_0> : Legacy512<Q5_0> {};
template <>
struct Tile512<Q5_1> : Legacy512<Q5_1> {};

// AVX2: rows 8h .. 8h + 7 (the h-th 32 bytes of each plane), the same sums by maddubs + madd (no int16
// saturation: 2 x 31 x 127 < 2^15) and the same fold.
template <class T>
struct Legacy256 {
  template <int MB>
  static void block(const uint8_t* b, int h, const XCtx& c, int64_t m0, int64_t s, __m256 acc[MB]) {
    const int64_t nb = c.K / 32;
    const int8_t* y[MB];
    __m256i dot[MB];
    for (int m = 0; m < MB; ++m) {
      y[m] = c.q + (m0 + m) * c.K + s * 32;
      dot[m] = _mm256_set1_epi32(-T::ZERO * c.ysum[(m0 + m) * nb + s]);
    }
    const __m256i low = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
    const __m256i qh = T::HAS_QH ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + T::QH + 32 * h))
                                 : _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + T::QS + 64 * t + 32 * h));
      __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
      if constexpr (T::HAS_QH) {
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(qh, 4 - t), b4));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_srli_epi16(qh, t), b4));
      }
      for (int m = 0; m < MB; ++m) {
        dot[m] = dot4(dot[m], lo, bcast4_256(y[m] + 4 * t));
        dot[m] = dot4(dot[m], hi, bcast4_256(y[m] + 16 + 4 * t));
      }
    }
    const __m256 dw = fp16x8(b + 16 * h), dm = T::MIN ? fp16x8(b + T::MN + 16 * h) : dw;
    for (int m = 0; m < MB; ++m) {
      const int64_t a = (m0 + m) * nb + s;
      const __m256 dy = _mm256_set1_ps(c.d[a]);
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[m]), _mm256_mul_ps(dw, dy), acc[m]);
      if constexpr (T::MIN) acc[m] = _mm256_fmadd_ps(_mm256_set1_ps((float)c.ysum[a]), _mm256_mul_ps(dm, dy), acc[m]);
    }
  }
};

template <>
struct Tile256<Q4_0> : Legacy256<Q4_0> {};
template <>
struct Tile256<Q4_1> : Legacy256<Q4_1> {};
template <>
struct Tile256<Q5_0> : Legacy256<Q5_0> {};
template <>
struct Tile256<Q5_1> : Legacy256<Q5_1> {};

// AMX: a batch is 4 blocks, s .. s + 3, as Q8_0's; each block's planes unpacked to its B tile (8 rows of 64
// bytes: the 4 low-nibble planes, elements 0..15, then the 4 high, 16..31, the activation block's order).
template <class T>
struct AmxLegacy {
  static constexpr int KA = 32, BATCHES = 1;  // per 4 blocks
  RADIXRT_X16_AMX static void unpack(const uint8_t* b, int, uint8_t (*planes)[512]) {
    for (int i = 0; i < 4; ++i) {
      const uint8_t* bi = b + i * T::BYTES;
      const __m512i qh = T::HAS_QH ? _mm512_loadu_si512(bi + T::QH) : _mm512_setzero_si512();
      for (int t = 0; t < 4; ++t) {
        __m512i lo, hi;
        legacy_plane512<T>(bi, t, qh, lo, hi);
        _mm512_store_si512(planes[i] + 64 * t, lo);
        _mm512_store_si512(planes[i] + 64 * (4 + t), hi);
      }
    }
  }
  static void a_rows(const XCtx& c, int64_t m0, int64_t s, int, const int8_t* a[4]) {
    for (int i = 0; i < 4; ++i) a[i] = c.q + m0 * c.K + (s + i) * 32;
  }
  RADIXRT_X16_AMX static void fold(const uint8_t* b, const XCtx& c, int64_t m0, int M, int64_t s, int,
                                   const int32_t (*dots)[256], AmxScratch& w) {
    const int64_t nb = c.K / 32;
    for (int i = 0; i < 4; ++i) {
      const uint8_t* bi = b + i * T::BYTES;
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bi)));
      const __m512 dm = T::MIN ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bi + T::MN))) : dw;
      for (int m = 0; m < M; ++m) {
        const int64_t r = (m0 + m) * nb + s + i;
        const __m512i dot = _mm512_add_epi32(_mm512_load_si512(dots[i] + 16 * m), _mm512_set1_epi32(-T::ZERO * c.ysum[r]));
        _mm512_store_ps(w.acc[m], legacy_fold512<T>(_mm512_load_ps(w.acc[m]), dot, dw, dm, c.d[r], c.ysum[r]));
      }
    }
  }
};

template <>
struct Amx<Q4_0> : AmxLegacy<Q4_0> {};
template <>
struct Amx<Q4_1> : AmxLegacy<Q4_1> {};
template <>
struct Amx<Q5_0> : AmxLegacy<Q5_0> {};
template <>
struct Amx<Q5_1> : AmxLegacy<Q5_1> {};

}  // namespace x16
}  // namespace ggml
}  // namespace radixrt
