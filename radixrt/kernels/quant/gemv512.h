// Decode (1-2 activation rows) with GGUF weights on AVX-512, giving the same bits as the AVX2 streaming
// tiles of kquants.cpp / legacy_blocks.cpp (a row's result does not depend on M or on which path ran it).
//
// Why: at 1-2 rows a product is one pass over the weight, and on AVX2 the integer work per weight byte (load,
// unpack nibbles, maddubs, madd, add, and per block the float fold) held a core to ~25-30 GB/s of weight,
// below what one core reads from memory (~34 GB/s here, 2 threads ~70). Here one 512-bit register holds two
// weight rows' 8 lanes (row a in the low half, row b in the high half) against the same activation block
// broadcast to both halves, so each instruction serves two outputs; VNNI fuses madd + add (vpdpwssd) or
// does the 4-element byte sums directly (vpdpbusd).
//
// Why the same bits: per output, the AVX2 tile computes per block an exact int32 sum in each of 8 lanes (lane
// l covers the same 4 elements of the block), then cvt and one or two FMAs with d_w * d_x rounded to float
// (Q4_1/Q5_1: plus a scalar mins += m * s chain), into 8 float lanes summed by radixrt::hsum at the end.
// Here each half does exactly that for its row: the integer sums are exact whatever instructions form them,
// and the float operations are the same per lane in the same order.
//
// Loop nest: a tile is NZ register pairs (2 NZ consecutive weight rows), super-blocks / blocks inner, so the
// tile's bytes (one contiguous region) are read together; the tile after next is prefetched.
#pragma once
#include <immintrin.h>
#include <cstdint>
#include "../avx2.h"
#include "block_io.h"
#include "kblocks.h"
#include "lblocks.h"

#ifndef RADIXRT_X512
#define RADIXRT_X512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#endif

