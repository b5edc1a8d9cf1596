// x16 tiles on AVX2 (any CPU the kernels run on): half a group (8 weight rows, one ymm of outputs) against MB
// activation rows, over all of K. Where x16_512.h has vpdpbusd, this has maddubs then madd against ones: the
// same exact int32 sums of 4 products per lane (no int16 saturation: 2 x 63 x 128 < 2^15 for the unsigned
// types; Q8_0 multiplies |w| by y carrying w's sign, 2 x 128 x 127 < 2^15). The scale products and the
// float fold are the same operations per lane as x16_512.h's, so the bits are the same.
#pragma once
#include <immintrin.h>
#include <cstdint>
#include "block_io.h"
#include "x16_layout.h"

namespace radixrt {
namespace ggml {
namespace x16 {

inline __m256i bcast4_256(const int8_t* p) {
  return _mm256_set1_epi32((int)load_u32(reinterpret_cast<const uint8_t*>(p)));
}

// sum of each 4 products of unsigned w and signed y, per int32 lane
inline __m256i dot4(__m256i acc, __m256i w, __m256i y) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, y), _mm256_set1_epi16(1)));
}

template <int from, int to>
inline __m256i shift256(__m256i v) {
  if constexpr (from > to) return _mm256_srli_epi16(v, from - to);
  else if constexpr (from < to) return _mm256_slli_epi16(v, to - from);
  else return v;
}

inline __m256 fp16x8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

template <class T>
struct Tile256;

template <class T, int J, int MB>
inline void kq_sub256(const uint8_t* b, int h, const int8_t* const y[MB], __m256i isum[MB]) {
  __m256i dot[MB];
  for (int m = 0; m < MB; ++m) dot[m] = _mm256_setzero_si256();
  for (int t = 0; t < 8; ++t) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + T::QS + (J >> 1) * 512 + 64 * t + 32 * h));
    __m256i w = _mm256_and_si256(J & 1 ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(0x0F));
    if constexpr (T::HAS_QH) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + T::QH + 64 * t + 32 * h));
      w = _mm256_or_si256(w, _mm256_and_si256(shift256<J, 4>(qh), _mm256_set1_epi8(0x10)));
    }
    for (int m = 0; m < MB; ++m) dot[m] = dot4(dot[m], w, bcast4_256(y[m] + 32 * J + 4 * t));
  }
  const __m256i sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 64 + 16 * J + 8 * h)));
  for (int m = 0; m < MB; ++m) isum[m] = _mm256_add_epi32(isum[m], _mm256_mullo_epi32(dot[m], sc));
}

template <class T>
struct KMin256 {
  template <int MB>
  static void block(const uint8_t* b, int h, const XCtx& c, int64_t m0, int64_t s, __m256 acc[MB]) {
    const int64_t ns = c.K / 256;
    const int8_t* y[MB];
    __m256i isum[MB];
    for (int m = 0; m < MB; ++m) {
      y[m] = c.q + (m0 + m) * c.K + s * 256;
      isum[m] = _mm256_setzero_si256();
    }
    kq_sub256<T, 0, MB>(b, h, y, isum);
    kq_sub256<T, 1, MB>(b, h, y, isum);
    kq_sub256<T, 2, MB>(b, h, y, isum);
    kq_sub256<T, 3, MB>(b, h, y, isum);
    kq_sub256<T, 4, MB>(b, h, y, isum);
    kq_sub256<T, 5, MB>(b, h, y, isum);
    kq_sub256<T, 6, MB>(b, h, y, isum);
    kq_sub256<T, 7, MB>(b, h, y, isum);
    const __m256 dw = fp16x8(b + 16 * h), dm = fp16x8(b + 32 + 16 * h);
    __m256i mn[4];
    for (int i = 0; i < 4; ++i)
      mn[i] = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192 + 32 * i + 16 * h)));
    for (int m = 0; m < MB; ++m) {
      const int32_t* yp = c.ypair + ((m0 + m) * ns + s) * 4;
      __m256i corr = _mm256_setzero_si256();
      for (int i = 0; i < 4; ++i) corr = _mm256_add_epi32(corr, _mm256_madd_epi16(mn[i], _mm256_set1_epi32(yp[i])));
      const __m256 dy = _mm256_set1_ps(c.d[(m0 + m) * ns + s]);
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[m]), _mm256_mul_ps(dw, dy), acc[m]);
      acc[m] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(corr), _mm256_mul_ps(dm, dy), acc[m]);
    }
  }
};

template <>
struct Tile256<Q4_K> : KMin256<Q4_K> {};
template <>
struct Tile256<Q5_K> : KMin256<Q5_K> {};

