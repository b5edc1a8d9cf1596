// The box's integer-dot-product peak, for the roofline of the multi-row GGUF products (issue 44): how many
// int8 multiply-adds per second one thread sustains with each instruction form the kernels use, all operands
// in registers (no memory traffic), 8 independent accumulator chains so latency never limits, each with its own
// operand pair so the compiler cannot share one product between chains.
//
//   avx2_maddubs : vpmaddubsw + vpmaddwd + vpaddd on 256 bits (the AVX2 tiles: 32 MACs per 3 instructions)
//   vnni256      : vpdpbusd on 256 bits (32 MACs per instruction)
//   vnni512      : vpdpbusd on 512 bits (64 MACs per instruction)
//   kq512        : vpmaddubsw + vpdpwssd on 512 bits (gemv512.h's K-quant tiles: 64 MACs per 2 instructions)
//   fma512       : vfmadd231ps on 512 bits (fp32 FLOP pairs, for F16/BF16 tiles)
//
// Built and run by benchmarks/int8_peak.py (g++ -O3; the chains unrolled so every accumulator stays in a
// register: at -O2 they lived on the stack and timed store forwarding); one symbol per form, one ctypes call
// per thread.
#include <immintrin.h>
#include <cstdint>

#define T2 __attribute__((target("avx2,fma")))
#define T512 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")))

// Each returns a value that depends on every accumulator, so nothing is optimised away. Chain i multiplies
// a[i % 4] by b[i / 4]: 8 distinct products per iteration; the empty asm makes every operand new each time.
#define CHAINS 8

extern "C" {

T2 int64_t avx2_maddubs(int64_t iters) {
  __m256i a[4], b[2], acc[CHAINS];
  for (int i = 0; i < 4; ++i) a[i] = _mm256_set1_epi8((char)(3 + i));
  for (int i = 0; i < 2; ++i) b[i] = _mm256_set1_epi8((char)(5 + i));
  const __m256i one = _mm256_set1_epi16(1);
  for (int i = 0; i < CHAINS; ++i) acc[i] = _mm256_set1_epi32(i);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 8
    for (int i = 0; i < CHAINS; ++i)
      acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(a[i % 4], b[i / 4]), one));
    __asm__ volatile("" : "+x"(a[0]), "+x"(a[1]), "+x"(a[2]), "+x"(a[3]), "+x"(b[0]), "+x"(b[1]));
  }
  __m256i s = acc[0];
  for (int i = 1; i < CHAINS; ++i) s = _mm256_add_epi32(s, acc[i]);
  return _mm256_extract_epi32(s, 0);
}

T512 int64_t vnni256(int64_t iters) {
  __m256i a[4], b[2], acc[CHAINS];
  for (int i = 0; i < 4; ++i) a[i] = _mm256_set1_epi8((char)(3 + i));
  for (int i = 0; i < 2; ++i) b[i] = _mm256_set1_epi8((char)(5 + i));
  for (int i = 0; i < CHAINS; ++i) acc[i] = _mm256_set1_epi32(i);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 8
    for (int i = 0; i < CHAINS; ++i) acc[i] = _mm256_dpbusd_epi32(acc[i], a[i % 4], b[i / 4]);
    __asm__ volatile("" : "+x"(a[0]), "+x"(a[1]), "+x"(a[2]), "+x"(a[3]), "+x"(b[0]), "+x"(b[1]));
  }
  __m256i s = acc[0];
  for (int i = 1; i < CHAINS; ++i) s = _mm256_add_epi32(s, acc[i]);
  return _mm256_extract_epi32(s, 0);
}

T512 int64_t vnni512(int64_t iters) {
  __m512i a[4], b[2], acc[CHAINS];
  for (int i = 0; i < 4; ++i) a[i] = _mm512_set1_epi8((char)(3 + i));
  for (int i = 0; i < 2; ++i) b[i] = _mm512_set1_epi8((char)(5 + i));
  for (int i = 0; i < CHAINS; ++i) acc[i] = _mm512_set1_epi32(i);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 8
    for (int i = 0; i < CHAINS; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a[i % 4], b[i / 4]);
    __asm__ volatile("" : "+v"(a[0]), "+v"(a[1]), "+v"(a[2]), "+v"(a[3]), "+v"(b[0]), "+v"(b[1]));
  }
  __m512i s = acc[0];
  for (int i = 1; i < CHAINS; ++i) s = _mm512_add_epi32(s, acc[i]);
  return _mm512_reduce_add_epi32(s);
}

T512 int64_t kq512(int64_t iters) {
  __m512i a[4], b[2], acc[CHAINS];
  for (int i = 0; i < 4; ++i) a[i] = _mm512_set1_epi8((char)(3 + i));
  for (int i = 0; i < 2; ++i) b[i] = _mm512_set1_epi8((char)(5 + i));
  const __m512i sc = _mm512_set1_epi16(7);
  for (int i = 0; i < CHAINS; ++i) acc[i] = _mm512_set1_epi32(i);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 8
    for (int i = 0; i < CHAINS; ++i) acc[i] = _mm512_dpwssd_epi32(acc[i], _mm512_maddubs_epi16(a[i % 4], b[i / 4]), sc);
    __asm__ volatile("" : "+v"(a[0]), "+v"(a[1]), "+v"(a[2]), "+v"(a[3]), "+v"(b[0]), "+v"(b[1]));
  }
  __m512i s = acc[0];
  for (int i = 1; i < CHAINS; ++i) s = _mm512_add_epi32(s, acc[i]);
  return _mm512_reduce_add_epi32(s);
}

T512 int64_t fma512(int64_t iters) {
  __m512 a[4], b[2], acc[CHAINS];
  for (int i = 0; i < 4; ++i) a[i] = _mm512_set1_ps(1.0f + 1e-4f * i);
  for (int i = 0; i < 2; ++i) b[i] = _mm512_set1_ps(0.9999f - 1e-4f * i);
  for (int i = 0; i < CHAINS; ++i) acc[i] = _mm512_set1_ps((float)i);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 8
    for (int i = 0; i < CHAINS; ++i) acc[i] = _mm512_fmadd_ps(a[i % 4], b[i / 4], acc[i]);
    __asm__ volatile("" : "+v"(a[0]), "+v"(a[1]), "+v"(a[2]), "+v"(a[3]), "+v"(b[0]), "+v"(b[1]));
  }
  __m512 s = acc[0];
  for (int i = 1; i < CHAINS; ++i) s = _mm512_add_ps(s, acc[i]);
  return (int64_t)_mm512_reduce_add_ps(s);
}

}  // extern "C"
