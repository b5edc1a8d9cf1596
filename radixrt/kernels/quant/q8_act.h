// Activations quantized to int8 per row, the way llama.cpp quantizes the other operand of its integer dot
// products (quantize_row_q8_0 / q8_1 for 32-blocks, quantize_row_q8_K for 256-blocks, ggml-quants.c), so
// that every weight type's inner product is maddubs on bytes. Each row's blocks depend on that row only:
// an output row never depends on which other rows share the call (batch invariance).
//
// Both forms use d = amax / 127 and q = round-to-nearest-even(x / d) (cvtps_epi32 under the default MXCSR;
// x * (1 / d), as llama.cpp does). Inputs must be finite.
#pragma once
#include <immintrin.h>
#include <cstdint>
#include "../avx2.h"

namespace radixrt {
namespace q8 {

// The 32 floats at v -> 32 int8 at q (in order); returns the scale d; *isum = sum of the q.
inline float quantize_32(const float* v, int8_t* q, int32_t* isum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undo packs' per-lane interleave
  __m256 f[4];
  __m256 amax = _mm256_setzero_ps();
  for (int j = 0; j < 4; ++j) {
    f[j] = _mm256_loadu_ps(v + 8 * j);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, f[j]));
  }
  __m128 a = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  a = _mm_max_ps(a, _mm_movehl_ps(a, a));
  a = _mm_max_ss(a, _mm_movehdup_ps(a));
  const float d = _mm_cvtss_f32(a) / 127.0f;
  const __m256 id = _mm256_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
  __m256i qi[4];
  for (int j = 0; j < 4; ++j) qi[j] = _mm256_cvtps_epi32(_mm256_mul_ps(f[j], id));
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
  const __m256i p16 = _mm256_packs_epi32(qi[0], qi[1]), p16b = _mm256_packs_epi32(qi[2], qi[3]);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16, p16b), order));
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
  *isum = _mm_cvtsi128_si32(t);
  return d;
}

// Q8_0/Q8_1-style: one row of K floats -> qx[K], d[K/32], s[K/32] = d * sum(q) (for the types with a
// minimum, whose term is m * sum(x) ~ m * s, as llama.cpp's block_q8_1.s).
inline void quantize_row_32(const float* x, int64_t K, int8_t* qx, float* d, float* s) {
  for (int64_t b = 0; b < K / 32; ++b) {
    int32_t isum;
    d[b] = quantize_32(x + 32 * b, qx + 32 * b, &isum);
    s[b] = d[b] * (float)isum;
  }
}

// Q8_K-style: one row of K floats -> qx[K], d[K/256] (one scale per 256), bsums[K/16] (int16 sums of each
// 16 q, for the K-quants' minimum and offset terms).
inline void quantize_row_256(const float* x, int64_t K, int8_t* qx, float* d, int16_t* bsums) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < K / 256; ++b) {
    const float* v = x + 256 * b;
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < 32; ++j) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + 8 * j)));
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    a = _mm_max_ss(a, _mm_movehdup_ps(a));
    const float db = _mm_cvtss_f32(a) / 127.0f;
    const __m256 id = _mm256_set1_ps(db > 0.0f ? 1.0f / db : 0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int j = 0; j < 8; ++j) {
      __m256i qi[4];
      for (int k = 0; k < 4; ++k) qi[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 32 * j + 8 * k), id));
      const __m256i p16 = _mm256_packs_epi32(qi[0], qi[1]), p16b = _mm256_packs_epi32(qi[2], qi[3]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qx + 256 * b + 32 * j),
                          _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16, p16b), order));
      for (int h = 0; h < 2; ++h) {
        const __m256i s = _mm256_add_epi32(qi[2 * h], qi[2 * h + 1]);
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
        bsums[16 * b + 2 * j + h] = (int16_t)_mm_cvtsi128_si32(t);
      }
    }
    d[b] = db;
  }
}

}  // namespace q8
}  // namespace radixrt