template <int H, int K, int MB>
inline void q6_sub256(const uint8_t* b, int h, const int8_t* const y[MB], __m256i isum[MB]) {
  constexpr int J = 4 * H + K;
  const __m256i scp =
      _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + Q6_K::SC + 32 * J + 16 * h)));
  const __m256i sc[2] = {_mm256_srai_epi32(_mm256_slli_epi32(scp, 16), 16), _mm256_srai_epi32(scp, 16)};
  const uint8_t* ql = b + Q6_K::QL + (2 * H + (K & 1)) * 512 + 32 * h;
  const uint8_t* qh = b + Q6_K::QH + H * 512 + 32 * h;
  for (int half = 0; half < 2; ++half) {
    __m256i dot[MB];
    for (int m = 0; m < MB; ++m) dot[m] = _mm256_setzero_si256();
    for (int t = 4 * half; t < 4 * half + 4; ++t) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * t));
      const __m256i hv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 64 * t));
      const __m256i lo4 = _mm256_and_si256(K < 2 ? v : _mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
      const __m256i w = _mm256_or_si256(lo4, _mm256_and_si256(shift256<2 * K, 4>(hv), _mm256_set1_epi8(0x30)));
      for (int m = 0; m < MB; ++m) dot[m] = dot4(dot[m], w, bcast4_256(y[m] + 32 * J + 4 * t));
    }
    for (int m = 0; m < MB; ++m) isum[m] = _mm256_add_epi32(isum[m], _mm256_mullo_epi32(dot[m], sc[half]));
  }
}


template <>
struct Tile256<Q6_K> {
  template <int MB>
  static void block(const uint8_t* b, int h, const XCtx& c, int64_t m0, int64_t s, __m256 acc[MB]) {
    const int64_t ns = c.K / 256;
    const int8_t* y[MB];
    __m256i isum[MB];
    for (int m = 0; m < MB; ++m) {
      y[m] = c.q + (m0 + m) * c.K + s * 256;
      isum[m] = _mm256_setzero_si256();
    }
    q6_sub256<0, 0, MB>(b, h, y, isum);
    q6_sub256<0, 1, MB>(b, h, y, isum);
    q6_sub256<0, 2, MB>(b, h, y, isum);
    q6_sub256<0, 3, MB>(b, h, y, isum);
    q6_sub256<1, 0, MB>(b, h, y, isum);
    q6_sub256<1, 1, MB>(b, h, y, isum);
    q6_sub256<1, 2, MB>(b, h, y, isum);
    q6_sub256<1, 3, MB>(b, h, y, isum);
    const __m256 dw = fp16x8(b + 16 * h);
    for (int m = 0; m < MB; ++m) {
      const uint8_t* bs = reinterpret_cast<const uint8_t*>(c.bsums + ((m0 + m) * ns + s) * 16);
      __m256i corr = _mm256_setzero_si256();
      for (int i = 0; i < 8; ++i) {
        const __m256i scp =
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + Q6_K::SC + 32 * i + 16 * h)));
        corr = _mm256_add_epi32(corr, _mm256_madd_epi16(scp, _mm256_set1_epi32((int)load_u32(bs + 4 * i))));
      }
      const __m256i tot = _mm256_sub_epi32(isum[m], _mm256_slli_epi32(corr, 5));
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot), _mm256_mul_ps(dw, _mm256_set1_ps(c.d[(m0 + m) * ns + s])), acc[m]);
    }
  }
};

template <>
struct Tile256<Q8_0> {
  template <int MB>
  static void block(const uint8_t* b, int h, const XCtx& c, int64_t m0, int64_t s, __m256 acc[MB]) {
    const int64_t nb = c.K / 32;
    __m256i dot[MB];
    const int8_t* y[MB];
    for (int m = 0; m < MB; ++m) {
      y[m] = c.q + (m0 + m) * c.K + s * 32;
      dot[m] = _mm256_setzero_si256();
    }
    for (int t = 0; t < 8; ++t) {
      // the stored w + 128 back to w; |w| times y carrying w's sign: the signed products, exactly
      const __m256i w = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + Q8_0::QS + 64 * t + 32 * h)),
                                         _mm256_set1_epi8((char)0x80));
      const __m256i aw = _mm256_abs_epi8(w);
      for (int m = 0; m < MB; ++m) dot[m] = dot4(dot[m], aw, _mm256_sign_epi8(bcast4_256(y[m] + 4 * t), w));
    }
    const __m256 dw = fp16x8(b + 16 * h);
    for (int m = 0; m < MB; ++m)
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[m]), _mm256_mul_ps(dw, _mm256_set1_ps(c.d[(m0 + m) * nb + s])),
                               acc[m]);
  }
};

// Rows 8h .. 8h + 7 of group g against activation rows [m0, m0 + MB), all of K.
template <class T, int MB>
void tile256(const XCtx& c, int64_t g, int h, int64_t m0) {
  const int64_t nb = c.K / T::QK;
  const uint8_t* w = c.W + g * nb * T::BYTES;
  __m256 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t s = 0; s < nb; ++s) Tile256<T>::template block<MB>(w + s * T::BYTES, h, c, m0, s, acc);
  for (int m = 0; m < MB; ++m) _mm256_storeu_ps(c.out + (m0 + m) * c.N + 16 * g + 8 * h, acc[m]);
}

}  // namespace x16
}  // namespace ggml
}  // namespace radixrt
