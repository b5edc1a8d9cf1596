// GGUF's K-quants (256-element super-blocks) on int8 activations quantized per 256 (q8_act.h, Q8_K-style),
// in the file's own layout.
//
// Super-blocks (llama.cpp ggml-common.h block_q4_K etc., dequantize_row_q4_K etc. in ggml-quants.c):
//   Q4_K, 144 bytes: fp16 d, fp16 dmin, scales[12] (8 6-bit scales sc and 8 6-bit mins mn), qs[128].
//        Sub-block j (32 elements) is the low (j even) or high (j odd) nibbles of qs[32 (j/2) ..];
//        w = d sc_j q - dmin mn_j.
//   Q5_K, 176 bytes: as Q4_K with qh[32] before qs: bit j of qh[i] is the fifth bit of element i of sub-block j.
//   Q6_K, 210 bytes: ql[128], qh[64], int8 scales[16] (one per 16), fp16 d; w = d sc_g (q - 32), q 6 bits.
// The integer part runs as in llama.cpp's ggml_vec_dot_q4_K_q8_K (ggml-cpu/arch/x86/quants.c): maddubs per
// sub-block, then madd with the sub-block scale, summed in int32 over the super-block (exact); the minimum
// (Q4_K/Q5_K) and Q6_K's offset of 32 come from the activations' per-16 sums. One float accumulator per output.
//
// Each weight row's super-block is decoded once per tile into 8 byte vectors and 8 scale vectors (L1 scratch),
// then used by the MB activation rows of the tile.
//
// This header: the super-block decoders (Head/Decoded, q() and sc() per sub-block) and the fold of one
// super-block's integer sums into a float accumulator, shared by kquants.cpp and gemm512.cpp.
#pragma once
#include <immintrin.h>
#include "../avx2.h"
#include "block_io.h"

namespace radixrt {
namespace ggml {

struct Decoded {
  __m256i q[8];   // unsigned element values of the 8 sub-blocks of 32
  __m256i sc[8];  // int16 multipliers of each sub-block's 16 maddubs lanes
  __m256i aux;    // int16 x 16, paired with the 16 bsums: Q4_K/Q5_K mins, Q6_K 32 * scale
  float d, dmin;
};

inline __m256i shift_to(__m256i v, int from, int to) {  // bit `from` of every byte to bit `to` (others junk)
  return from > to ? _mm256_srli_epi16(v, from - to) : _mm256_slli_epi16(v, to - from);
}

// The 12 bytes of 6-bit scales and mins (get_scale_min_k4's packing) -> the 8 scales as int16 in both 128-bit
// lanes (`s16`, from which sc_shuffle broadcasts sub-block j's) and Decoded::aux. All in registers: going
// through byte arrays on the stack cost a store-forwarding stall per super-block.
inline void scales_k4(const uint8_t* p, __m256i& s16, __m256i& aux) {
  const uint32_t u0 = load_u32(p), u1 = load_u32(p + 4), u2 = load_u32(p + 8);
  const uint32_t s_lo = u0 & 0x3f3f3f3f, s_hi = (u2 & 0x0f0f0f0f) | ((u0 >> 2) & 0x30303030);
  const uint32_t m_lo = u1 & 0x3f3f3f3f, m_hi = ((u2 >> 4) & 0x0f0f0f0f) | ((u1 >> 2) & 0x30303030);
  const uint64_t s8 = (uint64_t)s_lo | ((uint64_t)s_hi << 32), m8 = (uint64_t)m_lo | ((uint64_t)m_hi << 32);
  s16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)s8)));
  const __m128i mv = _mm_cvtsi64_si128((long long)m8);
  aux = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mv, mv));  // mn_j for both 16-halves of sub-block j
}

inline __m256i sc_shuffle(__m256i s16, int j) {  // int16 j of s16 broadcast
  return _mm256_shuffle_epi8(s16, _mm256_set1_epi16((short)(((2 * j + 1) << 8) | (2 * j))));
}

// Each type: head() reads a super-block's scales (Head), q() sub-block j's unsigned values, sc() its int16
// multipliers; decode() is all of them at once (the tile for many activation rows), the streaming tile calls
// them one sub-block at a time. Both give the same vectors, so the same bits.
struct Head {
  __m256i s16[2];
  __m256i aux;
  float d, dmin;
};

