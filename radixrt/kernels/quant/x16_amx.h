// x16 tiles on AMX (Intel Sapphire Rapids and later: AMX-TILE + AMX-INT8), for 2 .. 16 activation rows at a
// time: the integer dot products of a sub-block (Q6_K: a group of 16) for every activation row and all 16 weight
// rows of a group in one TDPBSUD, C[m][n] += sum_k A[m][k] B[k][n] with A the rows' int8 activations read in
// place (stride K) and B the sub-block's unpacked weight planes, which are exactly AMX's B layout (K / 4 rows of
// 16 columns x 4 bytes: x16_layout.h). The sums are exact int32, the same D_j as x16_512.h's vpdpbusd chains; the
// fold (scales, minimums, the float accumulator) then runs on AVX-512 with the same operations per lane, so the
// bits equal the VNNI and AVX2 tiles' (tests/kernels/test_x16.py).
//
// Why: on AVX-512 VNNI the products of 8-16 rows are compute-bound (one vpdpbusd per 64 MACs plus the scale
// multiplies, ~50 % of the vpdpbusd peak in cache); one TDPBSUD does 16 x 16 x 32 MACs, so what is left per
// sub-block is unpacking the weight once and folding the 16 x 16 sums: a decode step of 16 rows then streams
// the weight at close to the 1-row speed.
//
// The OS must grant the tile state to the process (Linux arch_prctl ARCH_REQ_XCOMP_PERM, once: amx_ready()).
// Each thread loads the tile configuration before its tiles (per pass: the row count is in it).
#pragma once
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cpuid.h>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include "x16_512.h"

#define RADIXRT_X16_AMX \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8")))

namespace radixrt {
namespace ggml {
namespace x16 {

// True where the CPU has AMX-TILE and AMX-INT8 and the kernel grants this process the tile data state.
inline bool amx_ready() {
  static const bool ok = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) return false;
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return ok;
}

// LDTILECFG's 64 bytes (palette 1): tmm0-3 the C tiles (M rows x 16 int32), tmm4 / tmm6 the A tiles (M rows x
// KA bytes), tmm5 / tmm7 the B tiles (KA / 4 rows x 64 bytes).
struct alignas(64) TileCfg {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  TileCfg(int M, int KA) {
    for (int t = 0; t < 4; ++t) {
      colsb[t] = 64;
      rows[t] = (uint8_t)M;
    }
    colsb[4] = colsb[6] = (uint16_t)KA;
    rows[4] = rows[6] = (uint8_t)M;
    colsb[5] = colsb[7] = 64;
    rows[5] = rows[7] = (uint8_t)(KA / 4);
  }
};

// The compiler does not know that TILELOADD reads memory: the unpacked B planes must be stored before it.
inline void tile_fence() { __asm__ volatile("" ::: "memory"); }

// C_i = A (M rows of `ka` int8 at a, stride lda) . B (the planes at b), i = 0..3, then each C_i stored at
// out + i * 1024 (M rows of 64 bytes). The four products use tmm4/5 and tmm6/7 alternately.
RADIXRT_X16_AMX inline void four_dots(const int8_t* const a[4], int64_t lda, const uint8_t* const b[4], int32_t* out) {
  tile_fence();
  _tile_loadd(4, a[0], lda);
  _tile_loadd(5, b[0], 64);
  _tile_loadd(6, a[1], lda);
  _tile_loadd(7, b[1], 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_dpbsud(0, 4, 5);
  _tile_dpbsud(1, 6, 7);
  _tile_loadd(4, a[2], lda);
  _tile_loadd(5, b[2], 64);
  _tile_loadd(6, a[3], lda);
  _tile_loadd(7, b[3], 64);
  _tile_zero(2);
  _tile_zero(3);
  _tile_dpbsud(2, 4, 5);
  _tile_dpbsud(3, 6, 7);
  _tile_stored(0, out, 64);
  _tile_stored(1, out + 256, 64);
  _tile_stored(2, out + 512, 64);
  _tile_stored(3, out + 768, 64);
  tile_fence();
}

// Scratch of one pass: the unpacked planes of one block, the dot products of every sub-block / group, the
// accumulators.
struct alignas(64) AmxScratch {
  uint8_t planes[16][512];  // Q4_K / Q5_K: [sub-block j][t][64]; Q6_K: [group g][t][64] (4 of 8 t used)
  int32_t dots[16][256];    // [sub-block / group][m][16 lanes]
  float acc[16][16];        // [m][16 lanes]
};

template <class T>
struct Amx;

template <class T>
struct AmxKMin {
  static constexpr int KA = 32;
  RADIXRT_X16_AMX static void block(const uint8_t* b, const XCtx& c, int64_t m0, int M, int64_t s, AmxScratch& w) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int cc = 0; cc < 4; ++cc)
      for (int t = 0; t < 8; ++t) {
        const __m512i v = _mm512_loadu_si512(b + T::QS + cc * 512 + 64 * t);
        __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        if constexpr (T::HAS_QH) {
          const __m512i qh = _mm512_loadu_si512(b + T::QH + 64 * t), b4 = _mm512_set1_epi8(0x10);
          // bit j of each byte is the fifth bit of sub-block j: j = 2cc to bit 4, then j = 2cc + 1
          lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_rorv_epi32(qh, _mm512_set1_epi32((2 * cc - 4) & 31)), b4));
          hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_rorv_epi32(qh, _mm512_set1_epi32((2 * cc - 3) & 31)), b4));
        }
        _mm512_store_si512(w.planes[2 * cc] + 64 * t, lo);
        _mm512_store_si512(w.planes[2 * cc + 1] + 64 * t, hi);
      }
    const int8_t* y = c.q + m0 * c.K + s * 256;
    for (int h = 0; h < 2; ++h) {
      const int8_t* a[4] = {y + 32 * (4 * h), y + 32 * (4 * h + 1), y + 32 * (4 * h + 2), y + 32 * (4 * h + 3)};
      const uint8_t* p[4] = {w.planes[4 * h], w.planes[4 * h + 1], w.planes[4 * h + 2], w.planes[4 * h + 3]};
      four_dots(a, c.K, p, w.dots[4 * h]);
    }
    const int64_t ns = c.K / 256;
    __m512i sc[8], mn[4];
    for (int j = 0; j < 8; ++j) sc[j] = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 64 + 16 * j)));
    for (int i = 0; i < 4; ++i)
      mn[i] = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 192 + 32 * i)));
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
    const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32)));
    for (int m = 0; m < M; ++m) {
      __m512i isum = _mm512_setzero_si512();
      for (int j = 0; j < 8; ++j) isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(_mm512_load_si512(w.dots[j] + 16 * m), sc[j]));
      const int32_t* yp = c.ypair + ((m0 + m) * ns + s) * 4;
      __m512i corr = _mm512_setzero_si512();
      for (int i = 0; i < 4; ++i) corr = _mm512_dpwssd_epi32(corr, mn[i], _mm512_set1_epi32(yp[i]));
      const __m512 dy = _mm512_set1_ps(c.d[(m0 + m) * ns + s]);
      __m512 acc = _mm512_load_ps(w.acc[m]);
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, dy), acc);
      acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(corr), _mm512_mul_ps(dm, dy), acc);
      _mm512_store_ps(w.acc[m], acc);
    }
  }
};

