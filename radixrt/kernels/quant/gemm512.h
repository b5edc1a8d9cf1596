// Products of 3 or more activation rows with GGUF weights on AVX-512 VNNI, giving the same bits as the AVX2
// tiles of kquants.cpp / legacy_blocks.cpp (so a row's result still does not depend on M: batch invariance).
//
// Why the same bits: every output's arithmetic in the AVX2 tiles is, per block, an exact int32 sum in each
// of 8 lanes (lane l covers the same 4 elements of the block, whichever instructions compute it), then
// cvt + one or two FMAs with a scale product d_w * d_x rounded to float, into 8 float lanes summed by
// radixrt::hsum at the end. Here one 512-bit register holds two outputs' 8 lanes: the same weight row against
// activation rows 2p (low half) and 2p + 1 (high half), whose blocks lie next to each other in a paired copy
// of the quantized activations made per call (Pairs). The integer parts use VNNI (vpdpwssd fuses madd + add;
// vpdpbusd computes the 4-element sums of the 32-element types with an offset folded into its accumulator),
// exact as the AVX2 ones; the float operations are the same per lane, in the same order. So twice the work
// per instruction and fewer instructions, same results.
//
// Loop nest per thread: a group of weight rows decoded once into an L2-sized scratch (kblocks.h / lblocks.h
// decoders), then every pair tile of activations against it, RB weight rows x MP pairs at a time.
// Source of the tiling idea: llama.cpp's repacked GEMMs (ggml-cpu/repack.cpp) reuse each activation block
// across several weight rows; here the weight stays in the file's layout and is decoded per call instead.
#pragma once
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <vector>
#include "../avx2.h"
#include "block_io.h"
#include "kblocks.h"
#include "lblocks.h"

#define RADIXRT_X512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

namespace radixrt {
namespace ggml {
namespace x512 {

inline bool supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni");
}

// The quantized activations of a call, rows paired (an odd M's last pair has a zero second row).
struct Pairs {
  int64_t P = 0, nb = 0, nsc = 0;  // pairs, 32-blocks per row, scale blocks per row (K / 256 or K / 32)
  std::vector<int8_t> y;           // [P][nb][64]: block b of row 2p, then of row 2p + 1 (Q8_0: XOR 0x80)
  std::vector<float> dy;           // [P][nsc][16]: the two rows' scales, each 8 times
  std::vector<int16_t> bs;         // K-quants: [P][K / 256][32], the two rows' 16 per-16 sums
  std::vector<int32_t> off;        // Q4_0 / Q5_0: [P][nb][16], -2^shift * the sum of each 4 activations
};

// Pairs [p0, p1) of p from c's row-major buffers; `xor80` for Q8_0, `shift` > 0 for the offset types.
inline void make_pairs(const Ctx& c, int64_t M, bool k256, bool xor80, int shift, Pairs& a, int64_t p0,
                       int64_t p1) {
  const int64_t nb = a.nb, nsc = a.nsc;
  for (int64_t p = p0; p < p1; ++p)
    for (int h = 0; h < 2; ++h) {
      const int64_t m = 2 * p + h;
      const bool live = m < M;
      for (int64_t b = 0; b < nb; ++b) {
        __m256i v = live ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.q + m * c.K + 32 * b))
                         : _mm256_setzero_si256();
        if (shift) {  // the AVX2 tile's offset is 2^shift (y_i + y_i+1) per int16: here per 4, in int32
          const __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v), _mm256_set1_epi16(1));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.off.data() + (p * nb + b) * 16 + 8 * h),
                              _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(s4, shift)));
        }
        if (xor80) v = _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.y.data() + (p * nb + b) * 64 + 32 * h), v);
      }
      for (int64_t s = 0; s < nsc; ++s)
        _mm256_storeu_ps(a.dy.data() + (p * nsc + s) * 16 + 8 * h, _mm256_set1_ps(live ? c.d[m * nsc + s] : 0.0f));
      if (k256)
        for (int64_t s = 0; s < nsc; ++s) {
          const __m256i v = live ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.bsums + (m * nsc + s) * 16))
                                 : _mm256_setzero_si256();
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.bs.data() + (p * nsc + s) * 32 + 16 * h), v);
        }
    }
}

inline void alloc_pairs(Pairs& a, int64_t M, int64_t K, bool k256, int shift) {
  a.P = (M + 1) / 2;
  a.nb = K / 32;
  a.nsc = k256 ? K / 256 : K / 32;
  a.y.resize(a.P * a.nb * 64);
  a.dy.resize(a.P * a.nsc * 16);
  if (k256) a.bs.resize(a.P * a.nsc * 32);
  if (shift) a.off.resize(a.P * a.nb * 16);
}