struct Q4_K {
  static constexpr int BYTES = 144;
  static constexpr bool MIN = true;
  static inline void head(const uint8_t* p, Head& h) {
    h.d = fp16(p);
    h.dmin = fp16(p + 2);
    scales_k4(p + 4, h.s16[0], h.aux);
  }
  static inline __m256i q(const uint8_t* p, int j) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 + 32 * (j >> 1)));
    return _mm256_and_si256(j & 1 ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(0x0F));
  }
  static inline __m256i sc(const Head& h, int j) { return sc_shuffle(h.s16[0], j); }
};

struct Q5_K {
  static constexpr int BYTES = 176;
  static constexpr bool MIN = true;
  static inline void head(const uint8_t* p, Head& h) {
    h.d = fp16(p);
    h.dmin = fp16(p + 2);
    scales_k4(p + 4, h.s16[0], h.aux);
  }
  static inline __m256i q(const uint8_t* p, int j) {
    const __m256i lo = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 48 + 32 * (j >> 1)));
    return _mm256_or_si256(_mm256_and_si256(j & 1 ? _mm256_srli_epi16(v, 4) : v, lo),
                           _mm256_and_si256(shift_to(qh, j, 4), b4));
  }
  static inline __m256i sc(const Head& h, int j) { return sc_shuffle(h.s16[0], j); }
};

struct Q6_K {
  static constexpr int BYTES = 210;
  static constexpr bool MIN = false;
  // Sub-block j = 4 h + k (elements 128 h + 32 k ..): low 4 bits from the low (k < 2) or high nibbles of
  // ql[64 h + 32 (k & 1) ..], high 2 bits from bits 2k, 2k + 1 of qh[32 h ..].
  static inline void head(const uint8_t* p, Head& h) {
    const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192));
    h.d = fp16(p + 208);
    h.dmin = 0.0f;
    h.s16[0] = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(s8));
    h.s16[1] = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_unpackhi_epi64(s8, s8)));
    // sum sc (q - 32) y = sum sc q y - 32 sum_g sc_g bsum_g
    h.aux = _mm256_slli_epi16(_mm256_cvtepi8_epi16(s8), 5);
  }
  static inline __m256i q(const uint8_t* p, int j) {
    const int hh = j >> 2, k = j & 3;
    const __m256i lo = _mm256_set1_epi8(0x0F), hi2 = _mm256_set1_epi8(0x30);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * hh));
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * hh + 32 * (k & 1)));
    const __m256i l4 = k < 2 ? _mm256_and_si256(v, lo) : _mm256_and_si256(_mm256_srli_epi16(v, 4), lo);
    return _mm256_or_si256(l4, _mm256_and_si256(shift_to(qh, 2 * k, 4), hi2));
  }
  // low 128 bits: scale 2j for elements 0..15, high: scale 2j + 1 for 16..31
  static inline __m256i sc(const Head& h, int j) {
    const int i = 4 * (j & 3);
    return _mm256_shuffle_epi8(h.s16[j >> 2], _mm256_set_m128i(_mm_set1_epi16((short)(((i + 3) << 8) | (i + 2))),
                                                                  _mm_set1_epi16((short)(((i + 1) << 8) | i))));
  }
};

template <class T>
inline void decode(const uint8_t* p, Decoded& o) {
  Head h;
  T::head(p, h);
  o.d = h.d;
  o.dmin = h.dmin;
  o.aux = h.aux;
  for (int j = 0; j < 8; ++j) {
    o.q[j] = T::q(p, j);
    o.sc[j] = T::sc(h, j);
  }
}

// One super-block's contribution to the accumulators of RB x MB outputs (the same operations in the same
// order in both tiles: the integer sum isum is exact, then two (Q6_K: one) fused multiply-adds).
template <class T>
inline __m256 fold(__m256 acc, __m256i isum, __m256i bs, const __m256i& aux, float d, float dmin, float dy) {
  const __m256i corr = _mm256_madd_epi16(bs, aux);
  if (T::MIN) {
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d * dy), acc);
    return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(corr), _mm256_set1_ps(dmin * dy), acc);
  }
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum, corr)), _mm256_set1_ps(d * dy), acc);
}

}  // namespace ggml
}  // namespace radixrt
