// GGUF's 32-element block types on int8 activations (q8_act.h, 32-blocks), in the file's own layout.
//
// Blocks (llama.cpp ggml-common.h, dequantize_row_* in ggml-quants.c); element j < 16 is the low nibble of
// qs[j], element j + 16 its high nibble:
//   Q4_0, 18 bytes: fp16 d, qs[16];             w = (q - 8) d
//   Q4_1, 20 bytes: fp16 d, fp16 m, qs[16];     w = q d + m
//   Q5_0, 22 bytes: fp16 d, qh (u32), qs[16];   w = (q - 16) d, bit j of qh the fifth bit of element j
//   Q5_1, 24 bytes: fp16 d, fp16 m, qh, qs[16]; w = q d + m
//   Q8_0, 34 bytes: fp16 d, int8 q[32];         w = q d
// sum_j w_j x_j ~ d dy sum_j q_j qy_j (+ m dy sum_j qy_j for the types with a minimum, as llama.cpp's
// ggml_vec_dot_q4_1_q8_1 in ggml-cpu/arch/x86/quants.c), the integer part a maddubs dot product; the
// zero-point types subtract their offset inside the integer sum; Q8_0 moves the weight's sign onto the
//
// This header: the block decoders and the integer dot of one block, shared by legacy_blocks.cpp and
// gemm512.cpp.
#pragma once
#include <immintrin.h>
#include "block_io.h"

namespace radixrt {
namespace ggml {

struct Q4_0 {
  static constexpr int BYTES = 18;
  static constexpr int OFFSET_SHIFT = 3;  // q - 8
  static constexpr bool MIN = false;
  static inline __m256i decode(const uint8_t* b, float& d, float& m) {
    d = fp16(b);
    m = 0.0f;
    return nibbles16(b + 2);
  }
};

struct Q4_1 {
  static constexpr int OFFSET_SHIFT = 0;
  static constexpr int BYTES = 20;
  static constexpr bool MIN = true;
  static inline __m256i decode(const uint8_t* b, float& d, float& m) {
    d = fp16(b);
    m = fp16(b + 2);
    return nibbles16(b + 4);
  }
};

struct Q5_0 {
  static constexpr int BYTES = 22;
  static constexpr int OFFSET_SHIFT = 4;  // q - 16
  static constexpr bool MIN = false;
  static inline __m256i decode(const uint8_t* b, float& d, float& m) {
    d = fp16(b);
    m = 0.0f;
    return _mm256_or_si256(nibbles16(b + 6), bit4_from_bits32(load_u32(b + 2)));
  }
};

struct Q5_1 {
  static constexpr int OFFSET_SHIFT = 0;
  static constexpr int BYTES = 24;
  static constexpr bool MIN = true;
  static inline __m256i decode(const uint8_t* b, float& d, float& m) {
    d = fp16(b);
    m = fp16(b + 2);
    return _mm256_or_si256(nibbles16(b + 8), bit4_from_bits32(load_u32(b + 4)));
  }
};

struct Q8_0 {
  static constexpr int OFFSET_SHIFT = 0;
  static constexpr int BYTES = 34;
  static constexpr bool MIN = false;
  static inline __m256i decode(const uint8_t* b, float& d, float& m) {
    d = fp16(b);
    m = 0.0f;
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
  }
};

// The activation-side term of a block's dot product, once per activation block: for the zero-point types
// 2^OFFSET_SHIFT times its pairwise sums (int16; the offset of 8 or 16 subtracted in the integer dot).
template <class T>
inline __m256i act_offset(__m256i y) {
  if (T::OFFSET_SHIFT == 0) return _mm256_setzero_si256();
  return _mm256_slli_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), y), T::OFFSET_SHIFT);
}

// int32 x 8 partial sums of (q - offset) . y over one block; exact in int16 (|q y| pairs <= 2 * 31 * 127,
// offsets <= 16 * 2 * 127).
template <class T>
inline __m256i dot(__m256i q, __m256i y, __m256i yoff) {
  const __m256i ones = _mm256_set1_epi16(1);
  if (T::OFFSET_SHIFT) return _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(q, y), yoff), ones);
  if (T::MIN) return _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), ones);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(y, q)), ones);
}

}  // namespace ggml
}  // namespace radixrt
