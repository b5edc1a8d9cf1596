// Probe for issue 44: would a 16-row interleaved Q4_K layout, multiplied with vpdpbusd, beat the mid-row
// tiles (midrows512.h) that run 2-20 activation rows on AVX-512 VNNI today? Torch-free, 2 threads, one
// weight shape, and no change to the runtime. Built and run by benchmarks/q4k_x16_probe.py.
//
// Why it might: gemv512.h's K-quant tiles spend two multiply-pipe instructions (vpmaddubsw + vpdpwssd) per
// 64 int8 multiply-adds, because the sub-block scale is applied in int16 per pair of elements. With 16 weight
// rows interleaved 4 bytes at a time (row r's 4 consecutive elements in dword lane r), one vpdpbusd against an
// activation dword broadcast to all lanes does 64 multiply-adds, and the scale is applied once per 32
// elements (vpmulld on the sub-block's dot product). The outputs of 16 rows land in one register: no
// horizontal sums. This is the layout idea of llama.cpp's ggml-cpu repack (block_q4_Kx8 and friends) and
// llamafile's tinyBLAS, written here from the description only.
//
// The x16 block of 16 rows x 1 super-block (2368 bytes; 16 GGUF blocks are 2304):
//   uint16 d[16], dmin[16]            fp16, per row
//   uint8  sc[8][16]                  6-bit scale of sub-block j, row r
//   uint8  mn[4][16][2]               6-bit minimums of sub-blocks 2i and 2i + 1, row r (pairs for vpdpwssd)
//   uint8  qs[4][8][16][4]            pair of sub-blocks c, group t: row r's GGUF bytes qs[32 c + 4 t .. + 4]
//                                     (low nibbles: sub-block 2c, high nibbles: 2c + 1)
//
// Output: for M in 1 2 4 8 16, the time per product and GMAC/s of both kernels on the same weight (several
// copies cycled, so it comes from memory), and the largest relative difference of each from an fp64
// reference over the same quantized activations.
#include <immintrin.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>
#include "midrows512.h"
#include "q8_act.h"

using namespace radixrt::ggml;

namespace {

constexpr int QK = 256, BQ = 144, XB = 2368;

void scale_min(int j, const uint8_t* q, int& d, int& m) {  // get_scale_min_k4 (ggml-quants.c)
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// GGUF rows [N, K / 256 * 144] -> x16 blocks [N / 16][K / 256][2368]
std::vector<uint8_t> repack(const uint8_t* w, int64_t N, int64_t K) {
  const int64_t ns = K / QK;
  std::vector<uint8_t> x(N / 16 * ns * XB);
  for (int64_t g = 0; g < N / 16; ++g)
    for (int64_t s = 0; s < ns; ++s) {
      uint8_t* o = x.data() + (g * ns + s) * XB;
      for (int r = 0; r < 16; ++r) {
        const uint8_t* b = w + (g * 16 + r) * ns * BQ + s * BQ;
        std::memcpy(o + 2 * r, b, 2);
        std::memcpy(o + 32 + 2 * r, b + 2, 2);
        for (int j = 0; j < 8; ++j) {
          int d, m;
          scale_min(j, b + 4, d, m);
          o[64 + 16 * j + r] = (uint8_t)d;
          o[192 + 32 * (j >> 1) + 2 * r + (j & 1)] = (uint8_t)m;
        }
        for (int c = 0; c < 4; ++c)
          for (int t = 0; t < 8; ++t) std::memcpy(o + 320 + ((c * 8 + t) * 16 + r) * 4, b + 16 + 32 * c + 4 * t, 4);
      }
    }
  return x;
}

#define X16 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

struct Act {  // activation rows quantized per 256 (q8_act.h), plus the per-32 sums in int16 pairs
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int16_t> bsums;
  std::vector<int32_t> ypair;  // [M][ns][4]: sums of sub-blocks 2i (low int16) and 2i + 1 (high)
};

Act quantize(const std::vector<float>& x, int64_t M, int64_t K) {
  const int64_t ns = K / QK;
  Act a{std::vector<int8_t>(M * K), std::vector<float>(M * ns), std::vector<int16_t>(M * K / 16),
        std::vector<int32_t>(M * ns * 4)};
  for (int64_t m = 0; m < M; ++m) {
    radixrt::q8::quantize_row_256(x.data() + m * K, K, a.q.data() + m * K, a.d.data() + m * ns,
                                  a.bsums.data() + m * K / 16);
    for (int64_t s = 0; s < ns; ++s)
      for (int i = 0; i < 4; ++i) {
        const int16_t* b = a.bsums.data() + m * K / 16 + s * 16 + 4 * i;
        const uint16_t lo = (uint16_t)(int16_t)(b[0] + b[1]), hi = (uint16_t)(int16_t)(b[2] + b[3]);
        a.ypair[(m * ns + s) * 4 + i] = (int32_t)((uint32_t)lo | ((uint32_t)hi << 16));
      }
  }
  return a;
}

// Groups [g0, g1) of 16 weight rows against activation rows [m0, m0 + MB).
template <int MB>
X16 void x16_tile(const uint8_t* X, const Act& a, int64_t K, int64_t N, float* out, int64_t g0, int64_t g1,
                  int64_t m0) {
  const int64_t ns = K / QK;
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t g = g0; g < g1; ++g) {
    __m512 acc[MB];
    for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t s = 0; s < ns; ++s) {
      const uint8_t* b = X + (g * ns + s) * XB;
      __m512i isum[MB];
      for (int m = 0; m < MB; ++m) isum[m] = _mm512_setzero_si512();
      for (int j = 0; j < 8; ++j) {
        __m512i dot[MB];
        for (int m = 0; m < MB; ++m) dot[m] = _mm512_setzero_si512();
        for (int t = 0; t < 8; ++t) {
          const __m512i v = _mm512_loadu_si512(b + 320 + ((j >> 1) * 8 + t) * 64);
          const __m512i w = _mm512_and_si512(j & 1 ? _mm512_srli_epi16(v, 4) : v, low);
          for (int m = 0; m < MB; ++m)
            dot[m] = _mm512_dpbusd_epi32(dot[m], w, _mm512_set1_epi32((int)load_u32(reinterpret_cast<const uint8_t*>(
                                                        a.q.data() + (m0 + m) * K + s * QK + 32 * j + 4 * t))));
        }
        const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 64 + 16 * j)));
        for (int m = 0; m < MB; ++m) isum[m] = _mm512_add_epi32(isum[m], _mm512_mullo_epi32(dot[m], sc));
      }
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
      const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32)));
      __m512i mn[4];
      for (int i = 0; i < 4; ++i)
        mn[i] = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 192 + 32 * i)));
      for (int m = 0; m < MB; ++m) {
        const int32_t* yp = a.ypair.data() + ((m0 + m) * ns + s) * 4;
        __m512i corr = _mm512_setzero_si512();
        for (int i = 0; i < 4; ++i) corr = _mm512_dpwssd_epi32(corr, mn[i], _mm512_set1_epi32(yp[i]));
        const __m512 dy = _mm512_set1_ps(a.d[(m0 + m) * ns + s]);
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[m]), _mm512_mul_ps(dw, dy), acc[m]);
        acc[m] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(corr), _mm512_mul_ps(dm, dy), acc[m]);
      }
    }
    for (int m = 0; m < MB; ++m) _mm512_storeu_ps(out + (m0 + m) * N + g * 16, acc[m]);
  }
}

