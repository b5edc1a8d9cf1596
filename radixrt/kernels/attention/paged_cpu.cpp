// Paged attention for the CPU: writes the step's new K/V into the pool, then attends each query row's own
// range [kv_start, kv_end) of its request straight through the page table (no gather into a padded tensor).
// Decode rows come here; an extend's rows and (opt-in) shared-prefix groups go to the block kernel
// (cascade_cpu.cpp), which merges into this kernel's output.
//
// The pool is fp32, fp16, bf16 or int8 with per-(token, head) scales (kv_chunk.h): values widen to fp32
// before any arithmetic. The reduction is kv_chunk.h's: one work item is (row, chunk of CHUNK tokens aligned
// to absolute positions), all heads; items run in parallel (flash-decoding's split-K), each writes its
// chunk's (m, l, o) from zero, and each row then folds its chunks in increasing order. So a row's bits
// depend only on its query, its position and the KV content: not on the batch, the step, or the thread
// count, and they equal the block kernel's for the same row.
#include <ATen/ATen.h>
#include "../parallel.h"
#include <torch/library.h>
#include "../alloc.h"
#include "kv_chunk.h"
#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

using namespace radixrt::kv;

// Below this many token-heads a layer's attention takes a few microseconds on one core: handing half of it
// to a second thread costs more.
constexpr int64_t PARALLEL_MIN = 1536;

void write_rows(const at::Tensor& src, const at::Tensor& loc, const Pool& pool) {
  const int64_t T = src.size(0), H = src.size(1);
  const int64_t* l = loc.data_ptr<int64_t>();
  const float* x = src.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) pool.write(l[t], h, x + t * src.stride(0) + h * src.stride(1));
}

std::tuple<at::Tensor, at::Tensor> paged_attention(
    const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new, const at::Tensor& out_loc,
    at::Tensor k_pool, at::Tensor v_pool, at::Tensor k_scale, at::Tensor v_scale, const at::Tensor& rows,
    const at::Tensor& page_ptr, const at::Tensor& kv_start, const at::Tensor& kv_end, const at::Tensor& kv_indices,
    int64_t page_size, double scale) {
  TORCH_CHECK(q.dtype() == at::kFloat && q.dim() == 3 && q.stride(2) == 1, "q must be fp32 [T, Hq, D], inner stride 1");
  TORCH_CHECK(k_pool.dtype() == v_pool.dtype(), "k_pool and v_pool must have one dtype");
  const Pool K(k_pool, k_scale), V(v_pool, v_scale);
  const int64_t Hq = q.size(1), D = q.size(2), Hkv = K.Hkv, G = Hq / Hkv, Mp = (G + 7) / 8 * 8;
  TORCH_CHECK(D % 8 == 0 && K.D == D && V.D == D && Hq % Hkv == 0, "head_dim must be a multiple of 8");
  TORCH_CHECK(kv_indices.dtype() == at::kInt && rows.dtype() == at::kLong && page_ptr.dtype() == at::kLong &&
              kv_start.dtype() == at::kLong && kv_end.dtype() == at::kLong && out_loc.dtype() == at::kLong,
              "kv_indices int32; rows, page_ptr, kv_start, kv_end, out_loc int64");
  if (out_loc.numel()) {
    TORCH_CHECK(k_new.dtype() == at::kFloat && v_new.dtype() == at::kFloat && k_new.stride(2) == 1 &&
                v_new.stride(2) == 1 && k_new.size(0) == out_loc.numel(), "bad k_new/v_new");
    write_rows(k_new, out_loc, K);
    write_rows(v_new, out_loc, V);
  }
  const int64_t R = rows.size(0);
  auto o = radixrt::empty_like_dtype({R, Hq, D}, q);
  auto lse = radixrt::empty_like_dtype({R, Hq}, q);
  const int64_t *rw = rows.data_ptr<int64_t>(), *pp = page_ptr.data_ptr<int64_t>();
  const int64_t *st = kv_start.data_ptr<int64_t>(), *en = kv_end.data_ptr<int64_t>();
  // Items: (row, aligned chunk); first[r] is row r's first item, c0[r] its first chunk's index.
  std::vector<int64_t> first(R + 1, 0), c0(R, 0);
  int64_t work = 0;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t L = std::max<int64_t>(en[r] - st[r], 0);
    c0[r] = st[r] / CHUNK;
    first[r + 1] = first[r] + (L ? (en[r] + CHUNK - 1) / CHUNK - c0[r] : 0);
    work += L * Hkv;
  }
  const int64_t items = first[R];
  std::vector<int64_t> item_row(items);
  for (int64_t r = 0; r < R; ++r) std::fill(item_row.begin() + first[r], item_row.begin() + first[r + 1], r);
  std::vector<float> sm(items * Hq), sl(items * Hq), so(items * Hq * D);
  const float* qd = q.data_ptr<float>();
  const int32_t* idx = kv_indices.data_ptr<int32_t>();
  float *od = o.data_ptr<float>(), *ld = lse.data_ptr<float>();
  radixrt::parallel_for(0, items, work < PARALLEL_MIN ? items : 1, [&](int64_t a, int64_t b) {
    Scratch sc;
    std::vector<int64_t> end(G);
    for (int64_t it = a; it < b; ++it) {
      const int64_t r = item_row[it], c = c0[r] + it - first[r];
      const int64_t t0 = std::max(st[r], c * CHUNK), t1 = std::min(en[r], (c + 1) * CHUNK);
      std::fill(end.begin(), end.end(), en[r]);
      for (int64_t h = 0; h < Hkv; ++h) {
        sc.qt.assign(D * Mp, 0.0f);
        pack_q(qd + rw[r] * q.stride(0), q.stride(1), h * G, G, D, Mp, 0, (float)scale, sc.qt.data());
        const int64_t s = it * Hq + h * G;
        chunk_state(K, V, idx + pp[r], page_size, h, t0, t1 - t0, G, Mp, end.data(), sm.data() + s,
                    sl.data() + s, so.data() + s * D, sc);
      }
    }
  });
  radixrt::parallel_for(0, R, work < PARALLEL_MIN ? R : 16, [&](int64_t a, int64_t b) {
    for (int64_t r = a; r < b; ++r)
      for (int64_t h = 0; h < Hq; ++h) {
        float m = NEG_INF, l = 0.0f, *out = od + (r * Hq + h) * D;
        std::fill(out, out + D, 0.0f);
        for (int64_t it = first[r]; it < first[r + 1]; ++it) {
          const int64_t s = it * Hq + h;
          fold(m, l, out, sm[s], sl[s], so.data() + s * D, D);
        }
        finish(m, l, out, ld + r * Hq + h, D);
      }
  });
  return {o, lse};
}

}  // namespace

TORCH_LIBRARY(radixrt_attn, m) {
  // q [T, Hq, D] fp32, k_new/v_new [T, Hkv, D] fp32, out_loc [T] (empty: no write), pools [slots, Hkv, D]
  // fp32/fp16/bf16/int8 (written), scales [slots, Hkv] fp32 for int8 pools (written; else empty),
  // rows/page_ptr/kv_start/kv_end [R] -> (o [R, Hq, D], lse [R, Hq]).
  m.def("paged_attention(Tensor q, Tensor k_new, Tensor v_new, Tensor out_loc, Tensor(a!) k_pool, "
        "Tensor(b!) v_pool, Tensor(c!) k_scale, Tensor(d!) v_scale, Tensor rows, Tensor page_ptr, Tensor kv_start, "
        "Tensor kv_end, Tensor kv_indices, int page_size, float scale) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(radixrt_attn, CPU, m) { m.impl("paged_attention", &paged_attention); }
