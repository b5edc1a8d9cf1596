// The x16 tiles (radixrt/kernels/quant/x16_*.h) outside torch: for each type and activation row count M, the
// time of one product on 2 threads with the weight from memory (copies cycled), GMAC/s and GB/s of weight, and
// three checks of the bits: AVX-512 VNNI tiles = AVX2 tiles = a scalar reading of x16_layout.h's arithmetic
// straight from the GGUF blocks (so the repack is checked too). Built and run by benchmarks/x16_bench.py.
#include <immintrin.h>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include "q8_act.h"
#include "x16_512.h"
#include "x16_amx.h"
#include "x16_avx2.h"

using namespace radixrt::ggml;
using namespace radixrt::ggml::x16;

namespace {

struct Act {
  std::vector<int8_t> q;
  std::vector<float> d, s;
  std::vector<int16_t> bsums;
  std::vector<int32_t> ypair, yoff;
};

Act quantize(const std::vector<float>& x, int64_t M, int64_t K, int qk) {
  const int64_t nb = K / qk;
  Act a;
  a.q.resize(M * K);
  a.d.resize(M * nb);
  if (qk == 256) {
    a.bsums.resize(M * K / 16);
    a.ypair.resize(M * nb * 4);
  } else {
    a.s.resize(M * nb);
    a.yoff.resize(M * nb);
  }
  for (int64_t m = 0; m < M; ++m) {
    int8_t* qm = a.q.data() + m * K;
    if (qk == 256) {
      int16_t* bs = a.bsums.data() + m * K / 16;
      radixrt::q8::quantize_row_256(x.data() + m * K, K, qm, a.d.data() + m * nb, bs);
      for (int64_t b = 0; b < nb; ++b)
        for (int i = 0; i < 4; ++i) {
          const int16_t* p = bs + 16 * b + 4 * i;
          const uint32_t lo = (uint16_t)(int16_t)(p[0] + p[1]), hi = (uint16_t)(int16_t)(p[2] + p[3]);
          a.ypair[(m * nb + b) * 4 + i] = (int32_t)(lo | (hi << 16));
        }
    } else {
      radixrt::q8::quantize_row_32(x.data() + m * K, K, qm, a.d.data() + m * nb, a.s.data() + m * nb);
      for (int64_t b = 0; b < nb; ++b) {
        int32_t sum = 0;
        for (int i = 0; i < 32; ++i) sum += qm[32 * b + i];
        a.yoff[m * nb + b] = -128 * sum;
      }
    }
  }
  return a;
}

// The arithmetic of x16_layout.h read from one GGUF row (independent of the repack).
float spec_row(const std::string& type, const uint8_t* row, const Act& a, int64_t m, int64_t K) {
  float acc = 0.0f;
  const int8_t* yq = a.q.data() + m * K;
  if (type == "Q8_0") {
    for (int64_t b = 0; b < K / 32; ++b) {
      const uint8_t* p = row + 34 * b;
      int32_t D = 0;
      for (int i = 0; i < 32; ++i) D += (int8_t)p[2 + i] * yq[32 * b + i];
      acc = std::fmaf((float)D, fp16(p) * a.d[m * (K / 32) + b], acc);
    }
    return acc;
  }
  for (int64_t s = 0; s < K / 256; ++s) {
    const int8_t* y = yq + 256 * s;
    const int16_t* bs = a.bsums.data() + m * K / 16 + 16 * s;
    const float dy = a.d[m * (K / 256) + s];
    if (type == "Q6_K") {
      const uint8_t* p = row + 210 * s;
      int32_t I = 0;
      for (int e = 0; e < 256; ++e) {
        const int h = e / 128, k = (e % 128) / 32, l = e % 32;
        const uint8_t qlb = p[64 * h + 32 * (k & 1) + l], qhb = p[128 + 32 * h + l];
        const int q = ((k < 2 ? qlb : qlb >> 4) & 0xF) | (((qhb >> (2 * k)) & 3) << 4);
        I += (int8_t)p[192 + e / 16] * q * y[e];
      }
      for (int g = 0; g < 16; ++g) I -= 32 * (int8_t)p[192 + g] * bs[g];
      acc = std::fmaf((float)I, fp16(p + 208) * dy, acc);
      continue;
    }
    const int bytes = type == "Q4_K" ? 144 : 176;
    const uint8_t* p = row + bytes * s;
    const uint8_t* qs = p + (type == "Q4_K" ? 16 : 48);
    int32_t I = 0, C = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, mn;
      scale_min_k4(j, p + 4, sc, mn);
      int32_t D = 0;
      for (int i = 0; i < 32; ++i) {
        int q = (j & 1 ? qs[32 * (j >> 1) + i] >> 4 : qs[32 * (j >> 1) + i]) & 0xF;
        if (type == "Q5_K") q |= ((p[16 + i] >> j) & 1) << 4;
        D += q * y[32 * j + i];
      }
      I += sc * D;
      C += mn * (bs[2 * j] + bs[2 * j + 1]);
    }
    acc = std::fmaf((float)I, fp16(p) * dy, acc);
    acc = std::fmaf(-(float)C, fp16(p + 2) * dy, acc);
  }
  return acc;
}