RADIXRT_X512 inline __m512i bcast(const __m256i& v) {
  return _mm512_broadcast_i64x4(v);
}

// The two 8-lane halves of acc to outputs (m, col) and (m + 1, col), the second only where that row exists.
RADIXRT_X512 inline void store2(const Ctx& c, int64_t M, int64_t m, int64_t col, __m512 acc) {
  c.out[m * c.N + col] = hsum(_mm512_castps512_ps256(acc));
  if (m + 1 < M) c.out[(m + 1) * c.N + col] = hsum(_mm512_extractf32x8_ps(acc, 1));
}

// K-quants: weight rows n .. n + RB (decoded super-blocks w[r * ns + s]) x pairs p0 .. p0 + MP.
template <class T, int RB, int MP>
RADIXRT_X512 void ktile(const Ctx& c, int64_t M, const Pairs& a, const Decoded* w, int64_t ns, int64_t n, int64_t p0) {
  __m512 acc[RB][MP];
  for (int r = 0; r < RB; ++r)
    for (int p = 0; p < MP; ++p) acc[r][p] = _mm512_setzero_ps();
  for (int64_t s = 0; s < ns; ++s) {
    __m512i isum[RB][MP];
    for (int r = 0; r < RB; ++r)
      for (int p = 0; p < MP; ++p) isum[r][p] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      __m512i y[MP];
      for (int p = 0; p < MP; ++p) y[p] = _mm512_loadu_si512(a.y.data() + ((p0 + p) * a.nb + 8 * s + j) * 64);
      for (int r = 0; r < RB; ++r) {
        const Decoded& d = w[r * ns + s];
        const __m512i q = bcast(d.q[j]), sc = bcast(d.sc[j]);
        for (int p = 0; p < MP; ++p) isum[r][p] = _mm512_dpwssd_epi32(isum[r][p], _mm512_maddubs_epi16(q, y[p]), sc);
      }
    }
    for (int p = 0; p < MP; ++p) {
      const __m512i bs = _mm512_loadu_si512(a.bs.data() + ((p0 + p) * ns + s) * 32);
      const __m512 dy = _mm512_loadu_ps(a.dy.data() + ((p0 + p) * ns + s) * 16);
      for (int r = 0; r < RB; ++r) {  // kblocks.h fold(), per 8-lane half
        const Decoded& d = w[r * ns + s];
        const __m512i corr = _mm512_madd_epi16(bs, bcast(d.aux));
        if (T::MIN) {
          acc[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][p]), _mm512_mul_ps(_mm512_set1_ps(d.d), dy), acc[r][p]);
          acc[r][p] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(corr), _mm512_mul_ps(_mm512_set1_ps(d.dmin), dy), acc[r][p]);
        } else {
          acc[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(isum[r][p], corr)),
                                      _mm512_mul_ps(_mm512_set1_ps(d.d), dy), acc[r][p]);
        }
      }
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int p = 0; p < MP; ++p) store2(c, M, 2 * (p0 + p), n + r, acc[r][p]);
}

// A 32-element block decoded: Q8_0 keeps the signed weights and -128 * their sums of 4 (the accumulator's
// start, cancelling the activations' XOR 0x80); Q4_0 / Q5_0 the unsigned q (the offset is the activations').
struct LDecoded {
  __m256i q, init;
  float d;
};

template <class T>
RADIXRT_X512 inline void ldecode(const uint8_t* p, LDecoded& o) {
  float mn;
  o.q = T::decode(p, o.d, mn);
  // Q8_0: 128 * each 4 weights' sum, exact in int32, by the same 4-byte grouping as the products
  o.init = T::OFFSET_SHIFT == 0 ? _mm256_sub_epi32(_mm256_setzero_si256(),
                                                   _mm256_dpbusd_epi32(_mm256_setzero_si256(),
                                                                       _mm256_set1_epi8((char)0x80), o.q))
                                : _mm256_setzero_si256();
}