namespace radixrt {
namespace ggml {
namespace v512 {

RADIXRT_X512 inline __m512i ld2(const uint8_t* a, const uint8_t* b) {  // 32 bytes of a | 32 bytes of b
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
}

RADIXRT_X512 inline __m512i join(__m256i a, __m256i b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

RADIXRT_X512 inline __m512 joinf(float a, float b) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(a)), _mm256_set1_ps(b), 1);
}

RADIXRT_X512 inline __m512i bcast(const void* p) {  // 32 bytes to both halves
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

RADIXRT_X512 inline __m512i shift_to(__m512i v, int from, int to) {
  return from > to ? _mm512_srli_epi16(v, from - to) : _mm512_slli_epi16(v, to - from);
}

// Sub-block j of two rows' super-blocks, as kblocks.h's T::q of each (low half a, high half b).
template <class T>
struct K2;
template <>
struct K2<Q4_K> {
  RADIXRT_X512 static inline __m512i q(const uint8_t* a, const uint8_t* b, int j) {
    const __m512i v = ld2(a + 16 + 32 * (j >> 1), b + 16 + 32 * (j >> 1));
    return _mm512_and_si512(j & 1 ? _mm512_srli_epi16(v, 4) : v, _mm512_set1_epi8(0x0F));
  }
};
template <>
struct K2<Q5_K> {
  RADIXRT_X512 static inline __m512i q(const uint8_t* a, const uint8_t* b, int j) {
    const __m512i qh = ld2(a + 16, b + 16), v = ld2(a + 48 + 32 * (j >> 1), b + 48 + 32 * (j >> 1));
    return _mm512_or_si512(_mm512_and_si512(j & 1 ? _mm512_srli_epi16(v, 4) : v, _mm512_set1_epi8(0x0F)),
                           _mm512_and_si512(shift_to(qh, j, 4), _mm512_set1_epi8(0x10)));
  }
};
template <>
struct K2<Q6_K> {
  RADIXRT_X512 static inline __m512i q(const uint8_t* a, const uint8_t* b, int j) {
    const int hh = j >> 2, k = j & 3;
    const __m512i qh = ld2(a + 128 + 32 * hh, b + 128 + 32 * hh);
    const __m512i v = ld2(a + 64 * hh + 32 * (k & 1), b + 64 * hh + 32 * (k & 1));
    const __m512i l4 = _mm512_and_si512(k < 2 ? v : _mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F));
    return _mm512_or_si512(l4, _mm512_and_si512(shift_to(qh, 2 * k, 4), _mm512_set1_epi8(0x30)));
  }
};

// K-quants: rows n .. n + 2 NZ (row n + 2z + 1 may equal n + 2z: a lone last row, computed twice) against
// activation rows m0 .. m0 + MB. rows[2z], rows[2z + 1] are the two rows of pair z.
template <class T, int NZ, int MB>
RADIXRT_X512 void ktile(const Ctx& c, const int64_t* rows, int64_t m0, int64_t pf) {
  const int64_t ns = c.K / 256;
  __m512 acc[NZ][MB];
  for (int z = 0; z < NZ; ++z)
    for (int m = 0; m < MB; ++m) acc[z][m] = _mm512_setzero_ps();
  for (int64_t s = 0; s < ns; ++s) {
    const uint8_t* p[2 * NZ];
    Head h[2 * NZ];
    for (int r = 0; r < 2 * NZ; ++r) {
      p[r] = c.W + rows[r] * c.row_bytes + s * T::BYTES;
      for (int l = 0; l < T::BYTES; l += 64) _mm_prefetch(reinterpret_cast<const char*>(p[r] + pf + l), _MM_HINT_T0);
      T::head(p[r], h[r]);
    }
    __m512i isum[NZ][MB];
    for (int z = 0; z < NZ; ++z)
      for (int m = 0; m < MB; ++m) isum[z][m] = _mm512_setzero_si512();
    __m512i s16[NZ][2];
    for (int z = 0; z < NZ; ++z)
      for (int k = 0; k < (T::MIN ? 1 : 2); ++k) s16[z][k] = join(h[2 * z].s16[k], h[2 * z + 1].s16[k]);
    for (int j = 0; j < 8; ++j) {
      __m512i y[MB];
      for (int m = 0; m < MB; ++m) y[m] = bcast(c.q + (m0 + m) * c.K + s * 256 + 32 * j);
      for (int z = 0; z < NZ; ++z) {
        const __m512i qv = K2<T>::q(p[2 * z], p[2 * z + 1], j);
        __m512i sv;
        if (T::MIN) {
          sv = _mm512_shuffle_epi8(s16[z][0], _mm512_set1_epi16((short)(((2 * j + 1) << 8) | (2 * j))));
        } else {  // Q6_K::sc, per 128-bit lane
          const int i = 4 * (j & 3);
          const __m256i ctl = _mm256_set_m128i(_mm_set1_epi16((short)(((i + 3) << 8) | (i + 2))),
                                               _mm_set1_epi16((short)(((i + 1) << 8) | i)));
          sv = _mm512_shuffle_epi8(s16[z][j >> 2], _mm512_broadcast_i64x4(ctl));
        }
        for (int m = 0; m < MB; ++m) isum[z][m] = _mm512_dpwssd_epi32(isum[z][m], _mm512_maddubs_epi16(qv, y[m]), sv);
      }
    }
    for (int m = 0; m < MB; ++m) {  // kblocks.h fold(), per half
      const int64_t a = (m0 + m) * ns + s;
      const __m512i bs = bcast(c.bsums + a * 16);
      const float dy = c.d[a];
      for (int z = 0; z < NZ; ++z) {
        const Head &ha = h[2 * z], &hb = h[2 * z + 1];
        const __m512i corr = _mm512_madd_epi16(bs, join(ha.aux, hb.aux));
        if (T::MIN) {
          acc[z][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[z][m]), joinf(ha.d * dy, hb.d * dy), acc[z][m]);
          acc[z][m] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(corr), joinf(ha.dmin * dy, hb.dmin * dy), acc[z][m]);
        } else {
          acc[z][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(isum[z][m], corr)),
                                      joinf(ha.d * dy, hb.d * dy), acc[z][m]);
        }
      }
    }
  }
  for (int z = 0; z < NZ; ++z)
    for (int m = 0; m < MB; ++m) {
      float* o = c.out + (m0 + m) * c.N;
      o[rows[2 * z]] = hsum(_mm512_castps512_ps256(acc[z][m]));
      o[rows[2 * z + 1]] = hsum(_mm512_extractf32x8_ps(acc[z][m], 1));
    }
}

// The 32 elements of two rows' 32-blocks (lblocks.h's T::decode of each), and their fp16 scales / minimums.
RADIXRT_X512 inline __m512i nib2(const uint8_t* a, const uint8_t* b) {
  const __m256i v = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
  const __m512i z = _mm512_shuffle_i64x2(_mm512_castsi256_si512(v), _mm512_castsi256_si512(v), 0x50);  // a a b b
  return _mm512_and_si512(_mm512_mask_srli_epi16(z, 0xFF00FF00u, z, 4), _mm512_set1_epi8(0x0F));
}

template <class T>
RADIXRT_X512 inline __m512i lq2(const uint8_t* a, const uint8_t* b) {
  float d, m;
  if constexpr (T::BYTES == 34) return ld2(a + 2, b + 2);                                        // Q8_0
  if constexpr (T::BYTES == 18) return nib2(a + 2, b + 2);                                       // Q4_0
  if constexpr (T::BYTES == 20) return nib2(a + 4, b + 4);                                       // Q4_1
  return join(T::decode(a, d, m), T::decode(b, d, m));                                           // Q5_0, Q5_1
}

