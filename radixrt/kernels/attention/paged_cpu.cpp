// Paged attention for decode rows on the CPU: reads K/V straight from the pool through the page table (no
// gather of a request's context into a padded tensor), after writing the step's new K/V. Any row with a range
// works (the tests give it extend rows too); in a step the block kernel (cascade_cpu.cpp) takes what many
// rows share (shared-prefix groups, extends) and merges into this kernel's output.
//
// One work item is a chunk of at most CHUNK tokens of one query row, all heads: the pool stores a token's
// heads side by side ([slot, Hkv, D]), so reading every head of a token at once walks each page's slots
// sequentially (what the hardware prefetcher follows), and the G = Hq / Hkv query heads of a KV head share
// its loads (grouped-query attention). Per item, two passes over its tokens: all scores (kept in a
// per-thread buffer), then softmax weights applied to V: K and V are read once each, without online-softmax
// rescaling. A row longer than CHUNK is split over several items (flash-decoding's split-K), whose partial
// results merge exactly by their log-sum-exps; the lse is also returned, so that ranges attended elsewhere
// (shared-prefix groups and extends, cascade_cpu.cpp) merge the same way (FlashInfer merge_state; Hydragen, arXiv 2402.05099).
#include <ATen/ATen.h>
#include "../parallel.h"
#include <torch/library.h>
#include "../alloc.h"
#include <immintrin.h>
#include "../avx2.h"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

using radixrt::hsum;
using radixrt::exp256;

constexpr int64_t CHUNK = 256;        // tokens per work item
constexpr int64_t AHEAD = 4;          // tokens of software prefetch
// Below this many token-heads a layer's attention takes a few microseconds on one core: handing half of it
// to a second thread costs more.
constexpr int64_t PARALLEL_MIN = 1536;
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

inline float dot(const float* a, const float* b, int64_t D) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 16 <= D; d += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d + 8), _mm256_loadu_ps(b + d + 8), acc1);
  }
  for (; d < D; d += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc0);
  return hsum(_mm256_add_ps(acc0, acc1));
}

struct Shape {
  int64_t Hq, Hkv, G, D, P;
  int64_t q_token_stride, q_head_stride;
  float scale;
};

// Tokens [t0, t1) of one row: o [Hq, D] (normalized over the range) and lse [Hq]. `pages` are the row's
// request's page ids; slot of token t = pages[t / P] * P + t % P, walked page by page (no division per token).
void attend(const Shape& sh, const float* q, const float* kpool, const float* vpool, const int32_t* pages,
            int64_t t0, int64_t t1, float* o, float* lse, std::vector<float>& buf) {
  const int64_t Hq = sh.Hq, D = sh.D, G = sh.G, L = t1 - t0, tok = sh.Hkv * D;
  std::fill(o, o + Hq * D, 0.0f);
  if (L <= 0) {
    std::fill(lse, lse + Hq, NEG_INF);
    return;
  }
  const int64_t Lp = (L + 7) / 8 * 8;
  if ((int64_t)buf.size() < Hq * Lp) buf.resize(Hq * Lp);
  float* s = buf.data();
  // Each token's first float in the pool, page by page (no division per token). Both passes prefetch the
  // token AHEAD slots on: the hardware prefetcher stops at every page jump, and a cold layer's KV is in DRAM.
  std::vector<int64_t> at(L);
  for (int64_t t = t0, i = 0; t < t1;) {
    const int64_t off = t % sh.P, n = std::min(sh.P - off, t1 - t);
    const int64_t slot = (int64_t)pages[t / sh.P] * sh.P + off;
    for (int64_t j = 0; j < n; ++j) at[i + j] = (slot + j) * tok;
    t += n;
    i += n;
  }
  auto prefetch = [&](const float* pool, int64_t i) {
    if (i + AHEAD < L)
      for (int64_t b = 0; b < tok * 4; b += 64) _mm_prefetch((const char*)(pool + at[i + AHEAD]) + b, _MM_HINT_T0);
  };
  for (int64_t i = 0; i < L; ++i) {
    prefetch(kpool, i);
    const float* kp = kpool + at[i];
    for (int64_t h = 0; h < Hq; ++h)
      s[h * Lp + i] = dot(q + h * sh.q_head_stride, kp + (h / G) * D, D) * sh.scale;
  }
  std::vector<float> inv(Hq);
  for (int64_t h = 0; h < Hq; ++h) {
    float* sh_ = s + h * Lp;
    float mx = NEG_INF;
    for (int64_t i = 0; i < L; ++i) mx = std::max(mx, sh_[i]);
    for (int64_t i = L; i < Lp; ++i) sh_[i] = NEG_INF;
    const __m256 m = _mm256_set1_ps(mx);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < Lp; i += 8) {
      const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sh_ + i), m));
      _mm256_storeu_ps(sh_ + i, e);
      acc = _mm256_add_ps(acc, e);
    }
    const float sum = hsum(acc);
    lse[h] = mx + std::log(sum);
    inv[h] = 1.0f / sum;
  }
  for (int64_t i = 0; i < L; ++i) {
    prefetch(vpool, i);
    const float* vp = vpool + at[i];
    for (int64_t h = 0; h < Hq; ++h) {
      const __m256 p = _mm256_set1_ps(s[h * Lp + i]);
      const float* vh = vp + (h / G) * D;
      float* oh = o + h * D;
      for (int64_t d = 0; d < D; d += 8)
        _mm256_storeu_ps(oh + d, _mm256_fmadd_ps(p, _mm256_loadu_ps(vh + d), _mm256_loadu_ps(oh + d)));
    }
  }
  for (int64_t h = 0; h < Hq; ++h) {
    const __m256 iv = _mm256_set1_ps(inv[h]);
    float* oh = o + h * D;
    for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(oh + d, _mm256_mul_ps(_mm256_loadu_ps(oh + d), iv));
  }
}

