// Fused elementwise ops of a decoder layer for the CPU (fp32, AVX2): at decode batch sizes each is a few
// hundred floats, so a step is dominated by per-op dispatch, not arithmetic. One op here replaces two to six
// ATen ops (vLLM's fused_add_rms_norm, silu_and_mul and rotary_embedding are the same idea on GPU). And
// greedy sampling's argmax, which torch splits over its OpenMP threads at a vocabulary's width, paying a
// wake-up of ~100 us per step for a 10 us scan.
//
// Rounding follows the unfused torch ops (no FMA contraction where torch multiplies and adds separately),
// so fp32 results stay within an ulp or two of transformers', which keeps greedy tokens identical.
#include <ATen/ATen.h>
#include <torch/library.h>
#include "../alloc.h"
#include "../parallel.h"
#include <immintrin.h>
#include "../avx2.h"
#include <cmath>
#include <cstdint>
#include <limits>

namespace {

using radixrt::hsum;
using radixrt::exp256;

void check2d(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.dtype() == at::kFloat && x.dim() == 2 && x.stride(1) == 1, name, " must be fp32 [M, H], inner stride 1");
}

// out[m] = x[m] / sqrt(mean(x[m]^2) + eps) * w   (x * rsqrt(var + eps), then the weight, as transformers)
void norm_row(const float* x, const float* w, float* out, int64_t H, float eps) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= H; i += 16) {
    const __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
    a0 = _mm256_add_ps(a0, _mm256_mul_ps(v0, v0));
    a1 = _mm256_add_ps(a1, _mm256_mul_ps(v1, v1));
  }
  float ss = hsum(_mm256_add_ps(a0, a1));
  for (; i < H; ++i) ss += x[i] * x[i];
  const float r = 1.0f / std::sqrt(ss / (float)H + eps);
  const __m256 rv = _mm256_set1_ps(r);
  i = 0;
  for (; i + 8 <= H; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), rv)));
  for (; i < H; ++i) out[i] = w[i] * (x[i] * r);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  check2d(x, "x");
  const int64_t M = x.size(0), H = x.size(1);
  TORCH_CHECK(w.is_contiguous() && w.numel() == H && w.dtype() == at::kFloat, "w must be fp32 [H]");
  auto out = radixrt::empty_like_dtype({M, H}, x);
  for (int64_t m = 0; m < M; ++m)
    norm_row(x.data_ptr<float>() + m * x.stride(0), w.data_ptr<float>(), out.data_ptr<float>() + m * H, H, (float)eps);
  return out;
}

// residual += x (in place); returns rms_norm(residual) * w.
at::Tensor add_rms_norm(const at::Tensor& x, at::Tensor residual, const at::Tensor& w, double eps) {
  check2d(x, "x");
  TORCH_CHECK(residual.is_contiguous() && residual.sizes() == x.sizes() && residual.dtype() == at::kFloat,
              "residual must be contiguous fp32 like x");
  const int64_t M = x.size(0), H = x.size(1);
  TORCH_CHECK(w.is_contiguous() && w.numel() == H && w.dtype() == at::kFloat, "w must be fp32 [H]");
  auto out = radixrt::empty_like_dtype({M, H}, x);
  float* r = residual.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    const float* xm = x.data_ptr<float>() + m * x.stride(0);
    float* rm = r + m * H;
    int64_t i = 0;
    for (; i + 8 <= H; i += 8) _mm256_storeu_ps(rm + i, _mm256_add_ps(_mm256_loadu_ps(rm + i), _mm256_loadu_ps(xm + i)));
    for (; i < H; ++i) rm[i] += xm[i];
    norm_row(rm, w.data_ptr<float>(), out.data_ptr<float>() + m * H, H, (float)eps);
  }
  return out;
}

