// Q4_0 tiles with one output per vector lane (16 per 512-bit register, 8 per 256-bit), for every row count.
//
// The arithmetic (every path: AVX2, AVX-512 decode, AVX-512 prefill, so a row's bits never depend on M):
// per output (m, n), over the blocks b of K in order, acc = fma(float(S_b), float(d_w,b * d_x,b), acc) from
// acc = 0, where S_b = sum_j (q_j - 8) y_j is the block's exact int32 dot product (|S_b| <= 8 * 128 * 32, so
// float(S_b) is exact too) and the scale product is rounded to float once. The output is acc.
//
// Why not the other types' 8 float lanes per output (lblocks.h / gemm512.h): there every block costs a cvt,
// a scale product and an FMA per two outputs, three times the one vpdpbusd of integer work, and Q4_0 ran at
// 0.58x of llama-bench pp512. With the block's whole sum in one lane the float part is one cvt + mul + FMA per
// 16 outputs. The idea (outputs of 8 or 16 weight rows side by side in a register, activations broadcast 4
// bytes at a time) is llama.cpp's Q4_0 8x8 repack (ggml-cpu/repack.cpp); here the weight keeps the file's
// layout and 16 rows' blocks are transposed in registers (decode) or into a per-call scratch (prefill).
//
// The integer sum: vpdpbusd / maddubs of the unsigned nibbles q against the int8 activations, started at
// the activation block's offset -8 * sum_j y_j (computed once per call): exact whatever the grouping.
#pragma once
#include <immintrin.h>
#include <cstdint>
#include <cstring>
#include "block_io.h"

#ifndef RADIXRT_X512
#define RADIXRT_X512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#endif

namespace radixrt {
namespace ggml {
namespace q40 {

constexpr int BYTES = 18;  // fp16 d, 16 bytes of nibbles (element j < 16 low nibble of byte j, j + 16 high)

// AVX2: the 8 weight rows rows[0..8) (a tail repeats its last row) x activation rows m0 .. m0 + MB; lane r of
// acc[m] is output (m0 + m, rows[r]). off: [M][K / 32] activation offsets. idx: rows[r] - rows[0]. pf:
// prefetch distance (0: none).
template <int MB>
inline void tile8(const Ctx& c, const int32_t* off, const uint8_t* const* rows, __m256i idx, int64_t m0,
                  int64_t pf, __m256* acc) {
  const int64_t nb = c.K / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i q[8];
    for (int r = 0; r < 8; ++r) {
      const uint8_t* p = rows[r] + b * BYTES;
      if (pf && (b & 3) == 0) {  // 4 blocks = 72 bytes: two lines per row
        _mm_prefetch(reinterpret_cast<const char*>(p + pf), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(p + pf + 64), _MM_HINT_T0);
      }
      q[r] = nibbles16(p + 2);
    }
    // the 8 rows' fp16 d: dwords at each block's start, low halves packed (values < 2^16: packus is exact)
    const int* first = reinterpret_cast<const int*>(rows[0] + b * BYTES);
    const __m256i dd = _mm256_and_si256(_mm256_i32gather_epi32(first, idx, 1), _mm256_set1_epi32(0xFFFF));
    const __m256 dw = _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(dd), _mm256_extracti128_si256(dd, 1)));
    for (int m = 0; m < MB; ++m) {
      const int64_t a = (m0 + m) * nb + b;
      const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.q + a * 32));
      __m256i p[8];
      for (int r = 0; r < 8; ++r) p[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(q[r], y), ones);
      // 8 rows' 8 partial sums -> one sum per row, lane r (integer adds: exact in any order)
      const __m256i a4 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
      const __m256i b4 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
      __m256i s = _mm256_add_epi32(_mm256_permute2x128_si256(a4, b4, 0x20), _mm256_permute2x128_si256(a4, b4, 0x31));
      s = _mm256_add_epi32(s, _mm256_set1_epi32(off[a]));
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(c.d[a])), acc[m]);
    }
  }
}

