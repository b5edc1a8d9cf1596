// Q4_0 products at every row count (radixrt_ggml.mm, ggml type 2) on q4_0_lanes.h's tiles: one output per
// lane, the same arithmetic on every path (see there), so a row's bits never depend on M, on its position, on
// the thread count or on the CPU's AVX-512.
//   AVX-512 VNNI, M <= 8: 16 weight rows transposed in registers per block, M activation rows against them
//     (decode reads the weight once; the next tile's rows prefetched).
//   AVX-512 VNNI, M > 8: groups of 16-row panels transposed once into an L2-sized scratch per chunk of rows
//     (no second copy of the weight is kept), then every 8 activation rows pass over each panel.
//   AVX2: 8 weight rows per tile, 1-4 activation rows.
// Rows split over threads as mm_driver.h's run() does; each output is computed by one thread.
#include <ATen/ATen.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>
#include "../parallel.h"
#include "mm_driver.h"
#include "q4_0_lanes.h"

namespace radixrt {
namespace ggml {

bool gemm512_enabled();  // gemm512.cpp: AVX-512 VNNI present and not disabled

namespace {

// -8 * the sum of each activation block (the q - 8 offset, moved onto the activations): [M][K / 32]
std::vector<int32_t> offsets(const Ctx& c, int64_t M) {
  const int64_t nb = c.K / 32;
  std::vector<int32_t> off(M * nb);
  radixrt::parallel_for(0, M * nb, 4096, [&](int64_t a0, int64_t a1) {
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int64_t a = a0; a < a1; ++a) {
      const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.q + a * 32));
      alignas(32) int32_t s[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(s), _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, y), ones16));
      off[a] = -8 * (s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7]);
    }
  });
  return off;
}

int64_t grain(const Ctx& c, int64_t M) { return M * c.N * c.K < (1 << 16) ? c.N : 16; }

// ---- AVX2 ----

template <int MB>
void avx2_rows(const Ctx& c, const int32_t* off, int64_t n0, int64_t n1, int64_t m0, int64_t pf) {
  for (int64_t n = n0; n < n1; n += 8) {
    const uint8_t* rows[8];
    alignas(32) int32_t idx[8];
    for (int r = 0; r < 8; ++r) {
      const int64_t row = std::min(n + r, n1 - 1);
      rows[r] = c.W + row * c.row_bytes;
      idx[r] = (int32_t)((row - n) * c.row_bytes);
    }
    __m256 acc[MB];
    q40::tile8<MB>(c, off, rows, _mm256_load_si256(reinterpret_cast<const __m256i*>(idx)), m0, pf, acc);
    alignas(32) float o[8];
    for (int m = 0; m < MB; ++m) {
      _mm256_store_ps(o, acc[m]);
      for (int64_t r = 0; r < std::min<int64_t>(8, n1 - n); ++r) c.out[(m0 + m) * c.N + n + r] = o[r];
    }
  }
}

void run_avx2(const Ctx& c, int64_t M, const int32_t* off) {
  const int64_t group = std::max<int64_t>(8, (256 << 10) / c.row_bytes / 8 * 8);
  const int64_t pf = M <= 2 ? 8 * c.row_bytes : 0;  // decode: the next tile's rows
  radixrt::parallel_for(0, c.N, grain(c, M), [&](int64_t n0, int64_t n1) {
    for (int64_t g = n0; g < n1; g += group) {
      const int64_t ge = std::min(n1, g + group);
      for (int64_t m0 = 0; m0 < M; m0 += 4) switch (std::min<int64_t>(4, M - m0)) {
          case 1: avx2_rows<1>(c, off, g, ge, m0, pf); break;
          case 2: avx2_rows<2>(c, off, g, ge, m0, pf); break;
          case 3: avx2_rows<3>(c, off, g, ge, m0, pf); break;
          default: avx2_rows<4>(c, off, g, ge, m0, pf); break;
        }
    }
  });
}

// ---- AVX-512 VNNI ----

// Rows n .. n + 16 of [n, n1) (a tail repeats row n1 - 1) and their offsets from the first.
RADIXRT_X512 __m512i panel_rows(const Ctx& c, int64_t n, int64_t n1, const uint8_t** rows) {
  alignas(64) int32_t idx[16];
  for (int r = 0; r < 16; ++r) {
    const int64_t row = std::min(n + r, n1 - 1);
    rows[r] = c.W + row * c.row_bytes;
    idx[r] = (int32_t)((row - n) * c.row_bytes);
  }
  return _mm512_load_si512(idx);
}