// gu [M, 2I] = [gate | up] -> silu(gate) * up [M, I]; silu(g) = g / (1 + exp(-g)) as torch computes it.
at::Tensor silu_mul(const at::Tensor& gu) {
  check2d(gu, "gate_up");
  const int64_t M = gu.size(0), I = gu.size(1) / 2;
  TORCH_CHECK(gu.size(1) == 2 * I, "gate_up must have an even width");
  auto out = radixrt::empty_like_dtype({M, I}, gu);
  for (int64_t m = 0; m < M; ++m) {
    const float* g = gu.data_ptr<float>() + m * gu.stride(0);
    const float* u = g + I;
    float* o = out.data_ptr<float>() + m * I;
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= I; i += 8) {
      const __m256 gv = _mm256_loadu_ps(g + i);
      const __m256 sg = _mm256_div_ps(gv, _mm256_add_ps(one, exp256(_mm256_sub_ps(zero, gv))));
      _mm256_storeu_ps(o + i, _mm256_mul_ps(sg, _mm256_loadu_ps(u + i)));
    }
    for (; i < I; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
  return out;
}

// x [T, H, D] (rotated in place; any token/head stride), cos, sin_signed [T, D] (first half of sin negated):
// x = x * cos + roll(x, D / 2) * sin_signed, i.e. the rotate-half RoPE of transformers.
void rope_(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dtype() == at::kFloat && x.dim() == 3 && x.stride(2) == 1, "x must be fp32 [T, H, D], inner stride 1");
  const int64_t T = x.size(0), H = x.size(1), D = x.size(2), half = D / 2;
  TORCH_CHECK(D % 16 == 0 && cos.is_contiguous() && sin.is_contiguous() && cos.size(0) == T && cos.size(-1) == D,
              "cos/sin must be contiguous fp32 [T, D], D a multiple of 16");
  for (int64_t t = 0; t < T; ++t) {
    const float* c = cos.data_ptr<float>() + t * D;
    const float* s = sin.data_ptr<float>() + t * D;
    for (int64_t h = 0; h < H; ++h) {
      float* p = x.data_ptr<float>() + t * x.stride(0) + h * x.stride(1);
      for (int64_t i = 0; i < half; i += 8) {
        const __m256 a = _mm256_loadu_ps(p + i), b = _mm256_loadu_ps(p + half + i);
        const __m256 na = _mm256_add_ps(_mm256_mul_ps(a, _mm256_loadu_ps(c + i)), _mm256_mul_ps(b, _mm256_loadu_ps(s + i)));
        const __m256 nb = _mm256_add_ps(_mm256_mul_ps(b, _mm256_loadu_ps(c + half + i)),
                                        _mm256_mul_ps(a, _mm256_loadu_ps(s + half + i)));
        _mm256_storeu_ps(p + i, na);
        _mm256_storeu_ps(p + half + i, nb);
      }
    }
  }
}

// x [B, V] fp32 (rows any stride) -> int64 [B]: each row's index of its largest value, the first on ties, or
// of its first NaN if it has one (torch.argmax's rules). Rows split over threads.
at::Tensor argmax(const at::Tensor& x) {
  check2d(x, "logits");
  const int64_t B = x.size(0), V = x.size(1);
  TORCH_CHECK(V > 0, "logits must have at least one column");
  auto out = at::Tensor(at::detail::empty_cpu({B}, at::kLong));
  int64_t* o = out.data_ptr<int64_t>();
  radixrt::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float* p = x.data_ptr<float>() + b * x.stride(0);
      __m256 mx = _mm256_set1_ps(-std::numeric_limits<float>::infinity()), nan = _mm256_setzero_ps();
      int64_t i = 0;
      for (; i + 8 <= V; i += 8) {
        const __m256 v = _mm256_loadu_ps(p + i);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        mx = _mm256_max_ps(mx, v);
      }
      float lanes[8], m = -std::numeric_limits<float>::infinity();
      _mm256_storeu_ps(lanes, mx);
      for (float l : lanes) m = std::max(m, l);
      bool has_nan = _mm256_movemask_ps(nan) != 0;
      for (; i < V; ++i) {
        has_nan = has_nan || std::isnan(p[i]);
        m = std::max(m, p[i]);
      }
      int64_t at = 0;
      while (at < V && !(has_nan ? std::isnan(p[at]) : p[at] == m)) ++at;
      o[b] = at;
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(radixrt_fused, m) {
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor");                    // x [M, H] -> [M, H]
  m.def("add_rms_norm(Tensor x, Tensor(a!) residual, Tensor w, float eps) -> Tensor");  // residual += x
  m.def("silu_mul(Tensor gate_up) -> Tensor");                                  // [M, 2I] -> [M, I]
  m.def("rope_(Tensor(a!) x, Tensor cos, Tensor sin_signed) -> ()");             // x [T, H, D] in place
  m.def("argmax(Tensor logits) -> Tensor");                                     // [B, V] -> int64 [B]
}

TORCH_LIBRARY_IMPL(radixrt_fused, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("silu_mul", &silu_mul);
  m.impl("rope_", &rope_);
  m.impl("argmax", &argmax);
}
