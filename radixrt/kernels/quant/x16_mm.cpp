// Products over the x16 layouts (x16_layout.h): radixrt_ggml.mm with ggml_type | 256, and
// radixrt_ggml.x16_repack, which builds the layout from the file's blocks once, at load.
//
// Every row count runs the same per-lane arithmetic (x16_layout.h), so an output row's bits do not depend on
// M, on its position in x, on the thread count or on the CPU's instruction set (AVX-512 VNNI or AVX2).
//
// Loop nest: the groups of 16 weight rows split over threads; per thread, chunks of groups small enough to
// stay in L2 (~256 KB) while every pass of up to 8 (AVX2: 4) activation rows goes over them. A decode step
// (M <= 8) is one pass: the weight streams from memory once, each byte unpacked once for every row.
#include <ATen/ATen.h>
#include <torch/library.h>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>
#include "../alloc.h"
#include "../parallel.h"
#include "mm_driver.h"
#include "q8_act.h"
#include "x16_512.h"
#include "x16_amx.h"
#include "x16_avx2.h"
#include "x16_legacy.h"

namespace radixrt {
namespace ggml {
namespace x16 {
namespace {

struct Info {
  int64_t type, qk, gguf, bytes;
  const char* name;
};
constexpr Info INFOS[] = {{2, Q4_0::QK, Q4_0::GGUF, Q4_0::BYTES, "Q4_0"},
                          {3, Q4_1::QK, Q4_1::GGUF, Q4_1::BYTES, "Q4_1"},
                          {6, Q5_0::QK, Q5_0::GGUF, Q5_0::BYTES, "Q5_0"},
                          {7, Q5_1::QK, Q5_1::GGUF, Q5_1::BYTES, "Q5_1"},
                          {8, Q8_0::QK, Q8_0::GGUF, Q8_0::BYTES, "Q8_0"},
                          {12, Q4_K::QK, Q4_K::GGUF, Q4_K::BYTES, "Q4_K"},
                          {13, Q5_K::QK, Q5_K::GGUF, Q5_K::BYTES, "Q5_K"},
                          {14, Q6_K::QK, Q6_K::GGUF, Q6_K::BYTES, "Q6_K"}};

const Info& info(int64_t type) {
  for (const Info& i : INFOS)
    if (i.type == type) return i;
  TORCH_CHECK(false, "radixrt_ggml x16: no x16 layout for ggml type ", type,
              " (Q4_0=2, Q4_1=3, Q5_0=6, Q5_1=7, Q8_0=8, Q4_K=12, Q5_K=13, Q6_K=14)");
  return INFOS[0];
}

template <class T, int MB>
void pass(const XCtx& c, int64_t m0, int64_t g0, int64_t g1, bool wide) {
  if constexpr (MB <= 8) {
    if (wide) {
      for (int64_t g = g0; g < g1; ++g) tile512<T, MB>(c, g, m0);
      return;
    }
  }
  if constexpr (MB <= 4)
    for (int64_t g = g0; g < g1; ++g) {
      tile256<T, MB>(c, g, 0, m0);
      tile256<T, MB>(c, g, 1, m0);
    }
}

template <class T>
void pass_m(const XCtx& c, int64_t m0, int64_t mb, int64_t g0, int64_t g1, bool wide) {
  switch (mb) {
    case 1: pass<T, 1>(c, m0, g0, g1, wide); break;
    case 2: pass<T, 2>(c, m0, g0, g1, wide); break;
    case 3: pass<T, 3>(c, m0, g0, g1, wide); break;
    case 4: pass<T, 4>(c, m0, g0, g1, wide); break;
    case 5: pass<T, 5>(c, m0, g0, g1, wide); break;
    case 6: pass<T, 6>(c, m0, g0, g1, wide); break;
    case 7: pass<T, 7>(c, m0, g0, g1, wide); break;
    default: pass<T, 8>(c, m0, g0, g1, wide); break;
  }
}

// All M rows over groups [g0, g1): per L2 chunk of groups, ceil(M / most) passes of nearly equal row counts.
template <class T>
void rows(const XCtx& c, int64_t M, int64_t g0, int64_t g1, bool wide) {
  const int most = wide ? 8 : 4;
  const int64_t passes = (M + most - 1) / most;
  const int64_t group_bytes = c.K / T::QK * T::BYTES;
  const int64_t chunk = passes > 1 ? std::max<int64_t>(1, (256 << 10) / group_bytes) : g1 - g0;
  for (int64_t g = g0; g < g1; g += chunk) {
    const int64_t ge = std::min(g1, g + chunk);
    for (int64_t i = 0, m0 = 0; i < passes; ++i) {
      const int64_t mb = (M - m0) / (passes - i);
      pass_m<T>(c, m0, mb, g, ge, wide);
      m0 += mb;
    }
  }
}

// AMX from this many rows (RADIXRT_X16_AMX_MIN_ROWS, read once; 0 turns AMX off): below, VNNI's passes. 9:
// up to 8 rows VNNI is one pass and faster (its per-row work is cheaper than AMX's per-batch unpack, tile
// stores and fold); from 9 it takes two passes, and AMX one (x16_bench.py, 2026-12-07: Q4_K 8192 x 2048 at
// M = 8 0.81 vs 1.01 ms, M = 16 1.33 vs 1.20, M = 32 2.41 vs 2.12).
int64_t amx_min_rows() {
  static const int64_t n = [] {
    const char* v = std::getenv("RADIXRT_X16_AMX_MIN_ROWS");
    return v && *v ? std::atoll(v) : 9;
  }();
  return n;
}

template <class T>
void run(const XCtx& c, int64_t M) {
  const bool wide = gemm512_enabled(), amx = wide && amx_min_rows() > 0 && M >= amx_min_rows() && amx_ready();
  const int64_t G = c.N / 16;
  const int64_t grain = M * c.N * c.K < (1 << 16) ? G : 1;
  radixrt::parallel_for(0, G, grain, [&](int64_t g0, int64_t g1) {
    if (amx) rows_amx<T>(c, M, g0, g1);
    else rows<T>(c, M, g0, g1, wide);
  });
}

}  // namespace

at::Tensor mm(const at::Tensor& x, const at::Tensor& w, int64_t type) {
  const Info& t = info(type);
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
              "radixrt_ggml.mm(", t.name, " x16): x must be a contiguous fp32 CPU tensor [M, K], got ", x.scalar_type(),
              " ", x.sizes());
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K % t.qk == 0, "radixrt_ggml.mm(", t.name, " x16): K = ", K, " is not a multiple of the block size ", t.qk);
  const int64_t nb = K / t.qk, group_bytes = nb * t.bytes;
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kByte && w.dim() == 2 && w.is_contiguous() &&
                  w.size(1) == group_bytes,
              "radixrt_ggml.mm(", t.name, " x16): w must be contiguous uint8 [N / 16, K / ", t.qk, " * ", t.bytes,
              "] = [N / 16, ", group_bytes, "] for K = ", K, ", got ", w.scalar_type(), " ", w.sizes());
  const int64_t N = w.size(0) * 16;
  auto out = radixrt::empty_like_dtype({M, N}, x);
  if (M == 0 || N == 0) return out;
  if (K == 0) return out.zero_();

