// The x16 layouts: a GGUF block type's weight repacked once, at load, so that 16 weight rows (output channels)
// sit side by side 4 bytes at a time. One 64-byte vector then holds 4 consecutive elements of each of 16 rows
// (row r in dword lane r), and one vpdpbusd against 4 activation bytes broadcast to every lane does 64
// multiply-adds for 16 outputs at once: no horizontal sums, each weight byte unpacked once per pass and used by
// every activation row of the pass. It is also AMX's B-tile layout (K/4 rows of 16 columns x 4 bytes).
// Source of the idea: llama.cpp's ggml-cpu repack.cpp (block_q4_Kx8 and friends) and llamafile's tinyBLAS,
// read as descriptions only; the layouts, arithmetic and code here are our own.
//
// A weight [N, K] (N a multiple of 16) becomes [N / 16, K / QK * BYTES] uint8: group g (rows 16 g .. 16 g + 15),
// then block s along K. Each block is a header (per-row scales, lane r = row r) and planes of 64 bytes.
//
//   Q4_K  (QK 256, 2368 B = 16 x 144):
//     [0, 32)       d[16]            fp16
//     [32, 64)      dmin[16]         fp16
//     [64, 192)     sc[8 j][16 r]    u8, 6-bit scale of sub-block j
//     [192, 320)    mn[4 i][16 r][2] u8, 6-bit minimums of sub-blocks 2i and 2i + 1 (pairs for vpdpwssd)
//     [320, 2368)   qs[4 c][8 t][16 r][4] the file's qs[32 c + 4 t .. + 4] of row r: low nibbles are elements
//                   4t .. 4t + 3 of sub-block 2c, high nibbles those of sub-block 2c + 1
//   Q5_K  (QK 256, 2880 B = 16 x 176): Q4_K's header [0, 320), then
//     [320, 832)    qh[8 t][16 r][4] the file's qh[4 t .. + 4]: bit j of byte i is the fifth bit of element
//                   4t + i of sub-block j
//     [832, 2880)   qs as Q4_K's
//   Q6_K  (QK 256, 3360 B = 16 x 210):
//     [0, 32)       d[16]            fp16
//     [32, 288)     sc[8 i][16 r][2] int8, the scales of groups 2i and 2i + 1 (16 elements each)
//     [288, 2336)   ql[2 h][2 k][8 t][16 r][4] the file's ql[64 h + 32 k + 4 t .. + 4]: low nibbles are
//                   sub-block 4h + k, high nibbles sub-block 4h + k + 2 (elements 4t .. 4t + 3 of each)
//     [2336, 3360)  qh[2 h][8 t][16 r][4] the file's qh[32 h + 4 t .. + 4]: bits 2k, 2k + 1 of a byte are the
//                   high two bits of sub-block 4h + k's element
//   Q8_0  (QK 32, 544 B = 16 x 34):
//     [0, 32)       d[16]            fp16
//     [32, 544)     qs[8 t][16 r][4] the file's int8 weights XOR 0x80 (w + 128, unsigned, for vpdpbusd)
//   The legacy 32-element types (lblocks.h: element j < 16 the low nibble of qs[j], j + 16 its high nibble, bit j
//   of qh element j's fifth bit), as large as the file's blocks (16 x 18, 20, 22, 24):
//   Q4_0  (QK 32, 288 B):  [0, 32) d[16] fp16;  [32, 288) qs
//   Q4_1  (QK 32, 320 B):  [0, 32) d[16] fp16;  [32, 64) m[16] fp16;  [64, 320) qs
//   Q5_0  (QK 32, 352 B):  [0, 32) d[16] fp16;  [32, 96) qh;  [96, 352) qs
//   Q5_1  (QK 32, 384 B):  [0, 32) d[16] fp16;  [32, 64) m[16] fp16;  [64, 128) qh;  [128, 384) qs
//     qs[4 t][16 r][4]   the file's qs[4 t .. + 4] of row r: low nibbles are elements 4t .. 4t + 3, high nibbles
//                        elements 16 + 4t .. 16 + 4t + 3 (plane t pairs with activation dwords t and 4 + t)
//     qh[16 r][4]        the fifth bits regrouped: bit t of byte i is element 4t + i's, bit 4 + t element
//                        16 + 4t + i's. Why not the file's u32: then plane t's fifth bits are bit t (low nibbles)
//                        and bit 4 + t (high) of the byte beside each weight byte, one shift and mask each (as
//                        Q5_K's qh); the file's order would need a per-byte bit gather for every plane.
//
// The arithmetic (one output per lane, the same on every path: AVX-512 VNNI, AVX2, AMX, the torch twin), for
// output (m, n), over the blocks in order from acc = 0, where y are row m's int8 activations (q8_act.h: per 256
// with per-16 sums Y_g for the K-quants, per 32 for the 32-element types), dy their scale, and every integer sum exact in int32:
//   Q4_K / Q5_K: D_j = sum q y over sub-block j;  I = sum_j sc_j D_j;  C = sum_j mn_j (Y_2j + Y_2j+1)
//                acc = fma(float(I), d * dy, acc);  acc = fma(-float(C), dmin * dy, acc)
//   Q6_K:        D_g = sum q y over group g (q unsigned, 0 .. 63);  I = sum_g sc_g D_g - 32 sum_g sc_g Y_g
//                acc = fma(float(I), d * dy, acc)
//   Q8_0:        D = sum w y over the block (w signed);  acc = fma(float(D), d * dy, acc)
//   Q4_0 / Q5_0: S = sum q y - Z Y, Z = 8 / 16 and Y = sum y over the block (q unsigned: 0 .. 15 / 0 .. 31);
//                acc = fma(float(S), d * dy, acc)   (Q4_0: q4_0_lanes.h's arithmetic, the same bits)
//   Q4_1 / Q5_1: S = sum q y;  acc = fma(float(S), d * dy, acc);  acc = fma(float(Y), m * dy, acc)
//                (the minimum's term m dy Y, its own fma per block: Y and S are exact in fp32, |S| < 2^17)
// with d * dy (m * dy) rounded to fp32 once and each fma rounded once. Integer sums do not depend on their order, so
// every path (and every tile shape and thread split) gives the same bits: batch invariance by construction.
#pragma once
#include <cstdint>
#include <cstring>

