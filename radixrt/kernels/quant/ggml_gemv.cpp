// GEMV/skinny GEMM over GGUF blocks kept in the file's own layout, for decode at a few rows.
//
// Q4_1 block (llama.cpp ggml-common.h): fp16 d, fp16 m, 16 bytes of nibbles; element j is the low nibble of
// byte j, element j + 16 the high nibble; value = q * d + m. Q8_0 block: fp16 d, 32 int8; value = q * d.
// The activations are quantized per 32-block to int8 (llama.cpp's Q8_1/Q8_0 trick) so the inner product is
// an integer dot product (maddubs), as in llama.cpp's ggml_vec_dot_q4_1_q8_1 / ggml_vec_dot_q8_0_q8_0.
// Rows of the weight are split over torch's intra-op threads with at::parallel_for.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

constexpr int QK = 32;
constexpr int Q4_1_BYTES = 20;
constexpr int Q8_0_BYTES = 34;

inline float fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// x [M, K] fp32 -> qx [M, K] int8, dx [M, K/32] (scale), sx [M, K/32] (dx * sum(qx)).
void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* qx, float* dx, float* sx) {
  const int64_t nb = K / QK;
  for (int64_t r = 0; r < M * nb; ++r) {
    const float* v = x + r * QK;
    __m256 amax = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int j = 0; j < QK; j += 8) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + j)));
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    a = _mm_max_ss(a, _mm_movehdup_ps(a));
    const float d = _mm_cvtss_f32(a) / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < QK; ++j) {
      const int q = (int)std::nearbyint(v[j] * id);
      qx[r * QK + j] = (int8_t)q;
      sum += q;
    }
    dx[r] = d;
    sx[r] = d * (float)sum;
  }
}

// RB weight rows at a time, each with its own accumulators: the fma chains interleave (latency hiding) and each
// activation block is loaded once for RB rows.
template <int RB, int MB>
void q4_1_tile(const uint8_t* W, int64_t n, int64_t nb, const int8_t* qx, const float* dx, const float* sx,
               float* out, int64_t N) {
  const __m128i lo = _mm_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[RB][MB];
  float mins[RB][MB];
  for (int r = 0; r < RB; ++r)
    for (int m = 0; m < MB; ++m) { acc[r][m] = _mm256_setzero_ps(); mins[r][m] = 0.0f; }
  for (int64_t b = 0; b < nb; ++b) {
    __m256i q[RB];
    float d[RB], mn[RB];
    for (int r = 0; r < RB; ++r) {
      const uint8_t* blk = W + ((n + r) * nb + b) * Q4_1_BYTES;
      d[r] = fp16(blk);
      mn[r] = fp16(blk + 2);
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 4));
      q[r] = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), lo), _mm_and_si128(raw, lo));
    }
    for (int m = 0; m < MB; ++m) {
      const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + (m * nb + b) * QK));
      const float dy = dx[m * nb + b], sy = sx[m * nb + b];
      for (int r = 0; r < RB; ++r) {
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q[r], y), ones);
        acc[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d[r] * dy), acc[r][m]);
        mins[r][m] += mn[r] * sy;
      }
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int m = 0; m < MB; ++m) out[m * N + n + r] = hsum(acc[r][m]) + mins[r][m];
}

template <int MB>
void q4_1_rows(const uint8_t* W, int64_t n0, int64_t n1, int64_t nb, const int8_t* qx, const float* dx,
               const float* sx, float* out, int64_t N) {
  constexpr int RB = MB <= 2 ? 4 : 2;
  int64_t n = n0;
  for (; n + RB <= n1; n += RB) q4_1_tile<RB, MB>(W, n, nb, qx, dx, sx, out, N);
  for (; n < n1; ++n) q4_1_tile<1, MB>(W, n, nb, qx, dx, sx, out, N);
}

