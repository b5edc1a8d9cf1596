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
// item is (block, KV head, up to ROWS query rows, a token range); it walks its tokens in chunks aligned to
// absolute multiples of CHUNK, each chunk's state computed from zero and folded in order (kv_chunk.h: the
// same packing, products, exp and fold as the paged kernel, so an extend row gets the bits that row would
// get as a decode row, or in any other chunking of the prefill). A speculative verification row is such an
// extend: its k + 1 tokens x G heads are one item's rows, so each K/V chunk is read once for all of them;
// when the step has fewer items than threads want, every chunk of an item is a task of its own (its state
// kept, the fold after it in the same order):
//
//   pack   Qt [D, Mp] (the rows, transposed, pre-scaled, zero-padded to a multiple of 8)
//   St = K Qt              6 tokens x 16 rows of accumulators, one broadcast per token
//   mask                   causal rows: tokens at or past the row's end are -inf before, 0 after the exp
//   P  = exp(St - m_c)     the chunk's max and sum per row, in token order
//   O_c = P^T V            6 rows x 16 dims of accumulators, folded into the row's running state
// K and V are read in place for an fp32 pool, else widened a token at a time into a chunk-sized scratch.
//
// Then, per row and query head, the paged kernel's output for the row (paged_cpu.cpp: a decode row's own
// suffix; an extend row's is empty, so it is copied exactly) and every partial of every item that holds the
// row merge (FlashInfer merge_state; Hydragen, arXiv 2402.05099):
//   lse = log sum_i exp(lse_i),  o = sum_i exp(lse_i - lse) o_i
// That merge is in another order than the fixed chunk fold, so shared-prefix groups (several partials per
// row) are opt-in (--cpu-cascade-attention) and not batch-invariant; the default plans none.
#include <ATen/ATen.h>
#include "../parallel.h"
#include <torch/library.h>
#include "kv_chunk.h"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace {

using namespace radixrt::kv;

constexpr int64_t ROWS = 96;  // query rows per item at most (members x G): St stays within L2

struct ItemScratch {
  Scratch sc;
  std::vector<float> m, l, cm, cl, co;
};