namespace radixrt {
namespace ggml {
namespace x16 {

constexpr int64_t FLAG = 256;  // ggml type | FLAG: the weight is in that type's x16 layout

// get_scale_min_k4 (ggml-quants.c): the 6-bit scale and minimum of sub-block j from the 12 packed bytes.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& mn) {
  if (j < 4) {
    sc = q[j] & 63;
    mn = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// 4 bytes of row r into plane dword (t, r): planes of 16 rows x 4 bytes
inline void put4(uint8_t* plane, int t, int r, const uint8_t* src) { std::memcpy(plane + (t * 16 + r) * 4, src, 4); }

struct Q4_K {
  static constexpr int QK = 256, GGUF = 144, BYTES = 2368, QS = 320;
  static constexpr bool HAS_QH = false;
  static void pack(const uint8_t* const rows[16], uint8_t* o) {
    for (int r = 0; r < 16; ++r) {
      const uint8_t* b = rows[r];
      std::memcpy(o + 2 * r, b, 2);
      std::memcpy(o + 32 + 2 * r, b + 2, 2);
      for (int j = 0; j < 8; ++j) scale_min_k4(j, b + 4, o[64 + 16 * j + r], o[192 + 32 * (j >> 1) + 2 * r + (j & 1)]);
      for (int c = 0; c < 4; ++c)
        for (int t = 0; t < 8; ++t) put4(o + QS + c * 512, t, r, b + 16 + 32 * c + 4 * t);
    }
  }
};

struct Q5_K {
  static constexpr int QK = 256, GGUF = 176, BYTES = 2880, QH = 320, QS = 832;
  static constexpr bool HAS_QH = true;
  static void pack(const uint8_t* const rows[16], uint8_t* o) {
    for (int r = 0; r < 16; ++r) {
      const uint8_t* b = rows[r];
      std::memcpy(o + 2 * r, b, 2);
      std::memcpy(o + 32 + 2 * r, b + 2, 2);
      for (int j = 0; j < 8; ++j) scale_min_k4(j, b + 4, o[64 + 16 * j + r], o[192 + 32 * (j >> 1) + 2 * r + (j & 1)]);
      for (int t = 0; t < 8; ++t) put4(o + QH, t, r, b + 16 + 4 * t);
      for (int c = 0; c < 4; ++c)
        for (int t = 0; t < 8; ++t) put4(o + QS + c * 512, t, r, b + 48 + 32 * c + 4 * t);
    }
  }
};

struct Q6_K {
  static constexpr int QK = 256, GGUF = 210, BYTES = 3360, SC = 32, QL = 288, QH = 2336;
  static void pack(const uint8_t* const rows[16], uint8_t* o) {
    for (int r = 0; r < 16; ++r) {
      const uint8_t* b = rows[r];
      std::memcpy(o + 2 * r, b + 208, 2);
      for (int g = 0; g < 16; ++g) o[SC + 32 * (g >> 1) + 2 * r + (g & 1)] = b[192 + g];
      for (int h = 0; h < 2; ++h) {
        for (int k = 0; k < 2; ++k)
          for (int t = 0; t < 8; ++t) put4(o + QL + (2 * h + k) * 512, t, r, b + 64 * h + 32 * k + 4 * t);
        for (int t = 0; t < 8; ++t) put4(o + QH + h * 512, t, r, b + 128 + 32 * h + 4 * t);
      }
    }
  }
};

struct Q8_0 {
  static constexpr int QK = 32, GGUF = 34, BYTES = 544, QS = 32;
  static void pack(const uint8_t* const rows[16], uint8_t* o) {
    for (int r = 0; r < 16; ++r) {
      const uint8_t* b = rows[r];
      std::memcpy(o + 2 * r, b, 2);
      for (int t = 0; t < 8; ++t) {
        uint8_t u[4];
        for (int i = 0; i < 4; ++i) u[i] = b[2 + 4 * t + i] ^ 0x80;
        put4(o + QS, t, r, u);
      }
    }
  }
};

// Q4_0, Q4_1, Q5_0, Q5_1: GGUF bytes per block, whether there is a minimum m (fp16 after d) and a fifth bit.
template <int GGUF_, bool MIN_, bool QH_>
struct Legacy32 {
  static constexpr int QK = 32, GGUF = GGUF_, BYTES = 16 * GGUF_;
  static constexpr bool MIN = MIN_, HAS_QH = QH_;
  static constexpr int MN = 32, QH = MIN ? 64 : 32, QS = QH + (QH_ ? 64 : 0);
  static constexpr int ZERO = MIN ? 0 : QH_ ? 16 : 8;  // the zero point subtracted from q (0: the minimum m)
  static void pack(const uint8_t* const rows[16], uint8_t* o) {
    for (int r = 0; r < 16; ++r) {
      const uint8_t* b = rows[r];
      std::memcpy(o + 2 * r, b, 2);
      if constexpr (MIN) std::memcpy(o + MN + 2 * r, b + 2, 2);
      if constexpr (HAS_QH) {
        uint32_t qh;
        std::memcpy(&qh, b + (MIN ? 4 : 2), 4);
        uint8_t u[4] = {};
        for (int i = 0; i < 4; ++i)
          for (int t = 0; t < 4; ++t)
            u[i] |= (((qh >> (4 * t + i)) & 1) << t) | (((qh >> (16 + 4 * t + i)) & 1) << (4 + t));
        put4(o + QH, 0, r, u);
      }
      for (int t = 0; t < 4; ++t) put4(o + QS, t, r, b + GGUF - 16 + 4 * t);
    }
  }
};
struct Q4_0 : Legacy32<18, false, false> {};
struct Q4_1 : Legacy32<20, true, false> {};
struct Q5_0 : Legacy32<22, false, true> {};
struct Q5_1 : Legacy32<24, true, true> {};

// One call's operands: the x16 weight, the quantized activations (q8_act.h) and what each type's fold reads.
struct XCtx {
  const uint8_t* W;      // [N / 16, K / QK * BYTES]
  int64_t K, N;
  const int8_t* q;       // [M, K]
  const float* d;        // [M, K / QK]
  const int16_t* bsums;  // K-quants: [M, K / 16], the sums of each 16 q
  const int32_t* ypair;  // Q4_K / Q5_K: [M, K / 256, 4], int16 pairs (Y_2i, Y_2i+1), Y_j the sum of sub-block j
  const int32_t* yoff;   // Q8_0: [M, K / 32], -128 * the sum of the block's q
  const int32_t* ysum;   // Q4_0, Q4_1, Q5_0, Q5_1: [M, K / 32], Y = the sum of the block's q
  float* out;            // [M, N]
};

// GGUF rows [N, K / QK * GGUF] -> x16 [N / 16, K / QK * BYTES], groups [g0, g1).
template <class T>
void repack(const uint8_t* w, int64_t K, int64_t g0, int64_t g1, uint8_t* out) {
  const int64_t nb = K / T::QK, row = nb * T::GGUF;
  for (int64_t g = g0; g < g1; ++g)
    for (int64_t s = 0; s < nb; ++s) {
      const uint8_t* rows[16];
      for (int r = 0; r < 16; ++r) rows[r] = w + (16 * g + r) * row + s * T::GGUF;
      T::pack(rows, out + (g * nb + s) * T::BYTES);
    }
}

}  // namespace x16
}  // namespace ggml
}  // namespace radixrt