template <>
struct Amx<Q4_K> : AmxKMin<Q4_K> {};
template <>
struct Amx<Q5_K> : AmxKMin<Q5_K> {};

template <>
struct Amx<Q6_K> {
  static constexpr int KA = 16;
  RADIXRT_X16_AMX static void block(const uint8_t* b, const XCtx& c, int64_t m0, int M, int64_t s, AmxScratch& w) {
    const __m512i low = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h)
      for (int k2 = 0; k2 < 2; ++k2)  // ql plane (h, k2) holds sub-blocks 4h + k2 (low) and 4h + k2 + 2 (high)
        for (int t = 0; t < 8; ++t) {
          const __m512i v = _mm512_loadu_si512(b + Q6_K::QL + (2 * h + k2) * 512 + 64 * t);
          const __m512i qh = _mm512_loadu_si512(b + Q6_K::QH + h * 512 + 64 * t);
          const int jl = 4 * h + k2, jh = jl + 2;  // sub-blocks; group 2j + (t >= 4), plane row t % 4
          const __m512i wl = _mm512_or_si512(_mm512_and_si512(v, low),
                                             _mm512_and_si512(_mm512_rorv_epi32(qh, _mm512_set1_epi32((2 * k2 - 4) & 31)), two));
          const __m512i wh = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), low),
                                             _mm512_and_si512(_mm512_rorv_epi32(qh, _mm512_set1_epi32((2 * k2)& 31)), two));
          _mm512_store_si512(w.planes[2 * jl + (t >> 2)] + 64 * (t & 3), wl);
          _mm512_store_si512(w.planes[2 * jh + (t >> 2)] + 64 * (t & 3), wh);
        }
    const int8_t* y = c.q + m0 * c.K + s * 256;
    for (int q = 0; q < 4; ++q) {
      const int8_t* a[4] = {y + 16 * (4 * q), y + 16 * (4 * q + 1), y + 16 * (4 * q + 2), y + 16 * (4 * q + 3)};
      const uint8_t* p[4] = {w.planes[4 * q], w.planes[4 * q + 1], w.planes[4 * q + 2], w.planes[4 * q + 3]};
      four_dots(a, c.K, p, w.dots[4 * q]);
    }
    const int64_t ns = c.K / 256;
    __m512i sc[16], scp[8];
    for (int i = 0; i < 8; ++i) {
      scp[i] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + Q6_K::SC + 32 * i)));
      sc[2 * i] = _mm512_srai_epi32(_mm512_slli_epi32(scp[i], 16), 16);
      sc[2 * i + 1] = _mm512_srai_epi32(scp[i], 16);
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
    for (int m = 0; m < M; ++m) {
      __m512i isum = _mm512_setzero_si512();
      for (int g = 0; g < 16; ++g) isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(_mm512_load_si512(w.dots[g] + 16 * m), sc[g]));
      const uint8_t* bs = reinterpret_cast<const uint8_t*>(c.bsums + ((m0 + m) * ns + s) * 16);
      __m512i corr = _mm512_setzero_si512();
      for (int i = 0; i < 8; ++i) corr = _mm512_dpwssd_epi32(corr, scp[i], _mm512_set1_epi32((int)load_u32(bs + 4 * i)));
      const __m512i tot = _mm512_sub_epi32(isum, _mm512_slli_epi32(corr, 5));
      __m512 acc = _mm512_load_ps(w.acc[m]);
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot), _mm512_mul_ps(dw, _mm512_set1_ps(c.d[(m0 + m) * ns + s])), acc);
      _mm512_store_ps(w.acc[m], acc);
    }
  }
};

