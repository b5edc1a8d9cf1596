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
// Each weight row's super-block is decoded once per tile (kblocks.h), then used by the MB activation rows of
// the tile. With AVX-512 VNNI, products of 3 or more rows run gemm512.cpp instead (same bits).
#include <ATen/ATen.h>
#include <immintrin.h>
#include "../avx2.h"
#include "mm_driver.h"
#include "kblocks.h"

namespace radixrt {
namespace ggml {
namespace {

template <class T>
struct KQuant {
  static constexpr int MAX_MB = 8;
  template <int RB, int MB>
  static void tile(const Ctx& c, int64_t n, int64_t m0) {
    if (MB <= 4) stream<RB, MB>(c, n, m0);  // 3-4 rows too: 1B Q4_K_M t3 74.8 -> 44.7 ms on AVX2
    else decoded<RB, MB>(c, n, m0);
  }

  // Many activation rows: each weight super-block decoded once into L1 scratch, then used by the MB rows.
  template <int RB, int MB>
  static void decoded(const Ctx& c, int64_t n, int64_t m0) {
    const int64_t ns = c.K / 256;
    __m256 acc[RB][MB];
    for (int r = 0; r < RB; ++r)
      for (int m = 0; m < MB; ++m) acc[r][m] = _mm256_setzero_ps();
    Decoded w[RB];
    for (int64_t s = 0; s < ns; ++s) {
      for (int r = 0; r < RB; ++r) decode<T>(c.W + (n + r) * c.row_bytes + s * T::BYTES, w[r]);
      const int8_t* y[MB];
      for (int m = 0; m < MB; ++m) y[m] = c.q + (m0 + m) * c.K + s * 256;
      __m256i isum[RB][MB];
      for (int r = 0; r < RB; ++r)
        for (int m = 0; m < MB; ++m) isum[r][m] = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j)
        for (int m = 0; m < MB; ++m) {
          const __m256i yv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[m] + 32 * j));
          for (int r = 0; r < RB; ++r)
            isum[r][m] = _mm256_add_epi32(isum[r][m],
                                          _mm256_madd_epi16(_mm256_maddubs_epi16(w[r].q[j], yv), w[r].sc[j]));
        }
      for (int m = 0; m < MB; ++m) {
        const int64_t a = (m0 + m) * ns + s;
        const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.bsums + a * 16));
        for (int r = 0; r < RB; ++r) acc[r][m] = fold<T>(acc[r][m], isum[r][m], bs, w[r].aux, w[r].d, w[r].dmin, c.d[a]);
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int m = 0; m < MB; ++m) c.out[(m0 + m) * c.N + n + r] = hsum(acc[r][m]);
  }

  // Decode (1-2 rows, memory-bound): each sub-block decoded in registers and used at once, the activations
  // re-read from L1 per weight row. Spilling 8 rows' decoded super-blocks to the stack, as `decoded` does,
  // cost more than the weight's own read here. Same vectors, same sums, same bits as `decoded`.
  template <int RB, int MB>
  static void stream(const Ctx& c, int64_t n, int64_t m0) {
    const int64_t ns = c.K / 256;
    __m256 acc[RB][MB];
    for (int r = 0; r < RB; ++r)
      for (int m = 0; m < MB; ++m) acc[r][m] = _mm256_setzero_ps();
    // rows outer: the tile's weight bytes are then read in address order, one stream the hardware prefetcher
    // follows (K = 2048 rows are ~1 KB: RB interleaved streams that short never trained it)
    for (int r = 0; r < RB; ++r) {
      for (int64_t s = 0; s < ns; ++s) {
        const uint8_t* p = c.W + (n + r) * c.row_bytes + s * T::BYTES;
        for (int l = 0; l < T::BYTES; l += 64)  // ~1 KB ahead, in address order
          _mm_prefetch(reinterpret_cast<const char*>(p + 1024 + l), _MM_HINT_T0);
        Head h;
        T::head(p, h);
        __m256i isum[MB];
        for (int m = 0; m < MB; ++m) isum[m] = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {
          const __m256i qv = T::q(p, j), sv = T::sc(h, j);
          for (int m = 0; m < MB; ++m) {
            const __m256i yv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.q + (m0 + m) * c.K + s * 256 + 32 * j));
            isum[m] = _mm256_add_epi32(isum[m], _mm256_madd_epi16(_mm256_maddubs_epi16(qv, yv), sv));
          }
        }
        for (int m = 0; m < MB; ++m) {
          const int64_t a = (m0 + m) * ns + s;
          const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.bsums + a * 16));
          acc[r][m] = fold<T>(acc[r][m], isum[m], bs, h.aux, h.d, h.dmin, c.d[a]);
        }
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int m = 0; m < MB; ++m) c.out[(m0 + m) * c.N + n + r] = hsum(acc[r][m]);
  }
};

