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
// activation (ggml_vec_dot_q8_0_q8_0's trick) since maddubs wants one unsigned operand.
#include <ATen/ATen.h>
#include <immintrin.h>
#include "../avx2.h"
#include "mm_driver.h"
#include "lblocks.h"

namespace radixrt {
namespace ggml {
namespace {

template <class T>
struct Legacy {
  static constexpr int MAX_MB = T::MIN ? 4 : 8;  // 8 rows' scalar minimums would not fit the registers
  // Outputs (m0 + m, n + r), r < RB, m < MB. Per output: a float accumulator (8 lanes) over the blocks in
  // order, one horizontal sum at the end, plus the minimum's scalar sum.
  template <int RB, int MB>
  static void tile(const Ctx& c, int64_t n, int64_t m0) {
    const int64_t nb = c.K / 32;
    __m256 acc[RB][MB];
    float mins[RB][MB];
    for (int r = 0; r < RB; ++r)
      for (int m = 0; m < MB; ++m) { acc[r][m] = _mm256_setzero_ps(); mins[r][m] = 0.0f; }
    const uint8_t* rows[RB];
    for (int r = 0; r < RB; ++r) rows[r] = c.W + (n + r) * c.row_bytes;
    if (MB <= 2) {  // decode: rows outer, so the tile's bytes are read in address order (one prefetch stream)
      for (int r = 0; r < RB; ++r)
        for (int64_t b = 0; b < nb; ++b) {
          float d, mn;
          _mm_prefetch(reinterpret_cast<const char*>(rows[r] + b * T::BYTES + 1024), _MM_HINT_T0);
          const __m256i q = T::decode(rows[r] + b * T::BYTES, d, mn);
          for (int m = 0; m < MB; ++m) {
            const int64_t a = (m0 + m) * nb + b;
            const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.q + a * 32));
            acc[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot<T>(q, y, act_offset<T>(y))), _mm256_set1_ps(d * c.d[a]),
                                        acc[r][m]);
            if (T::MIN) mins[r][m] += mn * c.s[a];
          }
        }
    } else
    for (int64_t b = 0; b < nb; ++b) {
      __m256i q[RB];
      float d[RB], mn[RB];
      for (int r = 0; r < RB; ++r) q[r] = T::decode(rows[r] + b * T::BYTES, d[r], mn[r]);
      for (int m = 0; m < MB; ++m) {
        const int64_t a = (m0 + m) * nb + b;
        const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.q + a * 32));
        const __m256i yoff = act_offset<T>(y);
        const float dy = c.d[a];
        for (int r = 0; r < RB; ++r) {
          acc[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot<T>(q[r], y, yoff)), _mm256_set1_ps(d[r] * dy), acc[r][m]);
          if (T::MIN) mins[r][m] += mn[r] * c.s[a];
        }
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int m = 0; m < MB; ++m)
        c.out[(m0 + m) * c.N + n + r] = T::MIN ? hsum(acc[r][m]) + mins[r][m] : hsum(acc[r][m]);
  }
};

}  // namespace

bool legacy_run(int64_t type, const Ctx& c, int64_t M) {
  if (type == 2) {  // Q4_0: one output per lane (q4_0_rows.cpp), on AVX-512 and AVX2 alike
    q4_0_run(c, M);
    return true;
  }
  if (gemm512_run(type, c, M)) return true;
  switch (type) {  // gguf's GGMLQuantizationType numbering
    case 3: run<Legacy<Q4_1>>(c, M); return true;
    case 6: run<Legacy<Q5_0>>(c, M); return true;
    case 7: run<Legacy<Q5_1>>(c, M); return true;
    case 8: run<Legacy<Q8_0>>(c, M); return true;
    default: return false;
  }
}

}  // namespace ggml
}  // namespace radixrt
