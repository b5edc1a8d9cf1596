// y = x @ w.T, x [M, K] fp32, the weight w [N, K] fp32, fp16 or bf16 in column panels, for every row count:
// one kernel family, so that a row's result never depends on how many rows run beside it.
//
// Layout (kernels/gemv/__init__.py: pack_panels): panels of PANEL = 32 output columns, each [K, PANEL]
// row-major, panel after panel (the last one [K, N % PANEL] when N is ragged), one flat buffer of N * K
// elements in the weight's own dtype. A panel is one contiguous stream, and a thread's share of the panels
// one contiguous range of the weight: a pure sequential read, all a memory-bound decode product needs.
// (Over w_t [K, N] a GEMV reads every row of w_t in short pieces: measured on SmolLM2's projections, 2
// cores, batch 1: 17.3 GB/s vs 34.4 GB/s for this layout.)
//
// Batch invariance (the reason for one family): each output is one FMA chain in k order (dense_tile.h);
// threads split panels, never K; K blocks hand the chain on through y exactly. So row i is the same bits
// alone, among 1000 rows, at any position, on any thread count, and at M = 1 as above.
//
// Two drivers, chosen by M (either gives the same bits):
// - M <= STREAM_ROWS (decode): rows in pairs stream each panel, widened as read (one row: two panels at a
//   time); past 2 rows in K blocks, so the later pairs find the block in L2.
// - more rows: x is packed into 6-row blocks, and per (panel, K block) the weight block is widened (or, for
//   fp32, copied) into an L1 buffer of two dense 16-column halves, which every row block then sweeps, 6 x 16
//   outputs at a time: the FMA pipes, not the loads, set the pace. (Reading an fp32 half panel in place, 128
//   bytes apart per k, uses half of L1's sets: measured 0.45x oneDNN where fp16 through the buffer ran
//   0.99x, same run.)
#include <ATen/ATen.h>
#include <torch/library.h>
#include "../alloc.h"
#include "../parallel.h"
#include "dense_tile.h"
#include "dense_tile512.h"
#include <algorithm>
#include <cstdint>

namespace {

using namespace radixrt::dense;

constexpr int64_t STREAM_ROWS = 8;  // up to here rows stream the weight; above, the blocked driver
constexpr int64_t KC_STREAM = 512;  // the streaming driver's K block past 2 rows: 64 KB of fp32 panel
constexpr int64_t KC = 256;         // K block: a half panel block (KC x 64 B fp32) plus an x block fit L1
// AVX-512 K block: a whole widened panel block (KC512 x 128 B) plus a 12-row x block (KC512 x 48 B) in L1
// (measured at M=512 fp16: 256 over 128 1.05-1.15x); and row chunks of 40 blocks, a 480 KB x block in L2
// (K=8192 N=2048: 1.45x over sweeping all rows per panel, which streamed x from L3 per panel)
constexpr int64_t KC512 = 256, MC512 = 40;
// Below this much work one thread does it all: waking the others costs more than it saves.
constexpr int64_t PARALLEL_MIN_BYTES = 1 << 20, PARALLEL_MIN_MACS = 1 << 22;

struct Job {
  const float* x;   // [M, K]
  const float* xp;  // x packed: [ceil(M / mr), K, mr], or null when the rows stream
  int mr;           // rows per packed block: MR (AVX2 tiles) or MR512 (AVX-512 tiles)
  int64_t M, K;
  float* y;         // [M, ldy]: panel p's outputs at columns p * PANEL
  int64_t ldy;
};

// x [M, K] -> xp [ceil(M / mr), K, mr], rows past M zero.
void pack_rows(const float* x, int64_t M, int64_t K, int mr, float* xp, int64_t b0, int64_t b1) {
  for (int64_t b = b0; b < b1; ++b) {
    float* out = xp + b * K * mr;
    for (int r = 0; r < mr; ++r) {
      const int64_t m = b * mr + r;
      if (m >= M) {
        for (int64_t k = 0; k < K; ++k) out[k * mr + r] = 0.0f;
        continue;
      }
      const float* row = x + m * K;
      for (int64_t k = 0; k < K; ++k) out[k * mr + r] = row[k];
    }
  }
}

// Panel block w [kc, PANEL] of T -> fp32 halves out [2, kc, 16] (each half one dense 64-byte row per k).
template <class T>
void widen_block(const T* w, int64_t kc, float* out) {
  for (int64_t k = 0; k < kc; ++k)
    for (int h = 0; h < 2; ++h) {
      __m256 lo, hi;
      widen16(w + k * PANEL + 16 * h, lo, hi);
      order16<T>(lo, hi);
      float* o = out + h * kc * 16 + k * 16;
      _mm256_storeu_ps(o, lo), _mm256_storeu_ps(o + 8, hi);
    }
}

// Full panels [p0, p1) of w (panel p at w + p * K * PANEL).
template <class T>
void panels(const Job& j, const T* w, int64_t p0, int64_t p1) {
  const int64_t M = j.M, K = j.K, ldy = j.ldy;
  if (j.xp == nullptr) {
    // Rows in pairs; past 2 rows in K blocks, so that the later pairs find the block in L2.
    const int64_t kcs = M <= 2 ? K : KC_STREAM;
    for (int64_t p = p0; p < p1; ++p) {
      const T* wp = w + p * K * PANEL;
      float* yp = j.y + p * PANEL;
      if (M == 1 && p + 1 < p1) {
        stream_tile_pair<T>(j.x, wp, K * PANEL, K, yp);
        ++p;
        continue;
      }
      for (int64_t k0 = 0; k0 < K; k0 += kcs) {
        const int64_t kc = std::min(kcs, K - k0);
        int64_t m = 0;
        for (; m + 2 <= M; m += 2)
          stream_tile<2, T>(j.x + m * K + k0, K, wp + k0 * PANEL, kc, yp + m * ldy, ldy, k0 == 0);
        if (m < M) stream_tile<1, T>(j.x + m * K + k0, K, wp + k0 * PANEL, kc, yp + m * ldy, ldy, k0 == 0);
      }
    }
    return;
  }
  if (j.mr == MR512) return panels512<T>(j.xp, M, K, w, p0, p1, j.y, ldy, KC512, MC512);
  alignas(64) float buf[2 * KC * 16];
  const int64_t blocks = (M + MR - 1) / MR;
  for (int64_t p = p0; p < p1; ++p)
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
      const int64_t kc = std::min(KC, K - k0);
      widen_block(w + p * K * PANEL + k0 * PANEL, kc, buf);
      for (int h = 0; h < 2; ++h)
        for (int64_t b = 0; b < blocks; ++b)
          block_rows(static_cast<int>(std::min<int64_t>(MR, M - b * MR)), j.xp + b * K * MR + k0 * MR,
                     buf + h * kc * 16, 16, kc, j.y + b * MR * ldy + p * PANEL + h * 16, ldy, k0 == 0);
    }
}

