// GEMV/skinny GEMM over GGUF blocks kept in the file's own layout, for decode at a few rows.
//
// Q4_1 block (llama.cpp ggml-common.h): fp16 d, fp16 m, 16 bytes of nibbles; element j is the low nibble of
// byte j, element j + 16 the high nibble; value = q * d + m. Q8_0 block: fp16 d, 32 int8; value = q * d.
// The activations are quantized per 32-block to int8 (llama.cpp's Q8_1/Q8_0 trick) so the inner product is
// an integer dot product (maddubs), as in llama.cpp's ggml_vec_dot_q4_1_q8_1 / ggml_vec_dot_q8_0_q8_0.
// Rows of the weight are split over threads with radixrt::parallel_for (../parallel.h).
// Q4_1 normally runs from an 8-row repacked layout (q4_1x8_mm below); the row-by-row kernel stays for row
// counts that are not a multiple of 8.
#include <ATen/ATen.h>
#include "../parallel.h"
#include <torch/library.h>
#include "../alloc.h"
#include <immintrin.h>
#include "../avx2.h"
#include <cstdint>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

using radixrt::hsum;

constexpr int QK = 32;
constexpr int Q4_1_BYTES = 20;
constexpr int Q8_0_BYTES = 34;
constexpr int64_t PARALLEL_MIN_MACS = 1 << 16;

inline float fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// x [M, K] fp32 -> qx [M, K] int8, dx [M, K/32] (scale), sx [M, K/32] (dx * sum(qx)). Rounds to nearest
// even (cvtps_epi32 under the default MXCSR), as nearbyint would.
void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* qx, float* dx, float* sx) {
  const int64_t nb = K / QK;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undo packs' per-lane interleave
  for (int64_t r = 0; r < M * nb; ++r) {
    const float* v = x + r * QK;
    __m256 f[4];
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      f[j] = _mm256_loadu_ps(v + 8 * j);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, f[j]));
    }
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    a = _mm_max_ss(a, _mm_movehdup_ps(a));
    const float d = _mm_cvtss_f32(a) / 127.0f;
    const __m256 id = _mm256_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
    __m256i q[4];
    for (int j = 0; j < 4; ++j) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(f[j], id));
    const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    const __m256i p16 = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
    const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16, p16b), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qx + r * QK), p8);
    dx[r] = d;
    sx[r] = d * (float)hsum(_mm256_cvtepi32_ps(sum));
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

// Q4_1 repacked by 8 rows (q4_1_repack8 in layers/gguf_blocks.py): per group of 8 output rows and block b,
// 160 bytes = 4 x 32 bytes of nibbles (chunk k holds bytes 4k..4k+3 of each of the 8 rows), then the 8 rows'
// fp16 d, then their fp16 m. One maddubs multiplies 4 weights of each of 8 rows by the same 4 activations
// (broadcast), so the int32 lanes are the 8 rows and no horizontal sum is needed (llama.cpp's repacked
// q4_0_8x8 GEMV works the same way). The int16 partial sums stay exact: 8 x 2 x 15 x 127 < 32767.
template <int MB>
void q4_1x8_groups(const uint8_t* W, int64_t g0, int64_t g1, int64_t nb, const int8_t* qx, const float* dx,
                   const float* sx, float* out, int64_t N) {
  const __m256i lo = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = g0; g < g1; ++g) {
    __m256 acc[MB], accm[MB];
    for (int m = 0; m < MB; ++m) { acc[m] = _mm256_setzero_ps(); accm[m] = _mm256_setzero_ps(); }
    const uint8_t* base = W + g * nb * 160;
    for (int64_t b = 0; b < nb; ++b, base += 160) {
      __m256i wl[4], wh[4];
      for (int k = 0; k < 4; ++k) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + 32 * k));
        wl[k] = _mm256_and_si256(w, lo);
        wh[k] = _mm256_and_si256(_mm256_srli_epi16(w, 4), lo);
      }
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base + 128)));
      const __m256 mn = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base + 144)));
      for (int m = 0; m < MB; ++m) {
        const int8_t* y = qx + (m * nb + b) * QK;
        int32_t y4[8];
        std::memcpy(y4, y, 32);
        __m256i s16 = _mm256_maddubs_epi16(wl[0], _mm256_set1_epi32(y4[0]));
        for (int k = 1; k < 4; ++k) s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(wl[k], _mm256_set1_epi32(y4[k])));
        for (int k = 0; k < 4; ++k) s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(wh[k], _mm256_set1_epi32(y4[4 + k])));
        const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones));
        acc[m] = _mm256_fmadd_ps(p, _mm256_mul_ps(d, _mm256_set1_ps(dx[m * nb + b])), acc[m]);
        accm[m] = _mm256_fmadd_ps(mn, _mm256_set1_ps(sx[m * nb + b]), accm[m]);
      }
    }
    for (int m = 0; m < MB; ++m) _mm256_storeu_ps(out + m * N + g * 8, _mm256_add_ps(acc[m], accm[m]));
  }
}

using RowFn = void (*)(const uint8_t*, int64_t, int64_t, int64_t, const int8_t*, const float*, const float*,
                       float*, int64_t);

template <int MB>
void q8_0_adapter(const uint8_t* W, int64_t n0, int64_t n1, int64_t nb, const int8_t* qx, const float* dx,
                  const float*, float* out, int64_t N) {
  q8_0_rows<MB>(W, n0, n1, nb, qx, dx, out, N);
}