  const bool k256 = t.qk == 256;
  std::vector<int8_t> q(M * K);
  std::vector<float> d(M * nb), s(k256 ? 0 : M * nb);
  std::vector<int16_t> bsums(k256 ? M * (K / 16) : 0);
  std::vector<int32_t> ypair(k256 ? M * nb * 4 : 0), yoff(k256 ? 0 : M * nb), ysum(k256 ? 0 : M * nb);
  const float* xp = x.data_ptr<float>();
  radixrt::parallel_for(0, M, std::max<int64_t>(1, (1 << 16) / K), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      int8_t* qm = q.data() + m * K;
      if (k256) {
        int16_t* bs = bsums.data() + m * (K / 16);
        radixrt::q8::quantize_row_256(xp + m * K, K, qm, d.data() + m * nb, bs);
        for (int64_t b = 0; b < nb; ++b)
          for (int i = 0; i < 4; ++i) {  // (Y_2i, Y_2i+1), Y_j = the sum of sub-block j = two per-16 sums
            const int16_t* p = bs + 16 * b + 4 * i;
            const uint32_t lo = (uint16_t)(int16_t)(p[0] + p[1]), hi = (uint16_t)(int16_t)(p[2] + p[3]);
            ypair[(m * nb + b) * 4 + i] = (int32_t)(lo | (hi << 16));
          }
      } else {
        radixrt::q8::quantize_row_32(xp + m * K, K, qm, d.data() + m * nb, s.data() + m * nb);
        for (int64_t b = 0; b < nb; ++b) {
          int32_t sum = 0;
          for (int i = 0; i < 32; ++i) sum += qm[32 * b + i];
          ysum[m * nb + b] = sum;
          yoff[m * nb + b] = -128 * sum;
        }
      }
    }
  });
  const XCtx c{w.data_ptr<uint8_t>(), K, N, q.data(), d.data(), bsums.data(), ypair.data(), yoff.data(), ysum.data(),
               out.data_ptr<float>()};
  switch (type) {
    case 2: run<Q4_0>(c, M); break;
    case 3: run<Q4_1>(c, M); break;
    case 6: run<Q5_0>(c, M); break;
    case 7: run<Q5_1>(c, M); break;
    case 8: run<Q8_0>(c, M); break;
    case 12: run<Q4_K>(c, M); break;
    case 13: run<Q5_K>(c, M); break;
    case 14: run<Q6_K>(c, M); break;
  }
  return out;
}