// Legacy types: as ktile, one activation block of 32 at a time. offs: Q4_0/Q5_0's activation offsets
// (-2^shift * each 4 activations' sum, int32 x 8 per block, [MB][K / 32]).
template <class T, int NZ, int MB>
RADIXRT_X512 void ltile(const Ctx& c, const int64_t* rows, int64_t m0, const int32_t* offs, int64_t pf) {
  static_assert(MB <= 8, "the minimums' lanes hold at most 8 activation rows");
  const int64_t nb = c.K / 32;
  __m512 acc[NZ][MB];
  // Q4_1/Q5_1: the scalar chains mins += m * s of weight-row pair z, lane i for row a against activation row
  // m0 + i, lane 8 + i for row b: one multiply and one add per block serve every activation row (the same
  // rounding per lane as the AVX2 tile's scalar multiply, then add)
  __m512 mins[NZ];
  for (int z = 0; z < NZ; ++z) {
    mins[z] = _mm512_setzero_ps();
    for (int m = 0; m < MB; ++m) acc[z][m] = _mm512_setzero_ps();
  }
  const uint8_t* base[2 * NZ];
  for (int r = 0; r < 2 * NZ; ++r) base[r] = c.W + rows[r] * c.row_bytes;
  for (int64_t b = 0; b < nb; ++b) {
    __m512i y[MB], yo[MB];
    for (int m = 0; m < MB; ++m) {
      y[m] = bcast(c.q + ((m0 + m) * nb + b) * 32);
      if (T::OFFSET_SHIFT) yo[m] = bcast(offs + ((int64_t)m * nb + b) * 8);
    }
    __m512 s;  // the activation rows' block sums s[m0 + i][b] in lane i of both halves (lanes >= MB unused)
    if (T::MIN) s = _mm512_broadcast_f32x8(_mm256_loadu_ps(c.st + b * c.st_ld + m0));
    for (int z = 0; z < NZ; ++z) {
      const uint8_t *pa = base[2 * z] + b * T::BYTES, *pb = base[2 * z + 1] + b * T::BYTES;
      _mm_prefetch(reinterpret_cast<const char*>(pa + pf), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(pb + pf), _MM_HINT_T0);
      const __m512i q = lq2<T>(pa, pb);
      // both blocks' first two fp16 (d, and m where the type has one) widened at once (exact, as fp16()):
      // d_a in the low half, d_b in the high half; m the same way
      const __m512 hd = _mm512_castps128_ps512(
          _mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128((int)load_u32(pa)), (int)load_u32(pb), 1)));
      const __m512 dw = _mm512_permutexvar_ps(_mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0), hd);
      __m512i aq = q;
      __mmask64 neg = 0;
      if (T::BYTES == 34) {  // Q8_0: |q| times y with q's sign (lblocks.h dot's sign trick, in one vpdpbusd)
        aq = _mm512_abs_epi8(q);
        neg = _mm512_movepi8_mask(q);
      }
      for (int m = 0; m < MB; ++m) {
        const int64_t a = (m0 + m) * nb + b;
        __m512i isum;
        if (T::OFFSET_SHIFT) isum = _mm512_dpbusd_epi32(yo[m], q, y[m]);
        else if (T::BYTES == 34) isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), aq,
                                                            _mm512_mask_sub_epi8(y[m], neg, _mm512_setzero_si512(), y[m]));
        else isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, y[m]);
        // d_w * d_x rounded to float per half, as the AVX2 tile's scalar product
        acc[z][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(c.d[a])), acc[z][m]);
      }
      if (T::MIN) {
        const __m512 mn = _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), hd);
        mins[z] = _mm512_add_ps(mins[z], _mm512_mul_ps(mn, s));
      }
    }
  }
  for (int z = 0; z < NZ; ++z) {
    alignas(64) float mn[16];
    if (T::MIN) _mm512_store_ps(mn, mins[z]);
    for (int m = 0; m < MB; ++m) {
      float* o = c.out + (m0 + m) * c.N;
      float lo = hsum(_mm512_castps512_ps256(acc[z][m])), hi = hsum(_mm512_extractf32x8_ps(acc[z][m], 1));
      if (T::MIN) {
        lo += mn[m];
        hi += mn[8 + m];
      }
      o[rows[2 * z]] = lo;
      o[rows[2 * z + 1]] = hi;
    }
  }
}

// Q4_0 / Q5_0 activation offsets of row x (nb blocks): -2^shift * each 4 activations' sum, int32 x 8 per
// block (what lblocks.h's act_offset subtracts in int16 pairs, here per 4 in int32: the same total per lane).
RADIXRT_X512 inline void offsets(const int8_t* x, int64_t nb, int shift, int32_t* o) {
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * b));
    const __m256i s4 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 8 * b),
                        _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(s4, shift)));
  }
}

}  // namespace v512
}  // namespace ggml
}  // namespace radixrt
