// A few activation rows (2 .. mid_rows(type), speculative verification and small-batch decode) with GGUF
// weights on AVX-512: the decode tiles of gemv512.h run with up to 8 activation rows per pass over a tile of
// weight rows, so the weight streams from memory once, as at 1-2 rows.
//
// Why: gemm512.h decodes every weight row into an L2 buffer and then runs its pair tiles over it; that decode
// is paid per weight byte, so at 3-16 rows it cost 2-3x a whole decode step (Llama-3.2-1B Q4_K_M, one row of
// T tokens: 22 ms at T = 1, 33 at 2, 69 at 3). Here each weight sub-block is decoded in registers and used at
// once by every activation row of the pass (accumulators per activation row x weight-row pair in registers);
// a tile's bytes (2 NZ weight rows, a few KB) stay in L1 between the passes of one tile.
//
// Why the same bits: an output's arithmetic in gemv512.h's tiles does not depend on MB or m0 (the activation
// rows are independent accumulator chains), and those tiles equal the AVX2 ones per lane (see gemv512.h).
// So a row's result is the same whether it runs here, alone on the decode tile, or in gemm512.h's tiles.
//
// Torch-free (like gemv512.h), so a standalone harness can time it; gemm512.cpp splits rows over threads.
#pragma once
#include <algorithm>
#include <cstdint>
#include "gemv512.h"

namespace radixrt {
namespace ggml {
namespace mid512 {

// Weight-row pairs per tile at MB activation rows: every output needs an accumulator (K-quants: and an
// integer sum), 2 NZ MB of the 32 zmm registers beside MB activation vectors. Measured (standalone harness,
// 8192 x 2048 from memory, 2 threads): Q4_K / Q5_K faster with one pair up to 5 rows, two above; Q6_K and
// the 32-element types with two, but four at 1-2 rows (gemv512.h's decode tiles).
template <class T, bool K256, int MB>
constexpr int nz() {
#ifdef MID_NZ
  return MID_NZ(K256, MB);
#endif
  return K256 ? (T::MIN && MB <= 5 ? 1 : 2) : (MB <= 2 ? 4 : 2);
}

template <class T, bool K256, int NZ, int MB>
RADIXRT_X512 inline void tile(const Ctx& c, const int64_t* rows, int64_t m0, const int32_t* offs, int64_t pf) {
  if constexpr (K256) v512::ktile<T, NZ, MB>(c, rows, m0, pf);
  else v512::ltile<T, NZ, MB>(c, rows, m0, offs + m0 * (c.K / 32) * 8, pf);
}

// Weight rows [n0, n1) for activation rows [m0, m0 + MB): tiles of 2 NZ rows (a lone last row pairs with
// itself), the tile after next prefetched.
template <class T, bool K256, int MB>
RADIXRT_X512 void pass(const Ctx& c, int64_t m0, const int32_t* offs, int64_t n0, int64_t n1) {
  constexpr int NZ = nz<T, K256, MB>();
  const int64_t pf = 2 * NZ * c.row_bytes;
  int64_t n = n0;
  for (; n + 2 * NZ <= n1; n += 2 * NZ) {
    int64_t rows[2 * NZ];
    for (int r = 0; r < 2 * NZ; ++r) rows[r] = n + r;
    tile<T, K256, NZ, MB>(c, rows, m0, offs, pf);
  }
  for (; n < n1; n += 2) {
    const int64_t rows[2] = {n, std::min(n + 1, n1 - 1)};
    tile<T, K256, 1, MB>(c, rows, m0, offs, pf);
  }
}

template <class T, bool K256>
RADIXRT_X512 void pass_m(const Ctx& c, int64_t m0, int64_t mb, const int32_t* offs, int64_t n0, int64_t n1) {
  switch (mb) {
    case 1: pass<T, K256, 1>(c, m0, offs, n0, n1); break;
    case 2: pass<T, K256, 2>(c, m0, offs, n0, n1); break;
    case 3: pass<T, K256, 3>(c, m0, offs, n0, n1); break;
    case 4: pass<T, K256, 4>(c, m0, offs, n0, n1); break;
    case 5: pass<T, K256, 5>(c, m0, offs, n0, n1); break;
    case 6: pass<T, K256, 6>(c, m0, offs, n0, n1); break;
    case 7: pass<T, K256, 7>(c, m0, offs, n0, n1); break;
    default: pass<T, K256, 8>(c, m0, offs, n0, n1); break;
  }
}

// Rows of the weight per chunk of passes: small enough that the chunk (read from memory by the first pass)
// is still in L2 for the others (~128 KB), a multiple of 4 (the tiles).
inline int64_t chunk_rows(int64_t row_bytes) {
  return std::max<int64_t>(4, (128 << 10) / std::max<int64_t>(1, row_bytes) / 4 * 4);
}

// All M activation rows over weight rows [n0, n1): per chunk of weight rows, ceil(M / 8) passes of nearly
// equal row counts (9 rows: 4 + 5, not 8 + 1). offs: Q4_0 / Q5_0's activation offsets of every row
// (gemv512.h offsets(), [M][K / 32][8]); unused otherwise.
template <class T, bool K256>
RADIXRT_X512 void rows(const Ctx& c, int64_t M, const int32_t* offs, int64_t n0, int64_t n1) {
  const int64_t passes = (M + 7) / 8, chunk = passes > 1 ? chunk_rows(c.row_bytes) : n1 - n0;
  for (int64_t g = n0; g < n1; g += chunk) {
    const int64_t ge = std::min(n1, g + chunk);
    for (int64_t i = 0, m0 = 0; i < passes; ++i) {
      const int64_t mb = (M - m0) / (passes - i);
      pass_m<T, K256>(c, m0, mb, offs, g, ge);
      m0 += mb;
    }
  }
}

}  // namespace mid512
}  // namespace ggml
}  // namespace radixrt