template <>
struct Amx<Q8_0> {
  static constexpr int KA = 32;
  // four blocks at a time: their planes are AMX's B as stored (w + 128, unsigned)
  RADIXRT_X16_AMX static void block4(const uint8_t* b, const XCtx& c, int64_t m0, int M, int64_t s, AmxScratch& w) {
    const int8_t* y = c.q + m0 * c.K + s * 32;
    const int8_t* a[4] = {y, y + 32, y + 64, y + 96};
    const uint8_t* p[4] = {b + Q8_0::QS, b + Q8_0::BYTES + Q8_0::QS, b + 2 * Q8_0::BYTES + Q8_0::QS,
                           b + 3 * Q8_0::BYTES + Q8_0::QS};
    four_dots(a, c.K, p, w.dots[0]);
    const int64_t nb = c.K / 32;
    for (int i = 0; i < 4; ++i) {
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i * Q8_0::BYTES)));
      for (int m = 0; m < M; ++m) {
        const int64_t r = (m0 + m) * nb + s + i;
        const __m512i dot = _mm512_add_epi32(_mm512_load_si512(w.dots[i] + 16 * m), _mm512_set1_epi32(c.yoff[r]));
        __m512 acc = _mm512_load_ps(w.acc[m]);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, _mm512_set1_ps(c.d[r])), acc);
        _mm512_store_ps(w.acc[m], acc);
      }
    }
  }
};

// Group g (16 weight rows) against activation rows [m0, m0 + M), M <= 16, all of K; the caller has loaded a
// TileCfg(M, Amx<T>::KA) on this thread.
template <class T>
RADIXRT_X16_AMX void tile_amx(const XCtx& c, int64_t g, int64_t m0, int M, AmxScratch& w) {
  const int64_t nb = c.K / T::QK;
  const uint8_t* wg = c.W + g * nb * T::BYTES;
  for (int m = 0; m < M; ++m) _mm512_store_ps(w.acc[m], _mm512_setzero_ps());
  if constexpr (T::QK == 32) {
    int64_t s = 0;
    for (; s + 4 <= nb; s += 4) Amx<T>::block4(wg + s * T::BYTES, c, m0, M, s, w);
    for (; s < nb; ++s) {  // K not a multiple of 128: the last blocks on the VNNI fold, same arithmetic
      for (int m = 0; m < M; ++m) {
        __m512 acc[1] = {_mm512_load_ps(w.acc[m])};
        Tile512<T>::template block<1>(wg + s * T::BYTES, c, m0 + m, s, acc);
        _mm512_store_ps(w.acc[m], acc[0]);
      }
    }
  } else {
    for (int64_t s = 0; s < nb; ++s) Amx<T>::block(wg + s * T::BYTES, c, m0, M, s, w);
  }
  for (int m = 0; m < M; ++m) _mm512_storeu_ps(c.out + (m0 + m) * c.N + 16 * g, _mm512_load_ps(w.acc[m]));
}

}  // namespace x16
}  // namespace ggml
}  // namespace radixrt