template <class T, int RB, int MP>
RADIXRT_X512 void ltile(const Ctx& c, int64_t M, const Pairs& a, const LDecoded* w, int64_t nb, int64_t n, int64_t p0) {
  __m512 acc[RB][MP];
  for (int r = 0; r < RB; ++r)
    for (int p = 0; p < MP; ++p) acc[r][p] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512i y[MP];
    __m512 dy[MP];
    for (int p = 0; p < MP; ++p) {
      y[p] = _mm512_loadu_si512(a.y.data() + ((p0 + p) * nb + b) * 64);
      dy[p] = _mm512_loadu_ps(a.dy.data() + ((p0 + p) * nb + b) * 16);
    }
    for (int r = 0; r < RB; ++r) {
      const LDecoded& d = w[r * nb + b];
      const __m512i q = bcast(d.q);
      const __m512 dw = _mm512_set1_ps(d.d);
      for (int p = 0; p < MP; ++p) {
        __m512i isum;
        if (T::OFFSET_SHIFT == 0)
          isum = _mm512_dpbusd_epi32(bcast(d.init), y[p], q);
        else
          isum = _mm512_dpbusd_epi32(_mm512_loadu_si512(a.off.data() + ((p0 + p) * nb + b) * 16), q, y[p]);
        acc[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, dy[p]), acc[r][p]);
      }
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int p = 0; p < MP; ++p) store2(c, M, 2 * (p0 + p), n + r, acc[r][p]);
}

// Rows of the weight per decoded group: about 192 KB of decoded blocks (L2), at least RB rows.
inline int64_t group_rows(int64_t bytes_per_row, int rb) {
  return std::max<int64_t>(rb, std::min<int64_t>(64, (192 << 10) / bytes_per_row / rb * rb));
}

// Weight rows [n0, n1) against every pair of a: groups of rows decoded once, then RB x MP tiles over them
// (pairs outer, so a tile's activations stay in L1 across the group's rows).
template <class T>
RADIXRT_X512 void krows(const Ctx& c, int64_t M, const Pairs& a, int64_t n0, int64_t n1) {
  constexpr int RB = 4, MP = 2;
  const int64_t ns = c.K / 256, group = group_rows(ns * (int64_t)sizeof(Decoded), RB);
  std::vector<Decoded> dec(group * ns);
  for (int64_t g = n0; g < n1; g += group) {
    const int64_t ge = std::min(n1, g + group);
    for (int64_t n = g; n < ge; ++n)
      for (int64_t s = 0; s < ns; ++s) decode<T>(c.W + n * c.row_bytes + s * T::BYTES, dec[(n - g) * ns + s]);
    int64_t p = 0;
    for (; p + MP <= a.P; p += MP) {
      int64_t n = g;
      for (; n + RB <= ge; n += RB) ktile<T, RB, MP>(c, M, a, dec.data() + (n - g) * ns, ns, n, p);
      for (; n < ge; ++n) ktile<T, 1, MP>(c, M, a, dec.data() + (n - g) * ns, ns, n, p);
    }
    for (; p < a.P; ++p) {
      int64_t n = g;
      for (; n + RB <= ge; n += RB) ktile<T, RB, 1>(c, M, a, dec.data() + (n - g) * ns, ns, n, p);
      for (; n < ge; ++n) ktile<T, 1, 1>(c, M, a, dec.data() + (n - g) * ns, ns, n, p);
    }
  }
}

template <class T>
RADIXRT_X512 void lrows(const Ctx& c, int64_t M, const Pairs& a, int64_t n0, int64_t n1) {
  constexpr int RB = 4, MP = 2;
  const int64_t nb = c.K / 32, group = group_rows(nb * (int64_t)sizeof(LDecoded), RB);
  std::vector<LDecoded> dec(group * nb);
  for (int64_t g = n0; g < n1; g += group) {
    const int64_t ge = std::min(n1, g + group);
    for (int64_t n = g; n < ge; ++n)
      for (int64_t b = 0; b < nb; ++b) ldecode<T>(c.W + n * c.row_bytes + b * T::BYTES, dec[(n - g) * nb + b]);
    int64_t p = 0;
    for (; p + MP <= a.P; p += MP) {
      int64_t n = g;
      for (; n + RB <= ge; n += RB) ltile<T, RB, MP>(c, M, a, dec.data() + (n - g) * nb, nb, n, p);
      for (; n < ge; ++n) ltile<T, 1, MP>(c, M, a, dec.data() + (n - g) * nb, nb, n, p);
    }
    for (; p < a.P; ++p) {
      int64_t n = g;
      for (; n + RB <= ge; n += RB) ltile<T, RB, 1>(c, M, a, dec.data() + (n - g) * nb, nb, n, p);
      for (; n < ge; ++n) ltile<T, 1, 1>(c, M, a, dec.data() + (n - g) * nb, nb, n, p);
    }
  }
}

}  // namespace x512
}  // namespace ggml
}  // namespace radixrt
