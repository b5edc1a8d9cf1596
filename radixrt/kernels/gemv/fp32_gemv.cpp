// fp32 y = x @ w_t for a few rows of x (decode), with w_t [K, N] row-major: the weight is read once, as
// four sequential row streams at a time, which is what a memory-bound GEMV needs on a CPU. BLAS sgemm at
// one to four rows pays for packing and, split over threads, for waking them on every call.
//
// Per 8-column chunk and per group of 4 input rows k..k+3, the output chunk of each activation row is
// loaded once, gets 4 products, and is stored: one pass over the weight, y stays in L1 (N floats per row).
// Threads split the columns, and only for weights of PARALLEL_MIN_BYTES or more (every projection of
// SmolLM2 is; measured batch-1 fp32 decode, 2 cores: 27.2 tok/s splitting from 4 MB, 30.3 from 1 MB, 23.1
// with torch's matmul).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

constexpr int64_t PARALLEL_MIN_BYTES = 1 << 20;
// Threads split a weight of at most SPLIT_K_MAX_N columns by rows (K) instead of by columns: a thread's share
// is then one contiguous stream, and its partial y (N floats a row) stays in L1. By columns, a thread reads
// a few hundred bytes of every row of w_t, and 64-column units split unevenly over threads (down_proj of
// SmolLM2, N = 576: 9 units).
constexpr int64_t SPLIT_K = 2;
constexpr int64_t SPLIT_K_MAX_N = 4096;

// y[:, n0:n1] = x @ w over K rows of w; x rows are ldx apart, y rows N apart.
template <int MB>
void columns(const float* x, int64_t ldx, int64_t K, const float* w, int64_t N, int64_t n0, int64_t n1, float* y) {
  for (int m = 0; m < MB; ++m) std::fill(y + m * N + n0, y + m * N + n1, 0.0f);
  int64_t k = 0;
  for (; k + 4 <= K; k += 4) {
    const float* w0 = w + k * N;
    __m256 xs[MB][4];
    for (int m = 0; m < MB; ++m)
      for (int j = 0; j < 4; ++j) xs[m][j] = _mm256_set1_ps(x[m * ldx + k + j]);
    int64_t n = n0;
    for (; n + 8 <= n1; n += 8) {
      const __m256 a = _mm256_loadu_ps(w0 + n), b = _mm256_loadu_ps(w0 + N + n);
      const __m256 c = _mm256_loadu_ps(w0 + 2 * N + n), d = _mm256_loadu_ps(w0 + 3 * N + n);
      for (int m = 0; m < MB; ++m) {
        __m256 acc = _mm256_loadu_ps(y + m * N + n);
        acc = _mm256_fmadd_ps(xs[m][0], a, acc);
        acc = _mm256_fmadd_ps(xs[m][1], b, acc);
        acc = _mm256_fmadd_ps(xs[m][2], c, acc);
        acc = _mm256_fmadd_ps(xs[m][3], d, acc);
        _mm256_storeu_ps(y + m * N + n, acc);
      }
    }
    for (; n < n1; ++n)
      for (int m = 0; m < MB; ++m)
        for (int j = 0; j < 4; ++j) y[m * N + n] += x[m * ldx + k + j] * w0[j * N + n];
  }
  for (; k < K; ++k)
    for (int64_t n = n0; n < n1; ++n)
      for (int m = 0; m < MB; ++m) y[m * N + n] += x[m * ldx + k] * w[k * N + n];
}

using Fn = void (*)(const float*, int64_t, int64_t, const float*, int64_t, int64_t, int64_t, float*);
const Fn FNS[4] = {columns<1>, columns<2>, columns<3>, columns<4>};

// Each of SPLIT_K row blocks of w_t is one sequential stream into its own partial y; the partials are summed
// in block order, so the result does not depend on the thread count.
void split_k(const float* x, int64_t M, int64_t K, const float* w, int64_t N, float* y) {
  const int64_t kb = K / SPLIT_K;
  std::vector<float> part(SPLIT_K * M * N);
  at::parallel_for(0, SPLIT_K, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t m0 = 0; m0 < M; m0 += 4) {
        const int64_t mb = std::min<int64_t>(4, M - m0);
        FNS[mb - 1](x + m0 * K + b * kb, K, kb, w + b * kb * N, N, 0, N, part.data() + (b * M + m0) * N);
      }
  });
  for (int64_t i = 0; i < M * N; ++i) {
    float acc = part[i];
    for (int64_t b = 1; b < SPLIT_K; ++b) acc += part[b * M * N + i];
    y[i] = acc;
  }
}

}  // namespace

// x [M, K] fp32 contiguous, w_t [K, N] fp32 contiguous -> [M, N].
at::Tensor gemv_t(const at::Tensor& x, const at::Tensor& w_t) {
  TORCH_CHECK(x.dtype() == at::kFloat && x.dim() == 2 && x.is_contiguous(), "x must be fp32 [M, K] contiguous");
  TORCH_CHECK(w_t.dtype() == at::kFloat && w_t.dim() == 2 && w_t.is_contiguous() && w_t.size(0) == x.size(1),
              "w_t must be fp32 [K, N] contiguous");
  const int64_t M = x.size(0), K = x.size(1), N = w_t.size(1);
  auto y = at::empty({M, N}, x.options());
  const float *xp = x.data_ptr<float>(), *wp = w_t.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  if (K * N * 4 >= PARALLEL_MIN_BYTES && N <= SPLIT_K_MAX_N && K % (4 * SPLIT_K) == 0) {
    split_k(xp, M, K, wp, N, yp);
    return y;
  }
  const int64_t chunks = (N + 63) / 64;  // 64-column units of work
  const int64_t grain = K * N * 4 < PARALLEL_MIN_BYTES ? chunks : 1;
  at::parallel_for(0, chunks, grain, [&](int64_t c0, int64_t c1) {
    const int64_t n0 = c0 * 64, n1 = std::min(N, c1 * 64);
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      const int64_t mb = std::min<int64_t>(4, M - m0);
      FNS[mb - 1](xp + m0 * K, K, K, wp, N, n0, n1, yp + m0 * N);
    }
  });
  return y;
}

TORCH_LIBRARY(radixrt_gemv, m) {
  m.def("gemv_t(Tensor x, Tensor w_t) -> Tensor");  // x [M, K] @ w_t [K, N] -> [M, N], fp32
}

TORCH_LIBRARY_IMPL(radixrt_gemv, CPU, m) { m.impl("gemv_t", &gemv_t); }