template <int MB>
void q8_0_rows(const uint8_t* W, int64_t n0, int64_t n1, int64_t nb, const int8_t* qx, const float* dx,
               float* out, int64_t N) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = W + n * nb * Q8_0_BYTES;
    __m256 acc[MB];
    for (int m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = row + b * Q8_0_BYTES;
      const float d = fp16(blk);
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
      const __m256i aw = _mm256_sign_epi8(w, w);  // |w| as unsigned for maddubs; the sign moves to y
      for (int m = 0; m < MB; ++m) {
        const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + (m * nb + b) * QK));
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(y, w)), ones);
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * dx[m * nb + b]), acc[m]);
      }
    }
    for (int m = 0; m < MB; ++m) out[m * N + n] = hsum(acc[m]);
  }
}

using RowFn = void (*)(const uint8_t*, int64_t, int64_t, int64_t, const int8_t*, const float*, const float*,
                       float*, int64_t);

template <int MB>
void q8_0_adapter(const uint8_t* W, int64_t n0, int64_t n1, int64_t nb, const int8_t* qx, const float* dx,
                  const float*, float* out, int64_t N) {
  q8_0_rows<MB>(W, n0, n1, nb, qx, dx, out, N);
}

at::Tensor run(const at::Tensor& x, const at::Tensor& w, int64_t block_bytes, RowFn const* fns) {
  TORCH_CHECK(x.dtype() == at::kFloat && x.dim() == 2 && x.is_contiguous(), "x must be fp32 [M, K] contiguous");
  TORCH_CHECK(w.dtype() == at::kByte && w.dim() == 2 && w.is_contiguous(), "w must be uint8 [N, K/32*bytes]");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(K % QK == 0 && w.size(1) == K / QK * block_bytes, "w does not match K = ", K);
  const int64_t nb = K / QK;
  std::vector<int8_t> qx(M * K);
  std::vector<float> dx(M * nb), sx(M * nb);
  quantize_rows(x.data_ptr<float>(), M, K, qx.data(), dx.data(), sx.data());
  auto out = at::empty({M, N}, x.options());
  const uint8_t* W = w.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  // Rows in chunks of up to 4 activations: the unpacked weight block is reused from registers.
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      const int64_t mb = std::min<int64_t>(4, M - m0);
      fns[mb - 1](W, n0, n1, nb, qx.data() + m0 * K, dx.data() + m0 * nb, sx.data() + m0 * nb, o + m0 * N, N);
    }
  });
  return out;
}

const RowFn Q4_1_FNS[4] = {q4_1_rows<1>, q4_1_rows<2>, q4_1_rows<3>, q4_1_rows<4>};
const RowFn Q8_0_FNS[4] = {q8_0_adapter<1>, q8_0_adapter<2>, q8_0_adapter<3>, q8_0_adapter<4>};

}  // namespace

at::Tensor q4_1_mm(const at::Tensor& x, const at::Tensor& w) { return run(x, w, Q4_1_BYTES, Q4_1_FNS); }
at::Tensor q8_0_mm(const at::Tensor& x, const at::Tensor& w) { return run(x, w, Q8_0_BYTES, Q8_0_FNS); }

// Registered as dispatcher ops (torch.ops.radixrt_ggml.*): they show up in the torch profiler by name, and
// the library needs only ATen headers, which keeps the one-time build short.
TORCH_LIBRARY(radixrt_ggml, m) {
  m.def("q4_1_mm(Tensor x, Tensor w) -> Tensor");  // x [M, K] fp32 @ Q4_1 blocks [N, K/32*20] uint8 -> [M, N]
  m.def("q8_0_mm(Tensor x, Tensor w) -> Tensor");  // x [M, K] fp32 @ Q8_0 blocks [N, K/32*34] uint8 -> [M, N]
}

TORCH_LIBRARY_IMPL(radixrt_ggml, CPU, m) {
  m.impl("q4_1_mm", &q4_1_mm);
  m.impl("q8_0_mm", &q8_0_mm);
}
