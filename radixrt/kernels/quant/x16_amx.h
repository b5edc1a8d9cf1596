// x16 tiles on AMX (Intel Sapphire Rapids and later: AMX-TILE + AMX-INT8), for passes of up to 16 activation rows.
// Per pass, the integer dot products of a sub-block (Q6_K: a group of 16) for every activation row and all 16 weight
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
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
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

// The tiles of one batch: C_i = A_i (M rows of KA int8 at a[i], stride lda) . B_i (the planes at b[i]),
// i = 0..3, on tmm4/5 and tmm6/7 alternately. Issued here and stored by store4() after the caller has folded
// the previous batch, so the vector units fold while the tile unit multiplies.
RADIXRT_X16_AMX inline void issue4(const int8_t* const a[4], int64_t lda, const uint8_t* const b[4]) {
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
}

// C_0..3 to out + i * 256 int32 (M rows of 16 lanes each).
RADIXRT_X16_AMX inline void store4(int32_t* out) {
  _tile_stored(0, out, 64);
  _tile_stored(1, out + 256, 64);
  _tile_stored(2, out + 512, 64);
  _tile_stored(3, out + 768, 64);
  tile_fence();
}

// Scratch of one pass: two batches' planes and dot products (the one in the tile unit and the one being
// folded), the integer sums of the block so far and the float accumulators.
struct alignas(64) AmxScratch {
  uint8_t planes[2][4][512];  // [batch parity][i][K / 4 rows of 64 bytes]
  int32_t dots[2][4][256];    // [batch parity][i][m][16 lanes]
  int32_t isum[16][16];       // [m][16 lanes]
  float acc[16][16];          // [m][16 lanes]
};

// Q4_K / Q5_K: a batch is 4 sub-blocks (half a super-block), j = 4 half + i.
template <class T>
struct AmxKMin {
  static constexpr int KA = 32, BATCHES = 2;
  RADIXRT_X16_AMX static void unpack(const uint8_t* b, int half, uint8_t (*planes)[512]) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int ci = 0; ci < 2; ++ci) {  // sub-block pairs cc = 2 half + ci: sub-blocks 2cc, 2cc + 1
      const int cc = 2 * half + ci;
      for (int t = 0; t < 8; ++t) {
        const __m512i v = _mm512_loadu_si512(b + T::QS + cc * 512 + 64 * t);
        __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        if constexpr (T::HAS_QH) {
          const __m512i qh = _mm512_loadu_si512(b + T::QH + 64 * t), b4 = _mm512_set1_epi8(0x10);
          // bit j of each byte is the fifth bit of sub-block j: rotated to bit 4 (other bits masked)
          lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_rorv_epi32(qh, _mm512_set1_epi32((2 * cc - 4) & 31)), b4));
          hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_rorv_epi32(qh, _mm512_set1_epi32((2 * cc - 3) & 31)), b4));
        }
        _mm512_store_si512(planes[2 * ci] + 64 * t, lo);
        _mm512_store_si512(planes[2 * ci + 1] + 64 * t, hi);
      }
    }
  }
  static void a_rows(const XCtx& c, int64_t m0, int64_t s, int half, const int8_t* a[4]) {
    const int8_t* y = c.q + m0 * c.K + s * 256 + 128 * half;
    for (int i = 0; i < 4; ++i) a[i] = y + 32 * i;
  }
  RADIXRT_X16_AMX static void fold(const uint8_t* b, const XCtx& c, int64_t m0, int M, int64_t s, int half,
                                   const int32_t (*dots)[256], AmxScratch& w) {
    __m512i sc[4];
    for (int i = 0; i < 4; ++i)
      sc[i] = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 64 + 16 * (4 * half + i))));
    for (int m = 0; m < M; ++m) {
      __m512i isum = half ? _mm512_load_si512(w.isum[m]) : _mm512_setzero_si512();
      for (int i = 0; i < 4; ++i) isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(_mm512_load_si512(dots[i] + 16 * m), sc[i]));
      _mm512_store_si512(w.isum[m], isum);
    }
    if (!half) return;
    const int64_t ns = c.K / 256;
    __m512i mn[4];
    for (int i = 0; i < 4; ++i)
      mn[i] = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 192 + 32 * i)));
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
    const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32)));
    for (int m = 0; m < M; ++m) {
      const int32_t* yp = c.ypair + ((m0 + m) * ns + s) * 4;
      __m512i corr = _mm512_setzero_si512();
      for (int i = 0; i < 4; ++i) corr = _mm512_dpwssd_epi32(corr, mn[i], _mm512_set1_epi32(yp[i]));
      const __m512 dy = _mm512_set1_ps(c.d[(m0 + m) * ns + s]);
      __m512 acc = _mm512_load_ps(w.acc[m]);
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(w.isum[m])), _mm512_mul_ps(dw, dy), acc);
      acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(corr), _mm512_mul_ps(dm, dy), acc);
      _mm512_store_ps(w.acc[m], acc);
    }
  }
};