X16 void x16_rows(const uint8_t* X, const Act& a, int64_t M, int64_t K, int64_t N, float* out, int64_t g0, int64_t g1) {
  // weight groups per chunk: ~128 KB stays in L2 while every pass of 8 activation rows goes over it
  const int64_t chunk = std::max<int64_t>(1, (128 << 10) / (K / QK * XB));
  for (int64_t c = g0; c < g1; c += chunk) {
    const int64_t ce = std::min(g1, c + chunk);
    for (int64_t m0 = 0; m0 < M;) {
      const int64_t mb = std::min<int64_t>(8, M - m0);
      switch (mb) {
        case 1: x16_tile<1>(X, a, K, N, out, c, ce, m0); break;
        case 2: x16_tile<2>(X, a, K, N, out, c, ce, m0); break;
        case 3: x16_tile<3>(X, a, K, N, out, c, ce, m0); break;
        case 4: x16_tile<4>(X, a, K, N, out, c, ce, m0); break;
        case 5: x16_tile<5>(X, a, K, N, out, c, ce, m0); break;
        case 6: x16_tile<6>(X, a, K, N, out, c, ce, m0); break;
        case 7: x16_tile<7>(X, a, K, N, out, c, ce, m0); break;
        default: x16_tile<8>(X, a, K, N, out, c, ce, m0); break;
      }
      m0 += mb;
    }
  }
}

double ref_dot(const uint8_t* row, const int8_t* q, const float* d, int64_t K) {  // fp64 over dequantized blocks
  double sum = 0;
  for (int64_t s = 0; s < K / QK; ++s) {
    const uint8_t* b = row + s * BQ;
    const double dw = _cvtsh_ss(*reinterpret_cast<const uint16_t*>(b));
    const double dm = _cvtsh_ss(*reinterpret_cast<const uint16_t*>(b + 2));
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      scale_min(j, b + 4, sc, mn);
      for (int i = 0; i < 32; ++i) {
        const int qv = (j & 1) ? b[16 + 32 * (j >> 1) + i] >> 4 : b[16 + 32 * (j >> 1) + i] & 0xF;
        sum += (dw * sc * qv - dm * mn) * (double)q[s * QK + 32 * j + i] * d[s];
      }
    }
  }
  return sum;
}