// AVX-512: block `boff` (byte offset in the row) of 16 rows transposed: q[k] lane r = row r's elements
// 4k .. 4k + 3 (k < 4: low nibbles of bytes 4k .. 4k + 3; k >= 4: elements 16 + 4(k - 4) .., their high
// nibbles), so q[k] pairs with the activation block's dword k. dw lane r = row r's d. idx: rows[r] - rows[0].
RADIXRT_X512 inline void panel16(const uint8_t* const* rows, __m512i idx, int64_t boff, __m512i* q, __m512& dw) {
  __m512i z[4];  // z[i], 128-bit lane j: row i + 4j's 16 bytes of nibbles
  for (int i = 0; i < 4; ++i) {
    auto ld = [&](int r) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[r] + boff + 2)); };
    __m512i v = _mm512_castsi128_si512(ld(i));
    v = _mm512_inserti32x4(v, ld(i + 4), 1);
    v = _mm512_inserti32x4(v, ld(i + 8), 2);
    z[i] = _mm512_inserti32x4(v, ld(i + 12), 3);
  }
  // 4x4 dword transpose per 128-bit lane: t[k] lane j dword i = row 4j + i's dword k
  const __m512i u0 = _mm512_unpacklo_epi32(z[0], z[1]), u1 = _mm512_unpackhi_epi32(z[0], z[1]);
  const __m512i u2 = _mm512_unpacklo_epi32(z[2], z[3]), u3 = _mm512_unpackhi_epi32(z[2], z[3]);
  const __m512i t[4] = {_mm512_unpacklo_epi64(u0, u2), _mm512_unpackhi_epi64(u0, u2), _mm512_unpacklo_epi64(u1, u3),
                        _mm512_unpackhi_epi64(u1, u3)};
  const __m512i lo = _mm512_set1_epi8(0x0F);
  for (int k = 0; k < 4; ++k) {
    q[k] = _mm512_and_si512(t[k], lo);
    q[4 + k] = _mm512_and_si512(_mm512_srli_epi16(t[k], 4), lo);
  }
  dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(idx, rows[0] + boff, 1)));
}

// One activation block (y: 32 int8, its offset and scale) against a transposed block: acc's 16 outputs.
RADIXRT_X512 inline __m512 step16(const __m512i* q, __m512 dw, const int8_t* y, int32_t off, float dx, __m512 acc) {
  __m512i s0 = _mm512_set1_epi32(off), s1 = _mm512_setzero_si512();  // two chains: half the latency
  for (int k = 0; k < 8; k += 2) {
    s0 = _mm512_dpbusd_epi32(s0, q[k], _mm512_set1_epi32((int)load_u32(reinterpret_cast<const uint8_t*>(y) + 4 * k)));
    s1 = _mm512_dpbusd_epi32(s1, q[k + 1],
                             _mm512_set1_epi32((int)load_u32(reinterpret_cast<const uint8_t*>(y) + 4 * k + 4)));
  }
  const __m512i s = _mm512_add_epi32(s0, s1);
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc);
}

// Decode and small M: 16 rows read from the file (transposed in registers) x activation rows m0 .. m0 + MB.
// pf: bytes ahead to prefetch (the next tile's rows).
template <int MB>
RADIXRT_X512 void direct16(const Ctx& c, const int32_t* off, const uint8_t* const* rows, __m512i idx, int64_t m0,
                           int64_t pf, __m512* acc) {
  const int64_t nb = c.K / 32;
  for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    if ((b & 3) == 0)  // 4 blocks = 72 bytes: two lines per row
      for (int r = 0; r < 16; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(rows[r] + b * BYTES + pf), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(rows[r] + b * BYTES + pf + 64), _MM_HINT_T0);
      }
    __m512i q[8];
    __m512 dw;
    panel16(rows, idx, b * BYTES, q, dw);
    for (int m = 0; m < MB; ++m) {
      const int64_t a = (m0 + m) * nb + b;
      acc[m] = step16(q, dw, c.q + a * 32, off[a], c.d[a], acc[m]);
    }
  }
}

// Prefill: a panel of 16 rows transposed into scratch ([K / 32][9] registers: q[0..8), dw) x MB rows.
template <int MB>
RADIXRT_X512 void scratch16(const Ctx& c, const int32_t* off, const __m512i* panel, int64_t m0, __m512* acc) {
  const int64_t nb = c.K / 32;
  for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m512i* p = panel + b * 9;
    __m512i q[8];
    for (int k = 0; k < 8; ++k) q[k] = _mm512_load_si512(p + k);
    const __m512 dw = _mm512_castsi512_ps(_mm512_load_si512(p + 8));
    for (int m = 0; m < MB; ++m) {
      const int64_t a = (m0 + m) * nb + b;
      acc[m] = step16(q, dw, c.q + a * 32, off[a], c.d[a], acc[m]);
    }
  }
}

}  // namespace q40
}  // namespace ggml
}  // namespace radixrt