template <class T>
struct Amx;
template <>
struct Amx<Q4_K> : AmxKMin<Q4_K> {};
template <>
struct Amx<Q5_K> : AmxKMin<Q5_K> {};

// Q6_K: a batch is 4 groups of 16 (a quarter super-block: sub-blocks 2 quarter, 2 quarter + 1), g = 4 q + i.
template <>
struct Amx<Q6_K> {
  static constexpr int KA = 16, BATCHES = 4;
  RADIXRT_X16_AMX static void unpack(const uint8_t* b, int quarter, uint8_t (*planes)[512]) {
    const __m512i low = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(0x30);
    for (int jj = 0; jj < 2; ++jj) {
      const int j = 2 * quarter + jj, h = j >> 2, k = j & 3;  // sub-block j = 4h + k
      for (int t = 0; t < 8; ++t) {
        const __m512i v = _mm512_loadu_si512(b + Q6_K::QL + (2 * h + (k & 1)) * 512 + 64 * t);
        const __m512i qh = _mm512_loadu_si512(b + Q6_K::QH + h * 512 + 64 * t);
        const __m512i lo4 = _mm512_and_si512(k < 2 ? v : _mm512_srli_epi16(v, 4), low);
        // bits 2k, 2k + 1 of each qh byte rotated to bits 4, 5
        const __m512i hi2 = _mm512_and_si512(_mm512_rorv_epi32(qh, _mm512_set1_epi32((2 * k - 4) & 31)), two);
        _mm512_store_si512(planes[2 * jj + (t >> 2)] + 64 * (t & 3), _mm512_or_si512(lo4, hi2));
      }
    }
  }
  static void a_rows(const XCtx& c, int64_t m0, int64_t s, int quarter, const int8_t* a[4]) {
    const int8_t* y = c.q + m0 * c.K + s * 256 + 64 * quarter;
    for (int i = 0; i < 4; ++i) a[i] = y + 16 * i;
  }
  RADIXRT_X16_AMX static void fold(const uint8_t* b, const XCtx& c, int64_t m0, int M, int64_t s, int quarter,
                                   const int32_t (*dots)[256], AmxScratch& w) {
    const __m512i scp0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + Q6_K::SC + 64 * quarter)));
    const __m512i scp1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + Q6_K::SC + 64 * quarter + 32)));
    const __m512i sc[4] = {_mm512_srai_epi32(_mm512_slli_epi32(scp0, 16), 16), _mm512_srai_epi32(scp0, 16),
                           _mm512_srai_epi32(_mm512_slli_epi32(scp1, 16), 16), _mm512_srai_epi32(scp1, 16)};
    for (int m = 0; m < M; ++m) {
      __m512i isum = quarter ? _mm512_load_si512(w.isum[m]) : _mm512_setzero_si512();
      for (int i = 0; i < 4; ++i) isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(_mm512_load_si512(dots[i] + 16 * m), sc[i]));
      _mm512_store_si512(w.isum[m], isum);
    }
    if (quarter != 3) return;
    const int64_t ns = c.K / 256;
    __m512i scp[8];
    for (int i = 0; i < 8; ++i)
      scp[i] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + Q6_K::SC + 32 * i)));
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
    for (int m = 0; m < M; ++m) {
      const uint8_t* bs = reinterpret_cast<const uint8_t*>(c.bsums + ((m0 + m) * ns + s) * 16);
      __m512i corr = _mm512_setzero_si512();
      for (int i = 0; i < 8; ++i) corr = _mm512_dpwssd_epi32(corr, scp[i], _mm512_set1_epi32((int)load_u32(bs + 4 * i)));
      const __m512i tot = _mm512_sub_epi32(_mm512_load_si512(w.isum[m]), _mm512_slli_epi32(corr, 5));
      __m512 acc = _mm512_load_ps(w.acc[m]);
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot), _mm512_mul_ps(dw, _mm512_set1_ps(c.d[(m0 + m) * ns + s])), acc);
      _mm512_store_ps(w.acc[m], acc);
    }
  }
};

// Q8_0: a batch is 4 blocks (their planes are AMX's B as stored: w + 128, unsigned), block s + i.
template <>
struct Amx<Q8_0> {
  static constexpr int KA = 32, BATCHES = 1;  // per 4 blocks
  static void a_rows(const XCtx& c, int64_t m0, int64_t s, int, const int8_t* a[4]) {
    for (int i = 0; i < 4; ++i) a[i] = c.q + m0 * c.K + (s + i) * 32;
  }
  RADIXRT_X16_AMX static void fold(const uint8_t* b, const XCtx& c, int64_t m0, int M, int64_t s, int,
                                   const int32_t (*dots)[256], AmxScratch& w) {
    const int64_t nb = c.K / 32;
    for (int i = 0; i < 4; ++i) {
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i * Q8_0::BYTES)));
      for (int m = 0; m < M; ++m) {
        const int64_t r = (m0 + m) * nb + s + i;
        const __m512i dot = _mm512_add_epi32(_mm512_load_si512(dots[i] + 16 * m), _mm512_set1_epi32(c.yoff[r]));
        __m512 acc = _mm512_load_ps(w.acc[m]);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, _mm512_set1_ps(c.d[r])), acc);
        _mm512_store_ps(w.acc[m], acc);
      }
    }
  }
};