#define RADIXRT_VNNI256 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

// Decode (1 row) where the CPU has AVX-512 VNNI: KQuant::stream with vpdpwssd on 256 bits in place of
// madd + add (the same exact int32 sums, so the same bits), in the same address order. Why: in cache the
// AVX2 tile reads ~45 GB/s of Q4_K on 2 threads, near what memory gives, so each instruction saved per
// sub-block shows; gemv512.h's 512-bit tiles save more but read 4 rows interleaved, slower from memory
// here (gemm512.cpp, decode512).
template <class T>
struct KQuantVnni {
  // weight rows n .. n + RB against activation row m0
  template <int RB>
  RADIXRT_VNNI256 static void tile(const Ctx& c, int64_t n, int64_t m0) {
    const int64_t ns = c.K / 256;
    const int8_t* y = c.q + m0 * c.K;
    for (int r = 0; r < RB; ++r) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t s = 0; s < ns; ++s) {
        // No software prefetch: one address-ordered stream per thread is what the hardware prefetcher
        // follows best; prefetching 1 KB ahead read 3-10% slower from memory (issue 26, in-process A/B).
        const uint8_t* p = c.W + (n + r) * c.row_bytes + s * T::BYTES;
        Head h;
        T::head(p, h);
        __m256i isum = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {
          const __m256i yv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + s * 256 + 32 * j));
          isum = _mm256_dpwssd_epi32(isum, _mm256_maddubs_epi16(T::q(p, j), yv), T::sc(h, j));
        }
        const int64_t a = m0 * ns + s;
        const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.bsums + a * 16));
        acc = fold<T>(acc, isum, bs, h.aux, h.d, h.dmin, c.d[a]);
      }
      c.out[m0 * c.N + n + r] = hsum(acc);
    }
  }

  // as run() (mm_driver.h) splits one row's product: the same chunks, tiles of 4 weight rows
  static void run1(const Ctx& c) {
    const int64_t grain = c.N * c.K < (1 << 16) ? c.N : 16;
    radixrt::parallel_for(0, c.N, grain, [&](int64_t n0, int64_t n1) {
      int64_t n = n0;
      for (; n + 4 <= n1; n += 4) tile<4>(c, n, 0);
      for (; n < n1; ++n) tile<1>(c, n, 0);
    });
  }
};

}  // namespace

bool kquant_run(int64_t type, const Ctx& c, int64_t M) {
  if (M == 1 && gemm512_enabled()) {  // the 1-row tile above, unless RADIXRT_GGML_DECODE512=1 (gemm512.cpp)
    if (!decode512()) {
      switch (type) {
        case 12: KQuantVnni<Q4_K>::run1(c); return true;
        case 13: KQuantVnni<Q5_K>::run1(c); return true;
        case 14: KQuantVnni<Q6_K>::run1(c); return true;
        default: return false;
      }
    }
  }
  if (gemm512_run(type, c, M)) return true;
  switch (type) {  // gguf's GGMLQuantizationType numbering
    case 12: run<KQuant<Q4_K>>(c, M); return true;
    case 13: run<KQuant<Q5_K>>(c, M); return true;
    case 14: run<KQuant<Q6_K>>(c, M); return true;
    default: return false;
  }
}

}  // namespace ggml
}  // namespace radixrt
