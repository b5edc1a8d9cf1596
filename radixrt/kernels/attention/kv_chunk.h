// What the paged kernel (paged_cpu.cpp) and the block kernel (cascade_cpu.cpp) share, so that one query
// row gets the same bits from either:
//
//   - the pool's element types: fp32, fp16 (F16C), bf16 (the high half of an fp32) and int8 with one fp32
//     scale per (token, KV head) (scale = max|x| / 127, q = round-half-even(x / scale)): a token's write
//     never changes another token's stored values. Reads widen to fp32 (in registers, into a chunk-sized
//     scratch) before any arithmetic, so every kernel sees the same fp32 K and V.
//   - the reduction order. A row's tokens [0, end) are reduced in chunks aligned to absolute multiples of
//     CHUNK. Per chunk, from zero: scores s = K (q * scale) (one FMA chain over d), m = max s,
//     p = exp(s - m), l = sum p (in token order), o = sum p v (one FMA chain over tokens). The chunks then
//     fold in increasing order: m' = max(m, m_c), a = exp(m - m'), b = exp(m_c - m'), l = l a + l_c b,
//     o = o a + o_c b; finally o / l and lse = m + log l. Nothing depends on the row's batch, on how its
//     tokens were split into steps, or on which kernel took it (SGLang's deterministic inference and vLLM's
//     batch-invariant kernels do the same: a fixed split size in absolute KV positions).
// Built with -ffp-contract=off: a scalar and a vector a * b + c round the same way.
#pragma once
#include <ATen/ATen.h>
#include <immintrin.h>
#include "../avx2.h"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace radixrt::kv {

constexpr int64_t CHUNK = 64;  // tokens of one reduction chunk, in absolute positions (a multiple of 8)
constexpr int RB = 6;          // register block: RB tokens (QK) or rows (PV) x 16 floats
// Fully unrolled register blocks: without it gcc 12 keeps acc[R][C] in a stack array and stores every
// accumulator at every step of the token/d loop (the FMAs waited on those stores: 24 rows x 2,300 tokens
// took 1.6x as long on one thread).
#define RADIXRT_UNROLL _Pragma("GCC unroll 16")

constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

enum Type : int { F32 = 0, F16 = 1, BF16 = 2, I8 = 3 };

inline Type type_of(const at::Tensor& pool) {
  switch (pool.scalar_type()) {
    case at::kFloat: return F32;
    case at::kHalf: return F16;
    case at::kBFloat16: return BF16;
    case at::kChar: return I8;
    default: TORCH_CHECK(false, "KV pool dtype must be float32, float16, bfloat16 or int8, got ", pool.scalar_type());
  }
  return F32;
}

// One layer's K or V pool [slots, Hkv, D] (and for int8 its scales [slots, Hkv]).
struct Pool {
  void* data;
  float* scale;
  Type type;
  int64_t Hkv, D;

  Pool(const at::Tensor& t, const at::Tensor& s) : data(t.data_ptr()), scale(nullptr), type(type_of(t)) {
    TORCH_CHECK(t.dim() == 3 && t.is_contiguous(), "KV pools must be contiguous [slots, Hkv, D]");
    Hkv = t.size(1);
    D = t.size(2);
    if (type == I8) {
      TORCH_CHECK(s.dtype() == at::kFloat && s.is_contiguous() && s.numel() == t.size(0) * Hkv,
                  "an int8 KV pool needs fp32 scales [slots, Hkv]");
      scale = s.data_ptr<float>();
    }
  }

