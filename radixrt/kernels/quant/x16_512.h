// x16 tiles on AVX-512 VNNI: one group of 16 weight rows (one zmm of outputs) against MB activation rows, over
// all of K. Per block, each 64-byte plane is loaded and unpacked once (and / shift / or) and then used by every
// activation row of the tile: one vpdpbusd per row against 4 of that row's int8 activations broadcast. The
// integer sums and the float fold are x16_layout.h's arithmetic, lane by lane, so the bits equal the AVX2
// tiles' (x16_avx2.h) and the torch twin's.
//
// Registers at MB = 8: acc[8] + isum[8] + dot[8] zmm beside the unpacked plane and the broadcast.
#pragma once
#include <immintrin.h>
#include <cstdint>
#include "block_io.h"
#include "x16_layout.h"

#define RADIXRT_X16_512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

namespace radixrt {
namespace ggml {
namespace x16 {

RADIXRT_X16_512 inline __m512i bcast4(const int8_t* p) {
  return _mm512_set1_epi32((int)load_u32(reinterpret_cast<const uint8_t*>(p)));
}

// bit `from` of every byte moved to bit `to` (the other bits are junk: callers mask)
template <int from, int to>
RADIXRT_X16_512 inline __m512i shift512(__m512i v) {
  if constexpr (from > to) return _mm512_srli_epi16(v, from - to);
  else if constexpr (from < to) return _mm512_slli_epi16(v, to - from);
  else return v;
}

template <class T>
struct Tile512;

// Q4_K and Q5_K
template <class T, int J>
RADIXRT_X16_512 inline __m512i kq_plane(const uint8_t* b, int t) {
  const __m512i v = _mm512_loadu_si512(b + T::QS + (J >> 1) * 512 + 64 * t);
  __m512i w = _mm512_and_si512(J & 1 ? _mm512_srli_epi16(v, 4) : v, _mm512_set1_epi8(0x0F));
  if constexpr (T::HAS_QH) {
    const __m512i qh = _mm512_loadu_si512(b + T::QH + 64 * t);
    w = _mm512_or_si512(w, _mm512_and_si512(shift512<J, 4>(qh), _mm512_set1_epi8(0x10)));
  }
  return w;
}

template <class T, int J, int MB>
RADIXRT_X16_512 __attribute__((always_inline)) inline void kq_sub(const uint8_t* b, const int8_t* const y[MB], __m512i isum[MB]) {
  __m512i dot[MB];
  for (int m = 0; m < MB; ++m) dot[m] = _mm512_setzero_si512();
  for (int t = 0; t < 8; ++t) {
    const __m512i w = kq_plane<T, J>(b, t);
    for (int m = 0; m < MB; ++m) dot[m] = _mm512_dpbusd_epi32(dot[m], w, bcast4(y[m] + 32 * J + 4 * t));
  }
  const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 64 + 16 * J)));
  for (int m = 0; m < MB; ++m) isum[m] = _mm512_add_epi32(isum[m], _mm512_mullo_epi32(dot[m], sc));
}

template <class T>
struct KMin512 {
  template <int MB>
  RADIXRT_X16_512 __attribute__((always_inline)) static void block(const uint8_t* b, const XCtx& c, int64_t m0, int64_t s, __m512 acc[MB]) {
    const int64_t ns = c.K / 256;
    const int8_t* y[MB];
    __m512i isum[MB];
    for (int m = 0; m < MB; ++m) {
      y[m] = c.q + (m0 + m) * c.K + s * 256;
      isum[m] = _mm512_setzero_si512();
    }
    kq_sub<T, 0, MB>(b, y, isum);
    kq_sub<T, 1, MB>(b, y, isum);
    kq_sub<T, 2, MB>(b, y, isum);
    kq_sub<T, 3, MB>(b, y, isum);
    kq_sub<T, 4, MB>(b, y, isum);
    kq_sub<T, 5, MB>(b, y, isum);
    kq_sub<T, 6, MB>(b, y, isum);
    kq_sub<T, 7, MB>(b, y, isum);
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
    const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32)));
    __m512i mn[4];
    for (int i = 0; i < 4; ++i)
      mn[i] = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 192 + 32 * i)));
    for (int m = 0; m < MB; ++m) {
      const int32_t* yp = c.ypair + ((m0 + m) * ns + s) * 4;
      __m512i corr = _mm512_setzero_si512();
      for (int i = 0; i < 4; ++i) corr = _mm512_dpwssd_epi32(corr, mn[i], _mm512_set1_epi32(yp[i]));
      const __m512 dy = _mm512_set1_ps(c.d[(m0 + m) * ns + s]);
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[m]), _mm512_mul_ps(dw, dy), acc[m]);
      acc[m] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(corr), _mm512_mul_ps(dm, dy), acc[m]);
    }
  }
};

template <>
struct Tile512<Q4_K> : KMin512<Q4_K> {};
template <>
struct Tile512<Q5_K> : KMin512<Q5_K> {};