// Runs f(thread, begin, end) on 2 threads over [0, n) split in two, `reps` times, with a barrier between calls.
template <class F>
double timed(int64_t n, int reps, F f) {
  std::atomic<int> arrived{0};
  auto body = [&](int t) {
    const int64_t half = (n / 2 + 15) / 16 * 16, b = t ? half : 0, e = t ? n : half;
    for (int r = 0; r < reps; ++r) {
      f(r, b, e);
      arrived.fetch_add(1);
      while (arrived.load() < 2 * (r + 1)) _mm_pause();
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::thread other(body, 1);
  body(0);
  other.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t N = argc > 1 ? std::atoll(argv[1]) : 8192, K = argc > 2 ? std::atoll(argv[2]) : 2048;
  const int copies = argc > 3 ? std::atoi(argv[3]) : 8, reps = argc > 4 ? std::atoi(argv[4]) : 40;
  const int64_t ns = K / QK, row_bytes = ns * BQ;
  std::mt19937 rng(1);
  std::vector<std::vector<uint8_t>> ws(copies), xs(copies);
  for (int c = 0; c < copies; ++c) {
    ws[c].resize(N * row_bytes);
    for (auto& v : ws[c]) v = (uint8_t)rng();
    for (int64_t r = 0; r < N; ++r)
      for (int64_t s = 0; s < ns; ++s) {  // fp16 d in [1e-3, 1e-2], dmin in [1e-4, 1e-3]
        uint8_t* b = ws[c].data() + r * row_bytes + s * BQ;
        const uint16_t d = _cvtss_sh(1e-3f + 9e-3f * (rng() % 1000) / 1000.0f, 0);
        const uint16_t dm = _cvtss_sh(1e-4f + 9e-4f * (rng() % 1000) / 1000.0f, 0);
        std::memcpy(b, &d, 2);
        std::memcpy(b + 2, &dm, 2);
      }
    xs[c] = repack(ws[c].data(), N, K);
  }
  std::normal_distribution<float> nd;
  std::printf("Q4_K N=%lld K=%lld, %d copies (%.1f MB GGUF, %.1f MB x16), 2 threads\n", (long long)N, (long long)K,
              copies, copies * N * row_bytes / 1e6, copies * xs[0].size() / 1e6);
  for (int64_t M : {1, 2, 4, 8, 16}) {
    std::vector<float> x(M * K);
    for (auto& v : x) v = nd(rng);
    const Act a = quantize(x, M, K);
    std::vector<float> o1(M * N), o2(M * N);
    Ctx c{nullptr, row_bytes, K, N, a.q.data(), a.d.data(), nullptr, a.bsums.data(), o1.data()};
    auto mid = [&](int r, int64_t b, int64_t e) {
      Ctx cc = c;
      cc.W = ws[r % copies].data();
      mid512::rows<Q4_K, true>(cc, M, nullptr, b, e);
    };
    auto x16 = [&](int r, int64_t b, int64_t e) {
      x16_rows(xs[r % copies].data(), a, M, K, N, o2.data(), b / 16, e / 16);
    };
    timed(N, copies, mid);  // warm-up
    timed(N, copies, x16);
    double tm = 1e9, tx = 1e9;
    for (int i = 0; i < 3; ++i) {  // alternating, best of 3
      tm = std::min(tm, timed(N, reps, mid));
      tx = std::min(tx, timed(N, reps, x16));
    }
    // accuracy on copy 0 against fp64 over 64 sampled outputs
    c.W = ws[0].data();
    mid512::rows<Q4_K, true>(c, M, nullptr, 0, N);
    x16_rows(xs[0].data(), a, M, K, N, o2.data(), 0, N / 16);
    double e1 = 0, e2 = 0, scale = 0;
    for (int i = 0; i < 64; ++i) {
      const int64_t m = i % M, n = (i * 2654435761u) % N;
      const double r = ref_dot(ws[0].data() + n * row_bytes, a.q.data() + m * K, a.d.data() + m * ns, K);
      scale = std::max(scale, std::fabs(r));
      e1 = std::max(e1, std::fabs(o1[m * N + n] - r));
      e2 = std::max(e2, std::fabs(o2[m * N + n] - r));
    }
    const double macs = (double)M * N * K;
    std::printf("M=%2lld  mid512 %8.3f ms %6.1f GMAC/s  x16 %8.3f ms %6.1f GMAC/s  x16/mid %.2fx  "
                "max err/|ref| %.1e %.1e\n",
                (long long)M, tm * 1e3, macs / tm / 1e9, tx * 1e3, macs / tx / 1e9, tm / tx, e1 / scale, e2 / scale);
  }
  return 0;
}