void write_rows(const at::Tensor& src, const at::Tensor& loc, at::Tensor& pool) {
  const int64_t T = src.size(0), H = src.size(1), D = src.size(2);
  const int64_t* l = loc.data_ptr<int64_t>();
  const float* x = src.data_ptr<float>();
  float* p = pool.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      std::copy(x + t * src.stride(0) + h * src.stride(1), x + t * src.stride(0) + h * src.stride(1) + D,
                p + (l[t] * H + h) * D);
}

std::tuple<at::Tensor, at::Tensor> paged_attention(
    const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new, const at::Tensor& out_loc,
    at::Tensor k_pool, at::Tensor v_pool, const at::Tensor& rows, const at::Tensor& page_ptr,
    const at::Tensor& kv_start, const at::Tensor& kv_end, const at::Tensor& kv_indices, int64_t page_size,
    double scale) {
  TORCH_CHECK(q.dtype() == at::kFloat && q.dim() == 3 && q.stride(2) == 1, "q must be fp32 [T, Hq, D], inner stride 1");
  TORCH_CHECK(k_pool.dtype() == at::kFloat && k_pool.is_contiguous() && v_pool.is_contiguous() && k_pool.dim() == 3,
              "pools must be contiguous fp32 [slots, Hkv, D]");
  const int64_t Hq = q.size(1), D = q.size(2), Hkv = k_pool.size(1);
  TORCH_CHECK(D % 8 == 0 && k_pool.size(2) == D && Hq % Hkv == 0, "head_dim must be a multiple of 8");
  TORCH_CHECK(kv_indices.dtype() == at::kInt && rows.dtype() == at::kLong && page_ptr.dtype() == at::kLong &&
              kv_start.dtype() == at::kLong && kv_end.dtype() == at::kLong && out_loc.dtype() == at::kLong,
              "kv_indices int32; rows, page_ptr, kv_start, kv_end, out_loc int64");
  if (out_loc.numel()) {
    TORCH_CHECK(k_new.stride(2) == 1 && v_new.stride(2) == 1 && k_new.size(0) == out_loc.numel(), "bad k_new/v_new");
    write_rows(k_new, out_loc, k_pool);
    write_rows(v_new, out_loc, v_pool);
  }
  const int64_t R = rows.size(0);
  auto o = radixrt::empty_like_dtype({R, Hq, D}, q);
  auto lse = radixrt::empty_like_dtype({R, Hq}, q);
  const int64_t *rw = rows.data_ptr<int64_t>(), *pp = page_ptr.data_ptr<int64_t>();
  const int64_t *st = kv_start.data_ptr<int64_t>(), *en = kv_end.data_ptr<int64_t>();
  // Items: (row, chunk). first[r] is row r's first item; a row of one item writes o/lse directly.
  std::vector<int64_t> first(R + 1, 0);
  int64_t work = 0;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t L = std::max<int64_t>(en[r] - st[r], 0);
    first[r + 1] = first[r] + std::max<int64_t>(1, (L + CHUNK - 1) / CHUNK);
    work += L * Hkv;
  }
  const int64_t items = first[R];
  std::vector<int64_t> item_row(items);
  for (int64_t r = 0; r < R; ++r) std::fill(item_row.begin() + first[r], item_row.begin() + first[r + 1], r);
  const bool split = items > R;
  std::vector<float> part_o(split ? items * Hq * D : 0), part_lse(split ? items * Hq : 0);
  const Shape sh{Hq, Hkv, Hq / Hkv, D, page_size, q.stride(0), q.stride(1), (float)scale};
  const float* qd = q.data_ptr<float>();
  const float *kp = k_pool.data_ptr<float>(), *vp = v_pool.data_ptr<float>();
  const int32_t* idx = kv_indices.data_ptr<int32_t>();
  float *od = o.data_ptr<float>(), *ld = lse.data_ptr<float>();
  radixrt::parallel_for(0, items, work < PARALLEL_MIN ? items : 1, [&](int64_t a, int64_t b) {
    std::vector<float> buf;
    for (int64_t it = a; it < b; ++it) {
      const int64_t r = item_row[it], c = it - first[r];
      const int64_t t0 = st[r] + c * CHUNK, t1 = std::min(en[r], t0 + CHUNK);
      const bool alone = first[r + 1] - first[r] == 1;
      float* oi = alone ? od + r * Hq * D : part_o.data() + it * Hq * D;
      float* li = alone ? ld + r * Hq : part_lse.data() + it * Hq;
      attend(sh, qd + rw[r] * sh.q_token_stride, kp, vp, idx + pp[r], t0, std::max(t0, t1), oi, li, buf);
    }
  });
  for (int64_t r = 0; split && r < R; ++r) {  // merge a split row's chunks: weights exp(lse_c - lse)
    const int64_t n = first[r + 1] - first[r];
    if (n == 1) continue;
    for (int64_t h = 0; h < Hq; ++h) {
      float mx = NEG_INF;
      for (int64_t c = 0; c < n; ++c) mx = std::max(mx, part_lse[(first[r] + c) * Hq + h]);
      float sum = 0.0f;
      for (int64_t c = 0; c < n; ++c) sum += std::exp(part_lse[(first[r] + c) * Hq + h] - mx);
      const float total = mx + std::log(sum);
      float* out = od + (r * Hq + h) * D;
      std::fill(out, out + D, 0.0f);
      for (int64_t c = 0; c < n; ++c) {
        const float w = std::exp(part_lse[(first[r] + c) * Hq + h] - total);
        const float* src = part_o.data() + ((first[r] + c) * Hq + h) * D;
        for (int64_t d = 0; d < D; ++d) out[d] += w * src[d];
      }
      ld[r * Hq + h] = total;
    }
  }
  return {o, lse};
}

}  // namespace

TORCH_LIBRARY(radixrt_attn, m) {
  // q [T, Hq, D], k_new/v_new [T, Hkv, D], out_loc [T] (empty: no write), pools [slots, Hkv, D] (written),
  // rows/page_ptr/kv_start/kv_end [R] -> (o [R, Hq, D], lse [R, Hq]).
  m.def("paged_attention(Tensor q, Tensor k_new, Tensor v_new, Tensor out_loc, Tensor(a!) k_pool, "
        "Tensor(b!) v_pool, Tensor rows, Tensor page_ptr, Tensor kv_start, Tensor kv_end, Tensor kv_indices, "
        "int page_size, float scale) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(radixrt_attn, CPU, m) { m.impl("paged_attention", &paged_attention); }