template <class T, int MB>
void pass(const XCtx& c, int64_t m0, int64_t g0, int64_t g1, bool wide) {
  if (wide) {
    if constexpr (MB <= 8)
      for (int64_t g = g0; g < g1; ++g) tile512<T, MB>(c, g, m0);
  } else if constexpr (MB <= 4) {
    for (int64_t g = g0; g < g1; ++g) {
      tile256<T, MB>(c, g, 0, m0);
      tile256<T, MB>(c, g, 1, m0);
    }
  }
}

// the runtime's loop nest (x16_mm.cpp rows()) on one thread's groups
template <class T>
void rows(const XCtx& c, int64_t M, int64_t g0, int64_t g1, bool wide) {
  const int most = wide ? 8 : 4;
  const int64_t passes = (M + most - 1) / most;
  const int64_t chunk = passes > 1 ? std::max<int64_t>(1, (256 << 10) / (c.K / T::QK * T::BYTES)) : g1 - g0;
  for (int64_t g = g0; g < g1; g += chunk) {
    const int64_t ge = std::min(g1, g + chunk);
    for (int64_t i = 0, m0 = 0; i < passes; ++i) {
      const int64_t mb = (M - m0) / (passes - i);
      switch (mb) {
        case 1: pass<T, 1>(c, m0, g, ge, wide); break;
        case 2: pass<T, 2>(c, m0, g, ge, wide); break;
        case 3: pass<T, 3>(c, m0, g, ge, wide); break;
        case 4: pass<T, 4>(c, m0, g, ge, wide); break;
        case 5: pass<T, 5>(c, m0, g, ge, wide); break;
        case 6: pass<T, 6>(c, m0, g, ge, wide); break;
        case 7: pass<T, 7>(c, m0, g, ge, wide); break;
        default: pass<T, 8>(c, m0, g, ge, wide); break;
      }
      m0 += mb;
    }
  }
}