  // The D values of (slot, head h) as fp32: the pool itself for fp32, else widened into dst.
  const float* read(int64_t slot, int64_t h, float* dst) const {
    const int64_t at = slot * Hkv + h;
    switch (type) {
      case F32: return static_cast<const float*>(data) + at * D;
      case F16: {
        const uint16_t* s = static_cast<const uint16_t*>(data) + at * D;
        for (int64_t d = 0; d < D; d += 8)
          _mm256_storeu_ps(dst + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(s + d))));
        return dst;
      }
      case BF16: {
        const uint16_t* s = static_cast<const uint16_t*>(data) + at * D;
        for (int64_t d = 0; d < D; d += 8) {
          const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(s + d)));
          _mm256_storeu_ps(dst + d, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
        }
        return dst;
      }
      case I8: {
        const int8_t* s = static_cast<const int8_t*>(data) + at * D;
        const __m256 sc = _mm256_set1_ps(scale[at]);
        for (int64_t d = 0; d < D; d += 8) {
          const __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(s + d)));
          _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_cvtepi32_ps(w), sc));
        }
        return dst;
      }
    }
    return dst;
  }

  // Store D fp32 values x at (slot, head h), rounding to nearest even (as torch's .to() and
  // kv_pool.quantize_int8 do).
  void write(int64_t slot, int64_t h, const float* x) const {
    const int64_t at = slot * Hkv + h;
    switch (type) {
      case F32: std::memcpy(static_cast<float*>(data) + at * D, x, D * sizeof(float)); return;
      case F16: {
        uint16_t* s = static_cast<uint16_t*>(data) + at * D;
        for (int64_t d = 0; d < D; d += 8)
          _mm_storeu_si128((__m128i*)(s + d), _mm256_cvtps_ph(_mm256_loadu_ps(x + d), _MM_FROUND_TO_NEAREST_INT));
        return;
      }
      case BF16: {
        uint16_t* s = static_cast<uint16_t*>(data) + at * D;
        for (int64_t d = 0; d < D; ++d) {
          uint32_t b;
          std::memcpy(&b, x + d, 4);
          s[d] = std::isnan(x[d]) ? (uint16_t)((b >> 16) | 0x40) : (uint16_t)((b + 0x7FFF + ((b >> 16) & 1)) >> 16);
        }
        return;
      }
      case I8: {
        int8_t* s = static_cast<int8_t*>(data) + at * D;
        float amax = 0.0f;
        for (int64_t d = 0; d < D; ++d) amax = std::max(amax, std::fabs(x[d]));
        const float sc = amax / 127.0f;
        scale[at] = sc;
        for (int64_t d = 0; d < D; ++d)
          s[d] = sc == 0.0f ? 0 : (int8_t)std::clamp(std::nearbyint(x[d] / sc), -127.0f, 127.0f);
        return;
      }
    }
  }
};

// St[j, i0 : i0 + 8 C] = sum_d K_j[d] Qt[d, i0 : i0 + 8 C] for R tokens j (R <= RB): one FMA chain over d
// per score, whatever R, C or the row's lane.
template <int R, int C>
void qk_block(const float* const* k, int64_t D, const float* Qt, int64_t Mp, int64_t i0, float* St) {
  __m256 acc[R][C];
  RADIXRT_UNROLL for (int r = 0; r < R; ++r)
    RADIXRT_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    __m256 qd[C];
    RADIXRT_UNROLL for (int c = 0; c < C; ++c) qd[c] = _mm256_loadu_ps(Qt + d * Mp + i0 + 8 * c);
    RADIXRT_UNROLL for (int r = 0; r < R; ++r) {
      const __m256 kd = _mm256_broadcast_ss(k[r] + d);
      RADIXRT_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(kd, qd[c], acc[r][c]);
    }
  }
  RADIXRT_UNROLL for (int r = 0; r < R; ++r)
    RADIXRT_UNROLL for (int c = 0; c < C; ++c) _mm256_storeu_ps(St + r * Mp + i0 + 8 * c, acc[r][c]);
}

// O[i0 + r, d0 : d0 + 8 C] += sum_j Pt[j, i0 + r] V_j[d0 : d0 + 8 C] for R rows: one FMA chain over j.
template <int R, int C>
void pv_block(const float* Pt, int64_t Mp, int64_t i0, const float* const* v, int64_t L, int64_t d0, float* O,
              int64_t D) {
  __m256 acc[R][C];
  RADIXRT_UNROLL for (int r = 0; r < R; ++r)
    RADIXRT_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_loadu_ps(O + (i0 + r) * D + d0 + 8 * c);
  for (int64_t j = 0; j < L; ++j) {
    __m256 vj[C];
    RADIXRT_UNROLL for (int c = 0; c < C; ++c) vj[c] = _mm256_loadu_ps(v[j] + d0 + 8 * c);
    RADIXRT_UNROLL for (int r = 0; r < R; ++r) {
      const __m256 p = _mm256_broadcast_ss(Pt + j * Mp + i0 + r);
      RADIXRT_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(p, vj[c], acc[r][c]);
    }
  }
  RADIXRT_UNROLL for (int r = 0; r < R; ++r)
    RADIXRT_UNROLL for (int c = 0; c < C; ++c) _mm256_storeu_ps(O + (i0 + r) * D + d0 + 8 * c, acc[r][c]);
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
  std::vector<float> qt, st, kw, vw;
  std::vector<int32_t> n;  // per row: the chunk's tokens it sees
  std::vector<const float*> k, v;
};