// N output columns; the kernels take items [i0, i1) of N / unit (a row, or a group of 8 rows).
at::Tensor run(const at::Tensor& x, const at::Tensor& w, int64_t N, RowFn const* fns, int64_t unit) {
  TORCH_CHECK(x.dtype() == at::kFloat && x.dim() == 2 && x.is_contiguous(), "x must be fp32 [M, K] contiguous");
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t nb = K / QK;
  std::vector<int8_t> qx(M * K);
  std::vector<float> dx(M * nb), sx(M * nb);
  quantize_rows(x.data_ptr<float>(), M, K, qx.data(), dx.data(), sx.data());
  auto out = radixrt::empty_like_dtype({M, N}, x);
  const uint8_t* W = w.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  // Rows in chunks of up to 4 activations: the unpacked weight block is reused from registers. Every
  // product but a tiny one splits over the threads: radixrt's pool keeps its workers hot between the calls of
  // a step. (Over OpenMP, whose sleeping workers cost tens of microseconds to wake on a VM, the bound was 8M
  // MACs, so SmolLM2's layers ran on one thread.)
  const int64_t items = N / unit, grain = M * N * K < PARALLEL_MIN_MACS ? items : std::max<int64_t>(1, 16 / unit);
  radixrt::parallel_for(0, items, grain, [&](int64_t n0, int64_t n1) {
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      const int64_t mb = std::min<int64_t>(4, M - m0);
      fns[mb - 1](W, n0, n1, nb, qx.data() + m0 * K, dx.data() + m0 * nb, sx.data() + m0 * nb, o + m0 * N, N);
    }
  });
  return out;
}

const RowFn Q4_1_FNS[4] = {q4_1_rows<1>, q4_1_rows<2>, q4_1_rows<3>, q4_1_rows<4>};
const RowFn Q8_0_FNS[4] = {q8_0_adapter<1>, q8_0_adapter<2>, q8_0_adapter<3>, q8_0_adapter<4>};
const RowFn Q4_1X8_FNS[4] = {q4_1x8_groups<1>, q4_1x8_groups<2>, q4_1x8_groups<3>, q4_1x8_groups<4>};

}  // namespace

// w: [N / 8, K / 32 * 160] uint8 (8 rows per "row" of w, see q4_1x8_groups) -> [M, N].
at::Tensor q4_1x8_mm(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(w.dtype() == at::kByte && w.dim() == 2 && w.is_contiguous(), "w must be uint8 [N/8, K/32*160]");
  const int64_t K = x.size(1), N = w.size(0) * 8;
  TORCH_CHECK(K % QK == 0 && w.size(1) == K / QK * 160, "w does not match K = ", K);
  return run(x, w, N, Q4_1X8_FNS, 8);
}

at::Tensor blocks_mm(const at::Tensor& x, const at::Tensor& w, int64_t block_bytes, RowFn const* fns) {
  TORCH_CHECK(w.dtype() == at::kByte && w.dim() == 2 && w.is_contiguous(), "w must be uint8 [N, K/32*bytes]");
  TORCH_CHECK(x.size(1) % QK == 0 && w.size(1) == x.size(1) / QK * block_bytes, "w does not match K = ", x.size(1));
  return run(x, w, w.size(0), fns, 1);
}

at::Tensor q4_1_mm(const at::Tensor& x, const at::Tensor& w) { return blocks_mm(x, w, Q4_1_BYTES, Q4_1_FNS); }
namespace radixrt {
namespace ggml {
at::Tensor mm(const at::Tensor& x, const at::Tensor& w, int64_t ggml_type);  // ggml_mm.cpp
}  // namespace ggml
}  // namespace radixrt

// Q8_0 at 3 or more rows: radixrt_ggml.mm's tiles (the same bits; the AVX-512 ones where the CPU has them).
at::Tensor q8_0_mm(const at::Tensor& x, const at::Tensor& w) {
  if (x.dim() == 2 && x.size(0) >= 3 && x.scalar_type() == at::kFloat && x.is_contiguous())
    return radixrt::ggml::mm(x, w, 8);
  return blocks_mm(x, w, Q8_0_BYTES, Q8_0_FNS);
}

// Registered as dispatcher ops (torch.ops.radixrt_ggml.*): they show up in the torch profiler by name, and
// the library needs only ATen headers, which keeps the one-time build short.
TORCH_LIBRARY(radixrt_ggml, m) {
  m.def("q4_1_mm(Tensor x, Tensor w) -> Tensor");  // x [M, K] fp32 @ Q4_1 blocks [N, K/32*20] uint8 -> [M, N]
  m.def("q8_0_mm(Tensor x, Tensor w) -> Tensor");  // x [M, K] fp32 @ Q8_0 blocks [N, K/32*34] uint8 -> [M, N]
  m.def("q4_1x8_mm(Tensor x, Tensor w) -> Tensor");  // x [M, K] fp32 @ Q4_1 by 8 rows [N/8, K/32*160] -> [M, N]
}

TORCH_LIBRARY_IMPL(radixrt_ggml, CPU, m) {
  m.impl("q4_1_mm", &q4_1_mm);
  m.impl("q8_0_mm", &q8_0_mm);
  m.impl("q4_1x8_mm", &q4_1x8_mm);
}
