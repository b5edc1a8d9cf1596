// Block attention for the CPU: many query rows against the same tokens of one page table, as small GEMMs.
// Two kinds of blocks share it:
//
//   - a shared-prefix (cascade) group: decode rows whose requests hold the same pages for tokens
//     [start, end) (prefix_groups.py); each group's tokens are read once for all of its members;
//   - an extend (prefill chunk): the q_len new tokens of one request against its tokens [0, kv_len),
//     causal: new token i sees [0, kv_len - q_len + i + 1).
//
// For one KV head h, the members' G = Hq / Hkv query heads are M = members x G query rows against the
// same keys, so S = Q K^T and O = softmax(S) V are GEMMs, not M dot-product walks over the pool. One work
// item is (block, KV head, up to ROWS query rows, a token range), and walks its tokens CHUNK at a time
// with an online softmax (running max and sum, the accumulator rescaled: flash attention's recurrence):
//
//   pack   Qt [D, Mp] (the rows, transposed, pre-scaled, zero-padded to a multiple of 8)
//   St = K Qt              6 tokens x 16 rows of accumulators; K read in place, one broadcast per token
//   mask                   causal rows: tokens at or past the row's end are -inf before, 0 after the exp
//   P  = exp(St - max)     max and sum over tokens, vectorized across the query rows
//   O  = O a + P^T V       6 rows x 16 dims of accumulators; V read in place
// Neither K nor V is copied: a token's D floats of one head are contiguous in the pool ([slot, Hkv, D]).
//
// Then, per row and query head, the paged kernel's output for the row (paged_cpu.cpp: a decode row's own
// suffix; an extend row's is empty) and every partial of every item that holds the row merge exactly
// (FlashInfer merge_state; Hydragen, arXiv 2402.05099):
//   lse = log sum_i exp(lse_i),  o = sum_i exp(lse_i - lse) o_i
// Nested group levels need no order: the merge is over disjoint token ranges, every partial one more term.
#include <ATen/ATen.h>
#include "../parallel.h"
#include <torch/library.h>
#include <immintrin.h>
#include "../avx2.h"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace {

using radixrt::exp256;

