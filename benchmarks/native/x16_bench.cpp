// The x16 tiles (radixrt/kernels/quant/x16_*.h) outside torch: for each type and activation row count M, the
// time of one product on 2 threads with the weight from memory (copies cycled), GMAC/s and GB/s of weight, and
// three checks of the bits: AVX-512 VNNI tiles = AVX2 tiles = a scalar reading of x16_layout.h's arithmetic
// straight from the GGUF blocks (x16_spec.h; so the repack is checked too). Built and run by benchmarks/x16_bench.py.
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
#include "x16_512.h"
#include "x16_amx.h"
#include "x16_avx2.h"
#include "x16_legacy.h"
#include "x16_spec.h"

using namespace radixrt::ggml;
using namespace radixrt::ggml::x16;
using x16_bench::Act;

namespace {

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
        const std::string t = name;
        const int at = t == "Q6_K" ? 208 : 0;
        std::memcpy(b + at, &d, 2);
        if (t == "Q4_K" || t == "Q5_K" || t == "Q4_1" || t == "Q5_1") std::memcpy(b + 2, &dm, 2);
      }
    xs[c].resize(G * nb * T::BYTES);
    repack<T>(ws[c].data(), K, 0, G, xs[c].data());
  }
  std::normal_distribution<float> nd;
  int bad = 0;
  for (int64_t M : {1, 2, 3, 4, 8, 16, 32}) {
    std::vector<float> x(M * K);
    for (auto& v : x) v = nd(rng);
    const Act a = x16_bench::quantize(x, M, K, T::QK);
    std::vector<float> o512(M * N, -1.0f), o256(M * N, -2.0f), oamx(M * N, -3.0f);
    XCtx c{nullptr, K, N, a.q.data(), a.d.data(), a.bsums.data(), a.ypair.data(), a.yoff.data(),
           a.ysum.data(), nullptr};
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
      const float want = x16_bench::spec_row(name, ws[0].data() + n * row, a, m, K);
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
  if (which == "all" || which == "Q4_0") bad += bench<Q4_0>("Q4_0", N, K, copies, reps, has512);
  if (which == "all" || which == "Q4_1") bad += bench<Q4_1>("Q4_1", N, K, copies, reps, has512);
  if (which == "all" || which == "Q5_0") bad += bench<Q5_0>("Q5_0", N, K, copies, reps, has512);
  if (which == "all" || which == "Q5_1") bad += bench<Q5_1>("Q5_1", N, K, copies, reps, has512);
  std::printf("%s\n", bad ? "BITS DIFFER" : "bits: vnni512 = amx = avx2 = spec");
  return bad ? 1 : 0;
}
