// What every GGUF block kernel shares and that needs no torch header (so the block decoders also compile in a
// standalone test harness): the call's operands (Ctx) and the bit helpers of the 32-element block types.
#pragma once
#include <immintrin.h>
#include <cstdint>
#include <cstring>

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
  // AVX-512 tiles of the types with a minimum (gemv512.h ltile): s transposed, st[b * st_ld + m] = s[m, b],
  // padded by 8 zeros so 8 rows load from any m (gemm512.cpp with_sums fills it)
  const float* st = nullptr;
  int64_t st_ld = 0;
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

}  // namespace ggml
}  // namespace radixrt