constexpr int64_t CHUNK = 256;  // tokens per pass of an item: St is CHUNK x Mp floats
constexpr int64_t ROWS = 96;    // query rows per item at most (members x G): St stays within L2
// Register blocks: RB tokens (QK) or query rows (PV) x 16 floats: 12 accumulators, 2 loads and 1 broadcast
// live, within AVX2's 16 ymm registers (a wider block spills to the stack).
constexpr int RB = 6;
constexpr int64_t AHEAD = 4;  // tokens of software prefetch (a cold layer's KV is in DRAM)
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// St[j, i0 : i0 + 8 C] = sum_d K_j[d] Qt[d, i0 : i0 + 8 C] for R tokens j (R <= RB); k[j] points at token
// j's head in the pool.
template <int R, int C>
void qk_block(const float* const* k, int64_t D, const float* Qt, int64_t Mp, int64_t i0, float* St) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    __m256 qd[C];
    for (int c = 0; c < C; ++c) qd[c] = _mm256_loadu_ps(Qt + d * Mp + i0 + 8 * c);
    for (int r = 0; r < R; ++r) {
      const __m256 kd = _mm256_broadcast_ss(k[r] + d);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(kd, qd[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(St + r * Mp + i0 + 8 * c, acc[r][c]);
}

// O[i0 + r, d0 : d0 + 8 C] += sum_j Pt[j, i0 + r] V_j[d0 : d0 + 8 C] for R query rows; v[j] points at
// token j's head.
template <int R, int C>
void pv_block(const float* Pt, int64_t Mp, int64_t i0, const float* const* v, int64_t L, int64_t d0, float* O,
              int64_t D) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_loadu_ps(O + (i0 + r) * D + d0 + 8 * c);
  for (int64_t j = 0; j < L; ++j) {
    if (j + AHEAD < L) _mm_prefetch((const char*)(v[j + AHEAD] + d0), _MM_HINT_T0);
    __m256 vj[C];
    for (int c = 0; c < C; ++c) vj[c] = _mm256_loadu_ps(v[j] + d0 + 8 * c);
    for (int r = 0; r < R; ++r) {
      const __m256 p = _mm256_broadcast_ss(Pt + j * Mp + i0 + r);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(p, vj[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(O + (i0 + r) * D + d0 + 8 * c, acc[r][c]);
}

template <int N, class F>
void tail(int64_t i, int64_t n, F& f) {  // the last n < N items as one block of n
  if constexpr (N > 1) {
    if (n == N - 1) f(i, std::integral_constant<int, N - 1>());
    else tail<N - 1>(i, n, f);
  }
}

template <class F>
void in_blocks(int64_t n, F&& f) {  // f(first, std::integral_constant<int, R>) over blocks of RB, then the rest
  int64_t i = 0;
  for (; i + RB <= n; i += RB) f(i, std::integral_constant<int, RB>());
  tail<RB>(i, n - i, f);
}

struct Scratch {
  std::vector<float> qt, st, mx, sum, alpha;
  std::vector<const float*> k, v;
};

// One item: M rows (packed in sc.qt as Qt [D, Mp]) against tokens [t0, t1) of KV head h; row i sees tokens
// below end[i] (>= t1: all). Writes o [M, D] normalized over what the row saw, lse [M] (-inf, o = 0: nothing).
void attend_item(int64_t M, int64_t Mp, const int64_t* end, const float* kpool, const float* vpool,
                 const int32_t* pages, int64_t P, int64_t Hkv, int64_t h, int64_t D, int64_t t0, int64_t t1,
                 float* o, float* lse, Scratch& sc) {
  std::fill(o, o + M * D, 0.0f);
  sc.mx.assign(Mp, NEG_INF);
  sc.sum.assign(Mp, 0.0f);
  sc.alpha.resize(Mp);
  float *mx = sc.mx.data(), *sum = sc.sum.data(), *alpha = sc.alpha.data();
  const float* Qt = sc.qt.data();
  for (int64_t c0 = t0; c0 < t1; c0 += CHUNK) {
    const int64_t c1 = std::min(t1, c0 + CHUNK), L = c1 - c0;
    sc.st.resize(L * Mp);
    sc.k.resize(L);
    sc.v.resize(L);
    for (int64_t t = c0, j = 0; t < c1; ++t, ++j) {
      const int64_t at = (((int64_t)pages[t / P] * P + t % P) * Hkv + h) * D;
      sc.k[j] = kpool + at;
      sc.v[j] = vpool + at;
    }
    float* St = sc.st.data();
    in_blocks(L, [&](int64_t j, auto R) {
      constexpr int r = decltype(R)::value;
      for (int64_t a = 0; a < r; ++a)
        if (j + RB + a < L)
          for (int64_t b = 0; b < D; b += 16) _mm_prefetch((const char*)(sc.k[j + RB + a] + b), _MM_HINT_T0);
      int64_t i = 0;
      for (; i + 16 <= Mp; i += 16) qk_block<r, 2>(sc.k.data() + j, D, Qt, Mp, i, St + j * Mp);
      if (i < Mp) qk_block<r, 1>(sc.k.data() + j, D, Qt, Mp, i, St + j * Mp);
    });
    auto mask = [&](float value) {  // tokens at or past a row's end
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = std::max<int64_t>(end[i] - c0, 0); j < L; ++j) St[j * Mp + i] = value;
    };
    mask(NEG_INF);
    // online softmax over the chunk, vectorized across rows: new max, rescale what was summed before
    std::copy(mx, mx + Mp, alpha);
    for (int64_t j = 0; j < L; ++j)
      for (int64_t i = 0; i < Mp; i += 8)
        _mm256_storeu_ps(mx + i, _mm256_max_ps(_mm256_loadu_ps(mx + i), _mm256_loadu_ps(St + j * Mp + i)));
    for (int64_t i = 0; i < Mp; ++i) {  // alpha = exp(old max - new max); rows that saw nothing yet: 0 / 1
      alpha[i] = mx[i] == NEG_INF ? 1.0f : std::exp(alpha[i] - mx[i]);
      sum[i] *= alpha[i];
    }
    for (int64_t j = 0; j < L; ++j)
      for (int64_t i = 0; i < Mp; i += 8) {
        const __m256 m = _mm256_loadu_ps(mx + i);
        const __m256 live = _mm256_cmp_ps(m, _mm256_set1_ps(NEG_INF), _CMP_NEQ_OQ);
        const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_loadu_ps(St + j * Mp + i), m)), live);
        _mm256_storeu_ps(St + j * Mp + i, e);
      }
    mask(0.0f);  // exp256 clamps its input, so a masked token would keep a weight of ~1e-38
    for (int64_t j = 0; j < L; ++j)
      for (int64_t i = 0; i < Mp; i += 8)
        _mm256_storeu_ps(sum + i, _mm256_add_ps(_mm256_loadu_ps(sum + i), _mm256_loadu_ps(St + j * Mp + i)));
    for (int64_t i = 0; i < M; ++i)
      if (alpha[i] != 1.0f)
        for (int64_t d = 0; d < D; ++d) o[i * D + d] *= alpha[i];
    in_blocks(M, [&](int64_t i, auto R) {
      constexpr int r = decltype(R)::value;
      if (D % 16 == 0)
        for (int64_t d0 = 0; d0 < D; d0 += 16) pv_block<r, 2>(St, Mp, i, sc.v.data(), L, d0, o, D);
      else
        for (int64_t d0 = 0; d0 < D; d0 += 8) pv_block<r, 1>(St, Mp, i, sc.v.data(), L, d0, o, D);
    });
  }
  for (int64_t i = 0; i < M; ++i) {
    if (sum[i] == 0.0f) {  // saw no token: o stays 0
      lse[i] = NEG_INF;
      continue;
    }
    lse[i] = mx[i] + std::log(sum[i]);
    const __m256 inv = _mm256_set1_ps(1.0f / sum[i]);
    for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(o + i * D + d, _mm256_mul_ps(_mm256_loadu_ps(o + i * D + d), inv));
  }
}

// Block b's columns: member begin, member end (into `members`), page offset, start, end, causal.
struct Block {
  int64_t mb, me, page, start, end, causal;
};

struct Item {
  int64_t b, h, m0, m1, t0, t1, part;  // members [m0, m1) of block b; part: first row in part_o / part_lse
};

void block_attention(const at::Tensor& q, at::Tensor o, at::Tensor lse, const at::Tensor& rows,
                     const at::Tensor& blocks, const at::Tensor& members, const at::Tensor& k_pool,
                     const at::Tensor& v_pool, const at::Tensor& kv_indices, int64_t page_size, double scale) {
  TORCH_CHECK(q.dtype() == at::kFloat && q.dim() == 3 && q.stride(2) == 1, "q must be fp32 [T, Hq, D], inner stride 1");
  TORCH_CHECK(o.is_contiguous() && lse.is_contiguous() && o.dtype() == at::kFloat && lse.dtype() == at::kFloat,
              "o [R, Hq, D] and lse [R, Hq] must be contiguous fp32");
  TORCH_CHECK(k_pool.is_contiguous() && v_pool.is_contiguous() && k_pool.dtype() == at::kFloat,
              "pools must be contiguous fp32 [slots, Hkv, D]");
  TORCH_CHECK(blocks.dtype() == at::kLong && blocks.dim() == 2 && blocks.size(1) == 6 && blocks.is_contiguous(),
              "blocks must be contiguous int64 [Nb, 6]");
  TORCH_CHECK(members.dtype() == at::kLong && rows.dtype() == at::kLong && kv_indices.dtype() == at::kInt,
              "members and rows int64, kv_indices int32");
  const int64_t Hq = q.size(1), D = q.size(2), Hkv = k_pool.size(1), G = Hq / Hkv, R = o.size(0);
  TORCH_CHECK(D % 8 == 0 && Hq % Hkv == 0 && o.size(1) == Hq && o.size(2) == D, "shapes of q, o and the pools differ");
  const Block* bl = reinterpret_cast<const Block*>(blocks.data_ptr<int64_t>());
  const int64_t Nb = blocks.size(0), per = std::max<int64_t>(1, ROWS / G);
  const int64_t *mem = members.data_ptr<int64_t>(), *rw = rows.data_ptr<int64_t>();
  // The items; when there are few (one shared prefix, few members), each splits its tokens so that every
  // thread gets work. Per row: (item, member index within it) of every item that holds it.
  std::vector<Item> items;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> of_row(R);
  int64_t parts = 0, base = 0;
  for (int64_t b = 0; b < Nb; ++b) base += (bl[b].me - bl[b].mb + per - 1) / per * Hkv;
  const int64_t want = 4 * at::get_num_threads();
  for (int64_t b = 0; b < Nb; ++b) {
    const Block& k = bl[b];
    const int64_t n = k.me - k.mb;
    TORCH_CHECK(0 <= k.mb && k.mb < k.me && k.me <= members.numel() && 0 <= k.start && k.start < k.end,
                "block ", b, ": bad member or token range");
    for (int64_t m = k.mb; m < k.me; ++m) TORCH_CHECK(0 <= mem[m] && mem[m] < R, "block ", b, ": member outside o");
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t m0 = 0; m0 < n; m0 += per) {
        const int64_t m1 = std::min(n, m0 + per);
        const int64_t t1 = k.causal ? k.end - (n - m1) : k.end;  // causal: the range's last row sees most
        const int64_t pieces = std::clamp<int64_t>(want / std::max<int64_t>(base, 1), 1,
                                                   (t1 - k.start + CHUNK - 1) / CHUNK);
        const int64_t step = (t1 - k.start + pieces - 1) / pieces;
        for (int64_t t = k.start; t < t1; t += step) {
          const int64_t id = items.size();
          items.push_back({b, h, m0, m1, t, std::min(t1, t + step), parts});
          if (h == 0)
            for (int64_t m = m0; m < m1; ++m) of_row[mem[k.mb + m]].emplace_back(id, m - m0);
          parts += (m1 - m0) * G;
        }
      }
  }
  std::vector<float> part_o(parts * D), part_lse(parts);
  const float* qd = q.data_ptr<float>();
  const float *kp = k_pool.data_ptr<float>(), *vp = v_pool.data_ptr<float>();
  const int32_t* idx = kv_indices.data_ptr<int32_t>();
  const float sc_ = (float)scale;
  radixrt::parallel_for(0, (int64_t)items.size(), 1, [&](int64_t a, int64_t e) {
    Scratch sc;
    std::vector<int64_t> end;
    for (int64_t it = a; it < e; ++it) {
      const Item& w = items[it];
      const Block& k = bl[w.b];
      const int64_t M = (w.m1 - w.m0) * G, Mp = (M + 7) / 8 * 8, n = k.me - k.mb;
      sc.qt.assign(D * Mp, 0.0f);
      end.resize(M);
      for (int64_t m = w.m0; m < w.m1; ++m)
        for (int64_t j = 0; j < G; ++j) {
          const int64_t i = (m - w.m0) * G + j;
          const float* src = qd + rw[mem[k.mb + m]] * q.stride(0) + (w.h * G + j) * q.stride(1);
          for (int64_t d = 0; d < D; ++d) sc.qt[d * Mp + i] = src[d] * sc_;
          end[i] = k.causal ? k.end - (n - 1 - m) : k.end;
        }
      attend_item(M, Mp, end.data(), kp, vp, idx + k.page, page_size, Hkv, w.h, D, w.t0, w.t1,
                  part_o.data() + w.part * D, part_lse.data() + w.part, sc);
    }
  });
  // An item of head h is `h * (items of the block's head 0)` after the head-0 item: items are pushed head-major.
  std::vector<int64_t> per_head(Nb, 0);
  for (const Item& w : items)
    if (w.h == 0) ++per_head[w.b];
  float *od = o.data_ptr<float>(), *ld = lse.data_ptr<float>();
  radixrt::parallel_for(0, R, 16, [&](int64_t a, int64_t e) {
    std::vector<std::pair<const float*, float>> src;  // (partial o, its lse)
    for (int64_t r = a; r < e; ++r) {
      if (of_row[r].empty()) continue;
      for (int64_t hq = 0; hq < Hq; ++hq) {
        const int64_t h = hq / G, j = hq % G;
        float* out = od + (r * Hq + hq) * D;
        src.assign(1, {nullptr, ld[r * Hq + hq]});
        for (auto [id, m] : of_row[r]) {
          const int64_t p = items[id + h * per_head[items[id].b]].part + m * G + j;
          src.emplace_back(part_o.data() + p * D, part_lse[p]);
        }
        float mx = NEG_INF;
        for (auto& s : src) mx = std::max(mx, s.second);
        if (mx == NEG_INF) continue;  // nothing to attend anywhere: keep the zeros
        float total = 0.0f;
        for (auto& s : src) total += std::exp(s.second - mx);
        const float self = std::exp(src[0].second - mx) / total;
        for (int64_t d = 0; d < D; ++d) out[d] *= self;
        for (size_t i = 1; i < src.size(); ++i) {
          const float w = std::exp(src[i].second - mx) / total;
          if (w != 0.0f)
            for (int64_t d = 0; d < D; ++d) out[d] += w * src[i].first[d];
        }
        ld[r * Hq + hq] = mx + std::log(total);
      }
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixrt_attn, m) {
  // q [T, Hq, D]; o [R, Hq, D] and lse [R, Hq] the paged kernel's outputs for q rows `rows` [R] (merged in
  // place); blocks [Nb, 6] int64 = (member begin, member end) into `members` (int64 rows of o, an extend's
  // in token order), the offset of the block's pages in kv_indices, its tokens [start, end), causal (0/1).
  m.def("block_attention(Tensor q, Tensor(a!) o, Tensor(b!) lse, Tensor rows, Tensor blocks, Tensor members, "
        "Tensor k_pool, Tensor v_pool, Tensor kv_indices, int page_size, float scale) -> ()");
}

TORCH_LIBRARY_IMPL(radixrt_attn, CPU, m) { m.impl("block_attention", &block_attention); }
