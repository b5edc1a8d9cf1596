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
//   amx          : AMX TDPBSUD, 16 x 16 x 64 int8 per instruction, 4 C tiles from 2 A and 2 B tiles in
//                  registers (x16_amx.h's instruction); returns -1 where the OS does not grant the tile state
//
// Built and run by benchmarks/int8_peak.py (g++ -O3; the chains unrolled so every accumulator stays in a
// register: at -O2 they lived on the stack and timed store forwarding); one symbol per form, one ctypes call
// per thread.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstdint>

#define T2 __attribute__((target("avx2,fma")))
#define T512 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")))

// Each form is one function made by PEAK: CHAINS accumulators, chain i multiplying a[i % 4] by b[i / 4] (8
// distinct products per iteration, so the compiler cannot share one between chains); the empty asm makes every
// operand new each iteration, and the return value depends on every accumulator, so nothing is optimised away.
#define CHAINS 8
#define PEAK(NAME, TARGET, VEC, REG, A, B, ACC0, STEP, ADD, OUT)                                 \
  TARGET int64_t NAME(int64_t iters) {                                                            \
    VEC a[4], b[2], acc[CHAINS];                                                                  \
    for (int i = 0; i < 4; ++i) a[i] = A;                                                         \
    for (int i = 0; i < 2; ++i) b[i] = B;                                                         \
    for (int i = 0; i < CHAINS; ++i) acc[i] = ACC0;                                               \
    for (int64_t it = 0; it < iters; ++it) {                                                      \
      _Pragma("GCC unroll 8") for (int i = 0; i < CHAINS; ++i) acc[i] = STEP(acc[i], a[i % 4], b[i / 4]);  \
      __asm__ volatile("" : REG(a[0]), REG(a[1]), REG(a[2]), REG(a[3]), REG(b[0]), REG(b[1]));   \
    }                                                                                             \
    VEC s = acc[0];                                                                               \
    for (int i = 1; i < CHAINS; ++i) s = ADD(s, acc[i]);                                          \
    return OUT(s);                                                                                \
  }
#define YMM(v) "+x"(v)
#define ZMM(v) "+v"(v)

// one chain step of each form
T2 static inline __m256i maddubs_step(__m256i acc, __m256i a, __m256i b) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)));
}
T512 static inline __m512i kq_step(__m512i acc, __m512i a, __m512i b) {
  return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(a, b), _mm512_set1_epi16(7));
}
T512 static inline __m512 fma_step(__m512 acc, __m512 a, __m512 b) { return _mm512_fmadd_ps(a, b, acc); }
T2 static inline int64_t lane0(__m256i s) { return _mm256_extract_epi32(s, 0); }
T512 static inline int64_t fsum(__m512 s) { return (int64_t)_mm512_reduce_add_ps(s); }

extern "C" {

PEAK(avx2_maddubs, T2, __m256i, YMM, _mm256_set1_epi8((char)(3 + i)), _mm256_set1_epi8((char)(5 + i)),
     _mm256_set1_epi32(i), maddubs_step, _mm256_add_epi32, lane0)
PEAK(vnni256, T512, __m256i, YMM, _mm256_set1_epi8((char)(3 + i)), _mm256_set1_epi8((char)(5 + i)),
     _mm256_set1_epi32(i), _mm256_dpbusd_epi32, _mm256_add_epi32, lane0)
PEAK(vnni512, T512, __m512i, ZMM, _mm512_set1_epi8((char)(3 + i)), _mm512_set1_epi8((char)(5 + i)),
     _mm512_set1_epi32(i), _mm512_dpbusd_epi32, _mm512_add_epi32, _mm512_reduce_add_epi32)
PEAK(kq512, T512, __m512i, ZMM, _mm512_set1_epi8((char)(3 + i)), _mm512_set1_epi8((char)(5 + i)),
     _mm512_set1_epi32(i), kq_step, _mm512_add_epi32, _mm512_reduce_add_epi32)
PEAK(fma512, T512, __m512, ZMM, _mm512_set1_ps(1.0f + 1e-4f * i), _mm512_set1_ps(0.9999f - 1e-4f * i),
     _mm512_set1_ps((float)i), fma_step, _mm512_add_ps, fsum)

// 4 independent accumulator tiles, each TDPBSUD 16 x 16 x 64 = 16384 multiply-adds; per iteration 4 of them.
__attribute__((target("amx-tile,amx-int8"))) int64_t amx(int64_t iters) {
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0) return -1;
  struct alignas(64) {
    uint8_t palette = 1, start = 0, rsv[14] = {};
    uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
    uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
  } cfg;
  alignas(64) static thread_local int8_t buf[16 * 64];
  for (int i = 0; i < 16 * 64; ++i) buf[i] = (int8_t)(i % 7);
  _tile_loadconfig(&cfg);
  _tile_loadd(4, buf, 64);
  _tile_loadd(5, buf, 64);
  _tile_loadd(6, buf, 64);
  _tile_loadd(7, buf, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbsud(0, 4, 5);
    _tile_dpbsud(1, 4, 7);
    _tile_dpbsud(2, 6, 5);
    _tile_dpbsud(3, 6, 7);
  }
  alignas(64) static thread_local int32_t out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}

}  // extern "C"