// Group g (16 weight rows) against activation rows [m0, m0 + M), M <= 16, all of K; the caller has loaded a
// TileCfg(M, Amx<T>::KA) on this thread. Batches in order; batch i's products run in the tile unit while
// batch i - 1 is folded (the fold order, and so the bits, are the same as folding each batch at once).
template <class T>
RADIXRT_X16_AMX void tile_amx(const XCtx& c, int64_t g, int64_t m0, int M, AmxScratch& w) {
  using A = Amx<T>;
  const int64_t nb = c.K / T::QK;
  const uint8_t* wg = c.W + g * nb * T::BYTES;
  for (int m = 0; m < M; ++m) _mm512_store_ps(w.acc[m], _mm512_setzero_ps());
  constexpr int64_t STEP = T::QK == 32 ? 4 : 1;  // blocks per batch group: the 32-element types batch 4 blocks
  const int64_t nbatch = T::QK == 32 ? nb / 4 : nb * A::BATCHES;
  int64_t prev_s = -1;
  int prev_part = 0;
  for (int64_t i = 0; i < nbatch; ++i) {
    const int64_t s = T::QK == 32 ? 4 * i : i / A::BATCHES;
    const int part = T::QK == 32 ? 0 : (int)(i % A::BATCHES);
    const uint8_t* b = wg + s * T::BYTES;
    const int8_t* a[4];
    A::a_rows(c, m0, s, part, a);
    const uint8_t* p[4];
    if constexpr (std::is_same_v<T, Q8_0>) {  // its stored planes are AMX's B
      for (int k = 0; k < 4; ++k) p[k] = b + k * T::BYTES + Q8_0::QS;
    } else {
      A::unpack(b, part, w.planes[i & 1]);
      for (int k = 0; k < 4; ++k) p[k] = w.planes[i & 1][k];
    }
    issue4(a, c.K, p);
    if (prev_s >= 0) A::fold(wg + prev_s * T::BYTES, c, m0, M, prev_s, prev_part, w.dots[(i - 1) & 1], w);
    store4(w.dots[i & 1][0]);
    prev_s = s;
    prev_part = part;
  }
  if (prev_s >= 0) A::fold(wg + prev_s * T::BYTES, c, m0, M, prev_s, prev_part, w.dots[(nbatch - 1) & 1], w);
  for (int64_t s = nbatch * STEP; T::QK == 32 && s < nb; ++s)  // K not a multiple of 128: VNNI, same arithmetic
    for (int m = 0; m < M; ++m) {
      __m512 acc[1] = {_mm512_load_ps(w.acc[m])};
      Tile512<T>::template block<1>(wg + s * T::BYTES, c, m0 + m, s, acc);
      _mm512_store_ps(w.acc[m], acc[0]);
    }
  for (int m = 0; m < M; ++m) _mm512_storeu_ps(c.out + (m0 + m) * c.N + 16 * g, _mm512_load_ps(w.acc[m]));
}

// The loop nest over this thread's groups [g0, g1): passes of up to 16 rows, each with the tile configuration
// for its row count; groups in chunks of ~256 KB of weight when there are several passes, so the later passes
// find it in L2. Used by x16_mm.cpp and by benchmarks/native/x16_bench.cpp.
template <class T>
RADIXRT_X16_AMX void rows_amx(const XCtx& c, int64_t M, int64_t g0, int64_t g1) {
  alignas(64) AmxScratch w;
  const int64_t passes = (M + 15) / 16;
  const int64_t chunk = passes > 1 ? std::max<int64_t>(1, (256 << 10) / (c.K / T::QK * T::BYTES)) : g1 - g0;
  for (int64_t g = g0; g < g1; g += chunk) {
    const int64_t ge = std::min(g1, g + chunk);
    for (int64_t i = 0, m0 = 0; i < passes; ++i) {
      const int mb = (int)((M - m0) / (passes - i));
      const TileCfg cfg(mb, Amx<T>::KA);
      _tile_loadconfig(&cfg);
      for (int64_t gg = g; gg < ge; ++gg) tile_amx<T>(c, gg, m0, mb, w);
      m0 += mb;
    }
  }
  _tile_release();
}

}  // namespace x16
}  // namespace ggml
}  // namespace radixrt