void repack_op(const at::Tensor& w, int64_t type, at::Tensor out) {
  const Info& t = info(type);
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kByte && w.dim() == 2 && w.is_contiguous() &&
                  w.size(1) % t.gguf == 0 && w.size(0) % 16 == 0,
              "radixrt_ggml.x16_repack(", t.name, "): w must be contiguous uint8 [N, K / ", t.qk, " * ", t.gguf,
              "] with N a multiple of 16, got ", w.scalar_type(), " ", w.sizes());
  const int64_t nb = w.size(1) / t.gguf, K = nb * t.qk, G = w.size(0) / 16;
  TORCH_CHECK(out.device().is_cpu() && out.scalar_type() == at::kByte && out.dim() == 2 && out.is_contiguous() &&
                  out.size(0) == G && out.size(1) == nb * t.bytes,
              "radixrt_ggml.x16_repack(", t.name, "): out must be contiguous uint8 [", G, ", ", nb * t.bytes, "], got ",
              out.scalar_type(), " ", out.sizes());
  const uint8_t* src = w.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  radixrt::parallel_for(0, G, 16, [&](int64_t g0, int64_t g1) {
    switch (type) {
      case 2: x16::repack<Q4_0>(src, K, g0, g1, dst); break;
      case 3: x16::repack<Q4_1>(src, K, g0, g1, dst); break;
      case 6: x16::repack<Q5_0>(src, K, g0, g1, dst); break;
      case 7: x16::repack<Q5_1>(src, K, g0, g1, dst); break;
      case 8: x16::repack<Q8_0>(src, K, g0, g1, dst); break;
      case 12: x16::repack<Q4_K>(src, K, g0, g1, dst); break;
      case 13: x16::repack<Q5_K>(src, K, g0, g1, dst); break;
      case 14: x16::repack<Q6_K>(src, K, g0, g1, dst); break;
    }
  });
}

// What runs a product of `rows` rows in this process: "amx", "avx512" (VNNI) or "avx2".
std::string isa(int64_t rows) {
  if (!gemm512_enabled()) return "avx2";
  return amx_min_rows() > 0 && rows >= amx_min_rows() && amx_ready() ? "amx" : "avx512";
}

}  // namespace x16
}  // namespace ggml
}  // namespace radixrt

TORCH_LIBRARY_FRAGMENT(radixrt_ggml, m) {
  // GGUF blocks [N, K / block * type_size] uint8 of ggml_type -> its x16 layout, written into out
  // [N / 16, K / block * x16 bytes] uint8 (x16_layout.h; the caller allocates it, in huge pages); N % 16 == 0
  m.def("x16_repack(Tensor w, int ggml_type, Tensor(a!) out) -> ()");
  // the instruction set a product of `rows` activation rows runs on here: "amx", "avx512" or "avx2"
  m.def("x16_isa(int rows) -> str");
}

TORCH_LIBRARY_IMPL(radixrt_ggml, CPU, m) { m.impl("x16_repack", &radixrt::ggml::x16::repack_op); }
TORCH_LIBRARY_IMPL(radixrt_ggml, CatchAll, m) { m.impl("x16_isa", &radixrt::ggml::x16::isa); }
