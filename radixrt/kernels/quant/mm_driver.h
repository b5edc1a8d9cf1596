// The loop nest shared by every GGUF type's kernel (legacy_blocks.cpp, kquants.cpp): output columns (weight
// rows) split over threads, cache blocking, and tiles of RB weight rows x MB activation rows.
//
// Batch invariance: an output element (m, n) is always computed by one thread, from row m's own quantized
// activations, by the same sequence of operations over the blocks of K whatever tile (RB, MB) it falls in:
// the tiles only interleave independent accumulator chains. So row m's result does not depend on M, on its
// position in x, or on the thread count.
#pragma once
#include <ATen/ATen.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include "../parallel.h"
#include "block_io.h"

namespace radixrt {
namespace ggml {

template <class Kern, int MB>
void row_range(const Ctx& c, int64_t n0, int64_t n1, int64_t m0) {
  constexpr int RB = MB <= 2 ? 4 : MB <= 4 ? 2 : 1;  // RB * MB accumulators fit the 16 ymm registers
  int64_t n = n0;
  for (; n + RB <= n1; n += RB) Kern::template tile<RB, MB>(c, n, m0);
  for (; n < n1; ++n) Kern::template tile<1, MB>(c, n, m0);
}

// Activation rows [m0, m1) over weight rows [n0, n1) in tiles of up to Kern::MAX_MB rows (8 where the
// kernel's accumulators allow: each weight block is then decoded once per 8 rows), the rest by 4, then 1-3.
template <class Kern>
void m_range(const Ctx& c, int64_t n0, int64_t n1, int64_t M) {
  int64_t m0 = 0;
  if (Kern::MAX_MB >= 8)
    for (; m0 + 8 <= M; m0 += 8) row_range<Kern, Kern::MAX_MB >= 8 ? 8 : 4>(c, n0, n1, m0);
  for (; m0 + 4 <= M; m0 += 4) row_range<Kern, 4>(c, n0, n1, m0);
  switch (M - m0) {
    case 1: row_range<Kern, 1>(c, n0, n1, m0); break;
    case 2: row_range<Kern, 2>(c, n0, n1, m0); break;
    case 3: row_range<Kern, 3>(c, n0, n1, m0); break;
    default: break;
  }
}

// Rows of the weight in groups that stay in L2 (~256 KB) while every activation tile (up to 8 x K bytes,
// L1/L2) passes over them: the weight is read from memory once per call. Every product but a tiny one splits
// over the threads (chunks of whole rows: see the invariance note above).
template <class Kern>
void run(const Ctx& c, int64_t M) {
  const int64_t group = std::max<int64_t>(8, (256 << 10) / std::max<int64_t>(1, c.row_bytes) / 8 * 8);
  const int64_t grain = M * c.N * c.K < (1 << 16) ? c.N : 16;
  radixrt::parallel_for(0, c.N, grain, [&](int64_t n0, int64_t n1) {
    for (int64_t g = n0; g < n1; g += group) {
      const int64_t ge = std::min(n1, g + group);
      m_range<Kern>(c, g, ge, M);
    }
  });
}

// Entry points of the kernel files: run `type`'s kernel over c (M activation rows). False if the file has
// no kernel for `type`.
bool legacy_run(int64_t type, const Ctx& c, int64_t M);
bool kquant_run(int64_t type, const Ctx& c, int64_t M);
// gemm512.cpp: the AVX-512 VNNI tiles for M >= 3 where the CPU has them (same bits); false if not run.
bool gemm512_run(int64_t type, const Ctx& c, int64_t M);
bool gemm512_enabled();  // the CPU has AVX-512 VNNI and RADIXRT_DISABLE_AVX512 is not set
bool decode512();        // RADIXRT_GGML_DECODE512=1: 1 row on gemv512.h's tiles
// q4_0_rows.cpp: Q4_0 at every row count and on every CPU (its own arithmetic: see q4_0_lanes.h).
void q4_0_run(const Ctx& c, int64_t M);
// x16_mm.cpp: radixrt_ggml.mm over a weight in `type`'s x16 layout (x16_layout.h), every row count.
namespace x16 {
at::Tensor mm(const at::Tensor& x, const at::Tensor& w, int64_t type);
}

}  // namespace ggml
}  // namespace radixrt