// The ragged last panel w [K, width], width < PANEL: widened into a zero-padded fp32 panel wpad [K, PANEL],
// multiplied by the same tiles into ypad [M, PANEL], its first `width` columns copied out to y.
template <class T>
void ragged(const Job& j, const T* w, int64_t width, int64_t col, float* wpad, float* ypad) {
  for (int64_t k = 0; k < j.K; ++k)
    for (int64_t c = 0; c < PANEL; ++c) wpad[k * PANEL + c] = c < width ? widen1(w[k * width + c]) : 0.0f;
  Job pj = j;
  pj.y = ypad, pj.ldy = PANEL;
  panels<float>(pj, wpad, 0, 1);
  for (int64_t m = 0; m < j.M; ++m)
    std::copy(ypad + m * PANEL, ypad + m * PANEL + width, j.y + m * j.ldy + col);
}

template <class T>
void run(const at::Tensor& x, const at::Tensor& w_p, at::Tensor& y) {
  const int64_t M = x.size(0), K = x.size(1), N = y.size(1), full = N / PANEL, width = N - full * PANEL;
  Job j{x.data_ptr<float>(), nullptr, MR, M, K, y.data_ptr<float>(), N};
  const int64_t bytes = N * K * static_cast<int64_t>(sizeof(T));
  const bool parallel = bytes >= PARALLEL_MIN_BYTES || M * N * K >= PARALLEL_MIN_MACS;
  at::Tensor xp, pad;
  if (M > STREAM_ROWS) {
    if (avx512_enabled()) j.mr = MR512;
    const int64_t blocks = (M + j.mr - 1) / j.mr;
    xp = at::empty({blocks * K * j.mr}, x.options());
    float* out = xp.data_ptr<float>();
    j.xp = out;
    radixrt::parallel_for(0, blocks, parallel ? 1 : blocks,
                          [&](int64_t b0, int64_t b1) { pack_rows(j.x, M, K, j.mr, out, b0, b1); });
  }
  if (width) pad = at::empty({(K + M) * PANEL}, x.options());
  const T* w = reinterpret_cast<const T*>(w_p.data_ptr());
  const int64_t units = full + (width ? 1 : 0);
  radixrt::parallel_for(0, units, parallel ? 1 : units, [&](int64_t p0, int64_t p1) {
    if (p0 < full) panels<T>(j, w, p0, std::min(p1, full));
    if (p1 > full) {
      float* wpad = pad.data_ptr<float>();
      ragged<T>(j, w + full * K * PANEL, width, full * PANEL, wpad, wpad + K * PANEL);
    }
  });
}

}  // namespace

// x [M, K] fp32 contiguous, w_p [N * K] fp32 / fp16 / bf16 in the panel layout above -> [M, N] fp32.
at::Tensor gemv(const at::Tensor& x, const at::Tensor& w_p) {
  TORCH_CHECK(x.dtype() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
              "x must be fp32 [M, K] contiguous, got ", x.scalar_type(), " ", x.sizes());
  const int64_t M = x.size(0), K = x.size(1);
  const auto dt = w_p.scalar_type();
  TORCH_CHECK((dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16) && w_p.dim() == 1 && w_p.is_contiguous() &&
                  K > 0 && w_p.numel() % K == 0,
              "w_p must be fp32, fp16 or bf16 [N * K] contiguous, the panel layout of a [N, K] weight; got ",
              w_p.scalar_type(), " ", w_p.sizes(), " for x ", x.sizes());
  auto y = radixrt::empty_like_dtype({M, w_p.numel() / K}, x);
  if (M == 0 || y.size(1) == 0) return y;
  if (dt == at::kFloat) run<float>(x, w_p, y);
  else if (dt == at::kHalf) run<at::Half>(x, w_p, y);
  else run<at::BFloat16>(x, w_p, y);
  return y;
}

TORCH_LIBRARY(radixrt_gemv, m) {
  // x [M, K] fp32 @ w.T for any M, w_p the panel layout of w [N, K] (fp32, fp16 or bf16) -> [M, N] fp32
  m.def("gemv(Tensor x, Tensor w_p) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixrt_gemv, CPU, m) { m.impl("gemv", &gemv); }