// Q6_K: sub-block j = 4h + k, its groups 2j (t < 4) and 2j + 1
template <int H, int K, int MB>
RADIXRT_X16_512 __attribute__((always_inline)) inline void q6_sub(const uint8_t* b, const int8_t* const y[MB], __m512i isum[MB]) {
  constexpr int J = 4 * H + K;
  const __m512i scp = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + Q6_K::SC + 32 * J)));
  const __m512i sc[2] = {_mm512_srai_epi32(_mm512_slli_epi32(scp, 16), 16), _mm512_srai_epi32(scp, 16)};
  const uint8_t* ql = b + Q6_K::QL + (2 * H + (K & 1)) * 512;
  const uint8_t* qh = b + Q6_K::QH + H * 512;
  for (int half = 0; half < 2; ++half) {
    __m512i dot[MB];
    for (int m = 0; m < MB; ++m) dot[m] = _mm512_setzero_si512();
    for (int t = 4 * half; t < 4 * half + 4; ++t) {
      const __m512i v = _mm512_loadu_si512(ql + 64 * t), hv = _mm512_loadu_si512(qh + 64 * t);
      const __m512i lo4 = _mm512_and_si512(K < 2 ? v : _mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F));
      const __m512i w = _mm512_or_si512(lo4, _mm512_and_si512(shift512<2 * K, 4>(hv), _mm512_set1_epi8(0x30)));
      for (int m = 0; m < MB; ++m) dot[m] = _mm512_dpbusd_epi32(dot[m], w, bcast4(y[m] + 32 * J + 4 * t));
    }
    for (int m = 0; m < MB; ++m) isum[m] = _mm512_add_epi32(isum[m], _mm512_mullo_epi32(dot[m], sc[half]));
  }
}

template <>
struct Tile512<Q6_K> {
  template <int MB>
  RADIXRT_X16_512 __attribute__((always_inline)) static void block(const uint8_t* b, const XCtx& c, int64_t m0, int64_t s, __m512 acc[MB]) {
    const int64_t ns = c.K / 256;
    const int8_t* y[MB];
    __m512i isum[MB];
    for (int m = 0; m < MB; ++m) {
      y[m] = c.q + (m0 + m) * c.K + s * 256;
      isum[m] = _mm512_setzero_si512();
    }
    q6_sub<0, 0, MB>(b, y, isum);
    q6_sub<0, 1, MB>(b, y, isum);
    q6_sub<0, 2, MB>(b, y, isum);
    q6_sub<0, 3, MB>(b, y, isum);
    q6_sub<1, 0, MB>(b, y, isum);
    q6_sub<1, 1, MB>(b, y, isum);
    q6_sub<1, 2, MB>(b, y, isum);
    q6_sub<1, 3, MB>(b, y, isum);
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
    __m512i scp[8];  // the scale pairs (sc_2i, sc_2i+1) as int16, against the pairs of per-16 sums
    for (int i = 0; i < 8; ++i)
      scp[i] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + Q6_K::SC + 32 * i)));
    for (int m = 0; m < MB; ++m) {
      const uint8_t* bs = reinterpret_cast<const uint8_t*>(c.bsums + ((m0 + m) * ns + s) * 16);
      __m512i corr = _mm512_setzero_si512();
      for (int i = 0; i < 8; ++i) corr = _mm512_dpwssd_epi32(corr, scp[i], _mm512_set1_epi32((int)load_u32(bs + 4 * i)));
      const __m512i tot = _mm512_sub_epi32(isum[m], _mm512_slli_epi32(corr, 5));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot), _mm512_mul_ps(dw, _mm512_set1_ps(c.d[(m0 + m) * ns + s])), acc[m]);
    }
  }
};

template <>
struct Tile512<Q8_0> {
  template <int MB>
  RADIXRT_X16_512 __attribute__((always_inline)) static void block(const uint8_t* b, const XCtx& c, int64_t m0, int64_t s, __m512 acc[MB]) {
    const int64_t nb = c.K / 32;
    __m512i dot[MB];
    const int8_t* y[MB];
    for (int m = 0; m < MB; ++m) {
      y[m] = c.q + (m0 + m) * c.K + s * 32;
      dot[m] = _mm512_set1_epi32(c.yoff[(m0 + m) * nb + s]);  // cancels the weights' + 128
    }
    if constexpr (MB <= 2)  // decode streams the weight: 4 blocks ahead (x16_bench Q8_0 M = 1: 8-28 % faster)
      for (int l = 0; l < Q8_0::BYTES; l += 64) _mm_prefetch(reinterpret_cast<const char*>(b + 4 * Q8_0::BYTES + l), _MM_HINT_T0);
    for (int t = 0; t < 8; ++t) {
      const __m512i u = _mm512_loadu_si512(b + Q8_0::QS + 64 * t);
      for (int m = 0; m < MB; ++m) dot[m] = _mm512_dpbusd_epi32(dot[m], u, bcast4(y[m] + 4 * t));
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
    for (int m = 0; m < MB; ++m)
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[m]), _mm512_mul_ps(dw, _mm512_set1_ps(c.d[(m0 + m) * nb + s])),
                               acc[m]);
  }
};

// Group g (16 weight rows) against activation rows [m0, m0 + MB), all of K.
template <class T, int MB>
RADIXRT_X16_512 void tile512(const XCtx& c, int64_t g, int64_t m0) {
  const int64_t nb = c.K / T::QK;
  const uint8_t* w = c.W + g * nb * T::BYTES;
  __m512 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t s = 0; s < nb; ++s) Tile512<T>::template block<MB>(w + s * T::BYTES, c, m0, s, acc);
  for (int m = 0; m < MB; ++m) _mm512_storeu_ps(c.out + (m0 + m) * c.N + 16 * g, acc[m]);
}

}  // namespace x16
}  // namespace ggml
}  // namespace radixrt