// One chunk's state, from zero: M rows (sc.qt = Qt [D, Mp], q pre-scaled, padding lanes zero) against
// tokens [c0, c0 + L) of KV head h (L <= CHUNK, within one aligned chunk); row i sees tokens below end[i].
// Writes m [M], l [M] (0 and -inf: the row saw none) and o [M, D] (unnormalized).
inline void chunk_state(const Pool& K, const Pool& V, const int32_t* pages, int64_t P, int64_t h, int64_t c0,
                        int64_t L, int64_t M, int64_t Mp, const int64_t* end, float* m, float* l, float* o,
                        Scratch& sc) {
  const int64_t D = K.D;
  sc.st.resize(L * Mp);
  sc.k.resize(L);
  sc.v.resize(L);
  if (K.type != F32) {
    sc.kw.resize(L * D);
    sc.vw.resize(L * D);
  }
  for (int64_t t = c0, j = 0; j < L; ++t, ++j) {
    const int64_t slot = (int64_t)pages[t / P] * P + t % P;
    sc.k[j] = K.read(slot, h, sc.kw.data() + j * D);
    sc.v[j] = V.read(slot, h, sc.vw.data() + j * D);
  }
  float* St = sc.st.data();
  const float* Qt = sc.qt.data();
  in_blocks(L, [&](int64_t j, auto R) {
    constexpr int r = decltype(R)::value;
    int64_t i = 0;
    for (; i + 16 <= Mp; i += 16) qk_block<r, 2>(sc.k.data() + j, D, Qt, Mp, i, St + j * Mp);
    if (i < Mp) qk_block<r, 1>(sc.k.data() + j, D, Qt, Mp, i, St + j * Mp);
  });
  // Per row: max, exp, sum in token order, 8 rows (lanes) at a time; a lane's arithmetic is the scalar one
  // (max_ps(s, mx) is std::max(mx, s); the tokens a row does not see add +0 to its sum, and their P is 0).
  sc.n.resize(Mp);
  for (int64_t i = 0; i < Mp; ++i) sc.n[i] = i < M ? (int32_t)std::clamp<int64_t>(end[i] - c0, 0, L) : 0;
  alignas(32) float mv[8], lv[8];
  for (int64_t i = 0; i < Mp; i += 8) {
    const __m256i n = _mm256_loadu_si256((const __m256i*)(sc.n.data() + i));
    __m256 mx = _mm256_set1_ps(NEG_INF);
    for (int64_t j = 0; j < L; ++j) {
      const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(n, _mm256_set1_epi32((int32_t)j)));
      mx = _mm256_blendv_ps(mx, _mm256_max_ps(_mm256_loadu_ps(St + j * Mp + i), mx), keep);
    }
    // exp clamps its input, so a lane that sees nothing (mx = -inf) stays finite before the mask zeroes it
    __m256 sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < L; ++j) {
      const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(n, _mm256_set1_epi32((int32_t)j)));
      const __m256 p = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_loadu_ps(St + j * Mp + i), mx)), keep);
      _mm256_storeu_ps(St + j * Mp + i, p);
      sum = _mm256_add_ps(sum, p);
    }
    _mm256_store_ps(mv, mx);
    _mm256_store_ps(lv, sum);
    for (int64_t r = i; r < std::min(M, i + 8); ++r) {
      m[r] = mv[r - i];
      l[r] = lv[r - i];
    }
  }
  std::fill(o, o + M * D, 0.0f);
  in_blocks(M, [&](int64_t i, auto R) {
    constexpr int r = decltype(R)::value;
    if (D % 16 == 0)
      for (int64_t d0 = 0; d0 < D; d0 += 16) pv_block<r, 2>(St, Mp, i, sc.v.data(), L, d0, o, D);
    else
      for (int64_t d0 = 0; d0 < D; d0 += 8) pv_block<r, 1>(St, Mp, i, sc.v.data(), L, d0, o, D);
  });
}

// Fold one chunk's state (mc, lc, oc [D]) into a row's running state (m, l, o [D]); a chunk the row did not
// see (lc == 0) is skipped, so trailing masked chunks change nothing.
inline void fold(float& m, float& l, float* o, float mc, float lc, const float* oc, int64_t D) {
  if (lc == 0.0f) return;
  const float mn = std::max(m, mc);
  const float a = m == NEG_INF ? 0.0f : std::exp(m - mn), b = std::exp(mc - mn);
  l = l * a + lc * b;
  m = mn;
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
  for (int64_t d = 0; d < D; d += 8)
    _mm256_storeu_ps(o + d, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(o + d), va),
                                          _mm256_mul_ps(_mm256_loadu_ps(oc + d), vb)));
}

// o /= l, lse = m + log l; a row that saw nothing: o = 0, lse = -inf.
inline void finish(float m, float l, float* o, float* lse, int64_t D) {
  if (l == 0.0f) {
    std::fill(o, o + D, 0.0f);
    *lse = NEG_INF;
    return;
  }
  *lse = m + std::log(l);
  const __m256 inv = _mm256_set1_ps(1.0f / l);
  for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(o + d), inv));
}

// Qt [D, Mp] of G query heads (h * G ...) of token row `q` (a [Hq, D] row with head stride hs), pre-scaled;
// padding lanes zero.
inline void pack_q(const float* q, int64_t hs, int64_t h0, int64_t G, int64_t D, int64_t Mp, int64_t lane0,
                   float scale, float* Qt) {
  for (int64_t g = 0; g < G; ++g) {
    const float* src = q + (h0 + g) * hs;
    for (int64_t d = 0; d < D; ++d) Qt[d * Mp + lane0 + g] = src[d] * scale;
  }
}

}  // namespace radixrt::kv
