// The loop nest shared by every GGUF type's kernel (legacy_blocks.cpp, kquants.cpp): output columns (weight
// rows) split over threads, cache blocking, and tiles of RB weight rows x MB activation rows.
//
// Batch invariance: an output element (m, n) is always computed by one thread, from row m's own quantized
// activations, by the same sequence of operations over the blocks of K whatever tile (RB, MB) it falls in:
// the tiles only interleave independent accumulator chains. So row m's result does not depend on M, on its
// position in x, or on the thread count.
#pragma once
#include <ATen/ATen.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include "../parallel.h"

namespace radixrt {
namespace ggml {

// Quantized activations of M rows (q8_act.h) and the weight in the GGUF file's own layout.
struct Ctx {
  const uint8_t* W;      // [N, row_bytes]
  int64_t row_bytes;     // K / block * type_size
  int64_t K, N;
  const int8_t* q;       // [M, K]
  const float* d;        // [M, K / act_block]: 32 for the legacy types, 256 for the K-quants
  const float* s;        // [M, K / 32]: d * sum(q) per 32 (legacy types with a minimum)
  const int16_t* bsums;  // [M, K / 16] (K-quants)
  float* out;            // [M, N]
};

inline float fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Low nibbles of 16 bytes, then their high nibbles: elements 0..31 of a 32-block (Q4_0/Q4_1/Q5_x).
inline __m256i nibbles16(const uint8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i lo = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), lo), _mm_and_si128(raw, lo));
}

// Byte j = 0x10 where bit j of `bits` is set, else 0 (the fifth bit of Q5_0/Q5_1 element j).
inline __m256i bit4_from_bits32(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32((int)bits),
      _mm256_setr_epi64x(0x0000000000000000LL, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL));
  const __m256i mask = _mm256_set1_epi64x(0x8040201008040201LL);
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask), _mm256_set1_epi8(0x10));
}

template <class Kern, int MB>
void row_range(const Ctx& c, int64_t n0, int64_t n1, int64_t m0) {
  constexpr int RB = MB <= 2 ? 4 : MB <= 4 ? 2 : 1;  // RB * MB accumulators fit the 16 ymm registers
  int64_t n = n0;
  for (; n + RB <= n1; n += RB) Kern::template tile<RB, MB>(c, n, m0);
  for (; n < n1; ++n) Kern::template tile<1, MB>(c, n, m0);
}

// Activation rows [m0, m1) over weight rows [n0, n1) in tiles of up to Kern::MAX_MB rows (8 where the
// kernel's accumulators allow: each weight block is then decoded once per 8 rows), the rest by 4, then 1-3.
template <class Kern>
void m_range(const Ctx& c, int64_t n0, int64_t n1, int64_t M) {
  int64_t m0 = 0;
  if (Kern::MAX_MB >= 8)
    for (; m0 + 8 <= M; m0 += 8) row_range<Kern, Kern::MAX_MB >= 8 ? 8 : 4>(c, n0, n1, m0);
  for (; m0 + 4 <= M; m0 += 4) row_range<Kern, 4>(c, n0, n1, m0);
  switch (M - m0) {
    case 1: row_range<Kern, 1>(c, n0, n1, m0); break;
    case 2: row_range<Kern, 2>(c, n0, n1, m0); break;
    case 3: row_range<Kern, 3>(c, n0, n1, m0); break;
    default: break;
  }
}

// Rows of the weight in groups that stay in L2 (~256 KB) while every activation tile (up to 8 x K bytes,
// L1/L2) passes over them: the weight is read from memory once per call. Every product but a tiny one splits
// over the threads (chunks of whole rows: see the invariance note above).
template <class Kern>
void run(const Ctx& c, int64_t M) {
  const int64_t group = std::max<int64_t>(8, (256 << 10) / std::max<int64_t>(1, c.row_bytes) / 8 * 8);
  const int64_t grain = M * c.N * c.K < (1 << 16) ? c.N : 16;
  radixrt::parallel_for(0, c.N, grain, [&](int64_t n0, int64_t n1) {
    for (int64_t g = n0; g < n1; g += group) {
      const int64_t ge = std::min(n1, g + group);
      m_range<Kern>(c, g, ge, M);
    }
  });
}

// Entry points of the kernel files: run `type`'s kernel over c (M activation rows). False if the file has
// no kernel for `type`.
bool legacy_run(int64_t type, const Ctx& c, int64_t M);
bool kquant_run(int64_t type, const Ctx& c, int64_t M);

}  // namespace ggml
}  // namespace radixrt