// f(rep, begin_group, end_group) on 2 threads, `reps` times, with a barrier between calls; seconds per call
template <class F>
double timed(int64_t G, int reps, F f) {
  std::atomic<int> arrived{0};
  auto body = [&](int t) {
    const int64_t half = G / 2, b = t ? half : 0, e = t ? G : half;
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

template <class T>
int bench(const char* name, int64_t N, int64_t K, int copies, int reps, bool has512) {
  const int64_t nb = K / T::QK, row = nb * T::GGUF, G = N / 16;
  std::mt19937 rng(7);
  std::vector<std::vector<uint8_t>> ws(copies), xs(copies);
  for (int c = 0; c < copies; ++c) {
    ws[c].resize(N * row);
    for (auto& v : ws[c]) v = (uint8_t)rng();
    for (int64_t r = 0; r < N; ++r)
      for (int64_t s = 0; s < nb; ++s) {  // finite fp16 scales: d in [1e-3, 1e-2], dmin in [1e-4, 1e-3]
        uint8_t* b = ws[c].data() + r * row + s * T::GGUF;
        const uint16_t d = _cvtss_sh(1e-3f + 9e-3f * (rng() % 1000) / 1000.0f, 0);
        const uint16_t dm = _cvtss_sh(1e-4f + 9e-4f * (rng() % 1000) / 1000.0f, 0);
        const int at = std::string(name) == "Q6_K" ? 208 : 0;
        std::memcpy(b + at, &d, 2);
        if (T::QK == 256 && at == 0) std::memcpy(b + 2, &dm, 2);
      }
    xs[c].resize(G * nb * T::BYTES);
    repack<T>(ws[c].data(), K, 0, G, xs[c].data());
  }
  std::normal_distribution<float> nd;
  int bad = 0;
  for (int64_t M : {1, 2, 3, 4, 8, 16, 32}) {
    std::vector<float> x(M * K);
    for (auto& v : x) v = nd(rng);
    const Act a = quantize(x, M, K, T::QK);
    std::vector<float> o512(M * N, -1.0f), o256(M * N, -2.0f), oamx(M * N, -3.0f);
    XCtx c{nullptr, K, N, a.q.data(), a.d.data(), a.bsums.data(), a.ypair.data(), a.yoff.data(), nullptr};
    auto run = [&](bool wide, std::vector<float>& o) {
      return [&, wide](int r, int64_t b, int64_t e) {
        XCtx cc = c;
        cc.W = xs[r % copies].data();
        cc.out = o.data();
        rows<T>(cc, M, b, e, wide);
      };
    };
    auto run_amx = [&](int r, int64_t b, int64_t e) {
      XCtx cc = c;
      cc.W = xs[r % copies].data();
      cc.out = oamx.data();
      rows_amx<T>(cc, M, b, e);
    };
    const bool amx = has512 && amx_ready() && M >= 2;
    double t512 = 0, t256 = 1e9, tamx = 0;
    if (has512) timed(G, copies, run(true, o512));
    if (amx) timed(G, copies, run_amx);
    timed(G, copies, run(false, o256));
    if (has512) t512 = 1e9;
    if (amx) tamx = 1e9;
    for (int i = 0; i < 3; ++i) {  // alternating, best of 3
      if (has512) t512 = std::min(t512, timed(G, reps, run(true, o512)));
      if (amx) tamx = std::min(tamx, timed(G, reps, run_amx));
      t256 = std::min(t256, timed(G, reps, run(false, o256)));
    }
    // bits: every output of copy 0 on both paths, 64 sampled outputs against the scalar spec
    c.W = xs[0].data();
    c.out = o256.data();
    rows<T>(c, M, 0, G, false);
    if (has512) {
      c.out = o512.data();
      rows<T>(c, M, 0, G, true);
    }
    if (amx) {
      c.out = oamx.data();
      rows_amx<T>(c, M, 0, G);
    }
    int64_t diff = 0, spec_bad = 0;
    for (int64_t i = 0; has512 && i < M * N; ++i) diff += std::memcmp(&o512[i], &o256[i], 4) != 0;
    for (int64_t i = 0; amx && i < M * N; ++i) diff += std::memcmp(&oamx[i], &o256[i], 4) != 0;
    for (int i = 0; i < 64; ++i) {
      const int64_t m = i % M, n = (i * 2654435761u) % N;
      const float want = spec_row(name, ws[0].data() + n * row, a, m, K);
      spec_bad += std::memcmp(&want, &o256[m * N + n], 4) != 0;
    }
    bad += diff + spec_bad;
    const double macs = (double)M * N * K, gb = (double)G * nb * T::BYTES / 1e9;
    std::printf("%s N=%lld K=%lld M=%2lld  vnni512 %7.3f ms %6.1f GMAC/s %5.1f GB/s  amx %7.3f ms %6.1f GMAC/s "
                "%5.1f GB/s  avx2 %7.3f ms %6.1f GMAC/s  bits differ %lld  spec mismatches %lld/64\n",
                name, (long long)N, (long long)K, (long long)M, t512 * 1e3, has512 ? macs / t512 / 1e9 : 0.0,
                has512 ? gb / t512 : 0.0, tamx * 1e3, amx ? macs / tamx / 1e9 : 0.0, amx ? gb / tamx : 0.0,
                t256 * 1e3, macs / t256 / 1e9, (long long)diff, (long long)spec_bad);
    std::fflush(stdout);
  }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "all";
  const int64_t N = argc > 2 ? std::atoll(argv[2]) : 8192, K = argc > 3 ? std::atoll(argv[3]) : 2048;
  const int copies = argc > 4 ? std::atoi(argv[4]) : 8, reps = argc > 5 ? std::atoi(argv[5]) : 20;
  __builtin_cpu_init();
  const bool has512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vnni");
  int bad = 0;
  if (which == "all" || which == "Q4_K") bad += bench<Q4_K>("Q4_K", N, K, copies, reps, has512);
  if (which == "all" || which == "Q5_K") bad += bench<Q5_K>("Q5_K", N, K, copies, reps, has512);
  if (which == "all" || which == "Q6_K") bad += bench<Q6_K>("Q6_K", N, K, copies, reps, has512);
  if (which == "all" || which == "Q8_0") bad += bench<Q8_0>("Q8_0", N, K, copies, reps, has512);
  std::printf("%s\n", bad ? "BITS DIFFER" : "bits: vnni512 = amx = avx2 = spec");
  return bad ? 1 : 0;
}