template <int MB>
RADIXRT_X512 void store16(const Ctx& c, int64_t m0, int64_t n, int64_t n1, const __m512* acc) {
  const __mmask16 k = n1 - n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n1 - n)) - 1);
  for (int m = 0; m < MB; ++m) _mm512_mask_storeu_ps(c.out + (m0 + m) * c.N + n, k, acc[m]);
}

template <int MB>
RADIXRT_X512 void direct_rows(const Ctx& c, const int32_t* off, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; n += 16) {
    const uint8_t* rows[16];
    const __m512i idx = panel_rows(c, n, n1, rows);
    __m512 acc[MB];
    q40::direct16<MB>(c, off, rows, idx, 0, 16 * c.row_bytes, acc);
    store16<MB>(c, 0, n, n1, acc);
  }
}

template <int MB>
RADIXRT_X512 void scratch_rows(const Ctx& c, const int32_t* off, const __m512i* panels, int64_t np, int64_t g,
                               int64_t ge, int64_t m0) {
  const int64_t nb = c.K / 32;
  for (int64_t p = 0; p < np; ++p) {
    __m512 acc[MB];
    q40::scratch16<MB>(c, off, panels + p * nb * 9, m0, acc);
    store16<MB>(c, m0, g + 16 * p, ge, acc);
  }
}

#define RADIXRT_Q40_MB(F, mb, ...)          \
  switch (mb) {                             \
    case 1: F<1>(__VA_ARGS__); break;       \
    case 2: F<2>(__VA_ARGS__); break;       \
    case 3: F<3>(__VA_ARGS__); break;       \
    case 4: F<4>(__VA_ARGS__); break;       \
    case 5: F<5>(__VA_ARGS__); break;       \
    case 6: F<6>(__VA_ARGS__); break;       \
    case 7: F<7>(__VA_ARGS__); break;       \
    default: F<8>(__VA_ARGS__); break;      \
  }

RADIXRT_X512 void decode_chunk(const Ctx& c, int64_t M, const int32_t* off, int64_t n0, int64_t n1) {
  RADIXRT_Q40_MB(direct_rows, M, c, off, n0, n1);
}

struct Free {
  void operator()(void* p) const { std::free(p); }
};

// Rows [n0, n1) of a prefill: groups of up to 4 panels (~192 KB of scratch, L2) transposed once, then every
// 8 activation rows against each panel.
RADIXRT_X512 void prefill_chunk(const Ctx& c, int64_t M, const int32_t* off, int64_t n0, int64_t n1) {
  const int64_t nb = c.K / 32, panel_bytes = nb * 9 * 64;
  const int64_t per_group = std::max<int64_t>(1, std::min<int64_t>(4, (192 << 10) / panel_bytes));
  const int64_t np_max = std::min<int64_t>(per_group, (n1 - n0 + 15) / 16);
  std::unique_ptr<void, Free> buf(std::aligned_alloc(64, np_max * panel_bytes));
  __m512i* panels = static_cast<__m512i*>(buf.get());
  for (int64_t g = n0; g < n1; g += 16 * per_group) {
    const int64_t ge = std::min(n1, g + 16 * per_group), np = (ge - g + 15) / 16;
    for (int64_t p = 0; p < np; ++p) {
      const uint8_t* rows[16];
      const __m512i idx = panel_rows(c, g + 16 * p, ge, rows);
      for (int64_t b = 0; b < nb; ++b) {
        __m512i* o = panels + (p * nb + b) * 9;
        __m512 dw;
        q40::panel16(rows, idx, b * q40::BYTES, o, dw);
        o[8] = _mm512_castps_si512(dw);
      }
    }
    for (int64_t m0 = 0; m0 < M; m0 += 8)
      RADIXRT_Q40_MB(scratch_rows, std::min<int64_t>(8, M - m0), c, off, panels, np, g, ge, m0);
  }
}

RADIXRT_X512 void run512(const Ctx& c, int64_t M, const int32_t* off) {
  if (M <= 8) {
    radixrt::parallel_for(0, c.N, grain(c, M), [&](int64_t n0, int64_t n1) { decode_chunk(c, M, off, n0, n1); });
    return;
  }
  radixrt::parallel_for(0, c.N, grain(c, M), [&](int64_t n0, int64_t n1) { prefill_chunk(c, M, off, n0, n1); });
}

}  // namespace

void q4_0_run(const Ctx& c, int64_t M) {
  const std::vector<int32_t> off = offsets(c, M);
  if (gemm512_enabled()) run512(c, M, off.data());
  else run_avx2(c, M, off.data());
}

}  // namespace ggml
}  // namespace radixrt