// One item: M rows (packed in s.sc.qt as Qt [D, Mp]) against tokens [t0, t1) of KV head h; row i sees tokens
// below end[i] (>= t1: all). The tokens go chunk by chunk, aligned to absolute multiples of CHUNK, each
// chunk's state folded in order (kv_chunk.h). Writes o [M, D] normalized over what the row saw, lse [M]
// (-inf, o = 0: nothing).
void attend_item(const Pool& K, const Pool& V, int64_t M, int64_t Mp, const int64_t* end, const int32_t* pages,
                 int64_t P, int64_t h, int64_t t0, int64_t t1, float* o, float* lse, ItemScratch& s) {
  const int64_t D = K.D;
  std::fill(o, o + M * D, 0.0f);
  s.m.assign(M, NEG_INF);
  s.l.assign(M, 0.0f);
  s.cm.resize(M);
  s.cl.resize(M);
  s.co.resize(M * D);
  for (int64_t c0 = t0; c0 < t1;) {
    const int64_t c1 = std::min(t1, (c0 / CHUNK + 1) * CHUNK);
    chunk_state(K, V, pages, P, h, c0, c1 - c0, M, Mp, end, s.cm.data(), s.cl.data(), s.co.data(), s.sc);
    for (int64_t i = 0; i < M; ++i) fold(s.m[i], s.l[i], o + i * D, s.cm[i], s.cl[i], s.co.data() + i * D, D);
    c0 = c1;
  }
  for (int64_t i = 0; i < M; ++i) finish(s.m[i], s.l[i], o + i * D, lse + i, D);
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
                     const at::Tensor& v_pool, const at::Tensor& k_scale, const at::Tensor& v_scale,
                     const at::Tensor& kv_indices, int64_t page_size, double scale) {
  TORCH_CHECK(q.dtype() == at::kFloat && q.dim() == 3 && q.stride(2) == 1, "q must be fp32 [T, Hq, D], inner stride 1");
  TORCH_CHECK(o.is_contiguous() && lse.is_contiguous() && o.dtype() == at::kFloat && lse.dtype() == at::kFloat,
              "o [R, Hq, D] and lse [R, Hq] must be contiguous fp32");
  TORCH_CHECK(k_pool.dtype() == v_pool.dtype(), "k_pool and v_pool must have one dtype");
  const Pool K(k_pool, k_scale), V(v_pool, v_scale);
  TORCH_CHECK(blocks.dtype() == at::kLong && blocks.dim() == 2 && blocks.size(1) == 6 && blocks.is_contiguous(),
              "blocks must be contiguous int64 [Nb, 6]");
  TORCH_CHECK(members.dtype() == at::kLong && rows.dtype() == at::kLong && kv_indices.dtype() == at::kInt,
              "members and rows int64, kv_indices int32");
  const int64_t Hq = q.size(1), D = q.size(2), Hkv = k_pool.size(1), G = Hq / Hkv, R = o.size(0);
  TORCH_CHECK(D % 8 == 0 && Hq % Hkv == 0 && o.size(1) == Hq && o.size(2) == D, "shapes of q, o and the pools differ");
  const Block* bl = reinterpret_cast<const Block*>(blocks.data_ptr<int64_t>());
  const int64_t Nb = blocks.size(0), per = std::max<int64_t>(1, ROWS / G);
  const int64_t *mem = members.data_ptr<int64_t>(), *rw = rows.data_ptr<int64_t>();
  // The items; when there are few (one shared prefix, few members), a shared-prefix group's item splits its
  // tokens so that every thread gets work (merged below by log-sum-exp: not the fixed order, which is why
  // groups are opt-in). An extend's item never splits its tokens: its rows fold every chunk from position 0
  // in order (with few items, its chunks run as separate tasks below). Per row: (item, member index within
  // it) of every item that holds it.
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
        const int64_t pieces = k.causal ? 1 : std::clamp<int64_t>(want / std::max<int64_t>(base, 1), 1,
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
  const int32_t* idx = kv_indices.data_ptr<int32_t>();
  const float sc_ = (float)scale;
  // An item's rows packed as Qt [D, Mp] into sc.qt (the same packing and pre-scaling as the paged kernel's),
  // and where each row's causal range ends; returns M.
  auto pack = [&](const Item& w, Scratch& sc, std::vector<int64_t>& end) {
    const Block& k = bl[w.b];
    const int64_t M = (w.m1 - w.m0) * G, Mp = (M + 7) / 8 * 8, n = k.me - k.mb;
    sc.qt.assign(D * Mp, 0.0f);
    end.resize(M);
    for (int64_t m = w.m0; m < w.m1; ++m) {
      std::fill_n(end.begin() + (m - w.m0) * G, G, k.causal ? k.end - (n - 1 - m) : k.end);
      pack_q(qd + rw[mem[k.mb + m]] * q.stride(0), q.stride(1), w.h * G, G, D, Mp, (m - w.m0) * G, sc_,
             sc.qt.data());
    }
    return M;
  };
  // Fewer items than threads want (a verification row's k + 1 tokens, a short extend: one item per KV head):
  // every chunk of every item is a task of its own that writes the chunk's state, and then each item's rows
  // fold their chunks in increasing order, the fold attend_item makes, so the bits are the same and every
  // thread has work (the paged kernel's split-K).
  if ((int64_t)items.size() < want) {
    std::vector<int64_t> first(items.size() + 1, 0), state(items.size() + 1, 0);  // tasks, state rows
    for (size_t i = 0; i < items.size(); ++i) {
      const Item& w = items[i];
      first[i + 1] = first[i] + (w.t1 - 1) / CHUNK - w.t0 / CHUNK + 1;
      state[i + 1] = state[i] + (first[i + 1] - first[i]) * (w.m1 - w.m0) * G;
    }
    std::vector<int64_t> task_item(first.back());
    for (size_t i = 0; i < items.size(); ++i) std::fill(task_item.begin() + first[i], task_item.begin() + first[i + 1], i);
    std::vector<float> cm(state.back()), cl(state.back()), co(state.back() * D);
    radixrt::parallel_for(0, first.back(), 1, [&](int64_t a, int64_t e) {
      Scratch sc;
      std::vector<int64_t> end;
      int64_t packed = -1, M = 0;
      for (int64_t t = a; t < e; ++t) {
        const int64_t i = task_item[t], c = items[i].t0 / CHUNK + t - first[i];
        const Item& w = items[i];
        if (i != packed) M = pack(w, sc, end), packed = i;  // a thread's tasks run on: one packing per item
        const int64_t c0 = std::max(w.t0, c * CHUNK), c1 = std::min(w.t1, (c + 1) * CHUNK);
        const int64_t s = state[i] + (t - first[i]) * M;
        chunk_state(K, V, idx + bl[w.b].page, page_size, w.h, c0, c1 - c0, M, (M + 7) / 8 * 8, end.data(),
                    cm.data() + s, cl.data() + s, co.data() + s * D, sc);
      }
    });
    radixrt::parallel_for(0, (int64_t)items.size(), 1, [&](int64_t a, int64_t e) {
      for (int64_t i = a; i < e; ++i) {
        const int64_t M = (items[i].m1 - items[i].m0) * G, nc = first[i + 1] - first[i];
        for (int64_t r = 0; r < M; ++r) {
          float m = NEG_INF, l = 0.0f, *out = part_o.data() + (items[i].part + r) * D;
          std::fill(out, out + D, 0.0f);
          for (int64_t c = 0; c < nc; ++c) {
            const int64_t s = state[i] + c * M + r;
            fold(m, l, out, cm[s], cl[s], co.data() + s * D, D);
          }
          finish(m, l, out, part_lse.data() + items[i].part + r, D);
        }
      }
    });
  } else {
    radixrt::parallel_for(0, (int64_t)items.size(), 1, [&](int64_t a, int64_t e) {
      ItemScratch sc;
      std::vector<int64_t> end;
      for (int64_t it = a; it < e; ++it) {
        const Item& w = items[it];
        const int64_t M = pack(w, sc.sc, end);
        attend_item(K, V, M, (M + 7) / 8 * 8, end.data(), idx + bl[w.b].page, page_size, w.h, w.t0, w.t1,
                    part_o.data() + w.part * D, part_lse.data() + w.part, sc);
      }
    });
  }
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
        "Tensor k_pool, Tensor v_pool, Tensor k_scale, Tensor v_scale, Tensor kv_indices, int page_size, "
        "float scale) -> ()");
}

TORCH_LIBRARY_IMPL(radixrt_attn, CPU, m) { m.impl("block_attention", &block_attention); }
