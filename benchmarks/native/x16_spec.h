// The bench's operands and its independent reference (benchmarks/native/x16_bench.cpp): the activations quantized
// as x16_mm.cpp does (q8_act.h), and a scalar reading of x16_layout.h's arithmetic straight from one GGUF row
// (independent of the repack, so the bench checks the repack too).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>
#include "block_io.h"
#include "q8_act.h"
#include "x16_layout.h"

namespace x16_bench {

using namespace radixrt::ggml;
using namespace radixrt::ggml::x16;

struct Act {
  std::vector<int8_t> q;
  std::vector<float> d, s;
  std::vector<int16_t> bsums;
  std::vector<int32_t> ypair, yoff, ysum;
};

Act quantize(const std::vector<float>& x, int64_t M, int64_t K, int qk) {
  const int64_t nb = K / qk;
  Act a;
  a.q.resize(M * K);
  a.d.resize(M * nb);
  if (qk == 256) {
    a.bsums.resize(M * K / 16);
    a.ypair.resize(M * nb * 4);
  } else {
    a.s.resize(M * nb);
    a.yoff.resize(M * nb);
    a.ysum.resize(M * nb);
  }
  for (int64_t m = 0; m < M; ++m) {
    int8_t* qm = a.q.data() + m * K;
    if (qk == 256) {
      int16_t* bs = a.bsums.data() + m * K / 16;
      radixrt::q8::quantize_row_256(x.data() + m * K, K, qm, a.d.data() + m * nb, bs);
      for (int64_t b = 0; b < nb; ++b)
        for (int i = 0; i < 4; ++i) {
          const int16_t* p = bs + 16 * b + 4 * i;
          const uint32_t lo = (uint16_t)(int16_t)(p[0] + p[1]), hi = (uint16_t)(int16_t)(p[2] + p[3]);
          a.ypair[(m * nb + b) * 4 + i] = (int32_t)(lo | (hi << 16));
        }
    } else {
      radixrt::q8::quantize_row_32(x.data() + m * K, K, qm, a.d.data() + m * nb, a.s.data() + m * nb);
      for (int64_t b = 0; b < nb; ++b) {
        int32_t sum = 0;
        for (int i = 0; i < 32; ++i) sum += qm[32 * b + i];
        a.ysum[m * nb + b] = sum;
        a.yoff[m * nb + b] = -128 * sum;
      }
    }
  }
  return a;
}

// The arithmetic of x16_layout.h read from one GGUF row (independent of the repack).
float spec_row(const std::string& type, const uint8_t* row, const Act& a, int64_t m, int64_t K) {
  float acc = 0.0f;
  const int8_t* yq = a.q.data() + m * K;
  if (type == "Q4_0" || type == "Q4_1" || type == "Q5_0" || type == "Q5_1") {
    const bool five = type[1] == '5', one = type[3] == '1';
    const int bytes = 18 + 2 * one + 4 * five, zero = one ? 0 : five ? 16 : 8;
    for (int64_t b = 0; b < K / 32; ++b) {
      const uint8_t* p = row + bytes * b;
      const uint8_t* qs = p + bytes - 16;
      uint32_t qh = 0;
      if (five) std::memcpy(&qh, p + 2 + 2 * one, 4);
      const int64_t at = m * (K / 32) + b;
      int32_t S = -zero * a.ysum[at];
      for (int j = 0; j < 32; ++j)
        S += (((j < 16 ? qs[j] : qs[j - 16] >> 4) & 0xF) | (((qh >> j) & 1) << 4)) * yq[32 * b + j];
      acc = std::fmaf((float)S, fp16(p) * a.d[at], acc);
      if (one) acc = std::fmaf((float)a.ysum[at], fp16(p + 2) * a.d[at], acc);
    }
    return acc;
  }
  if (type == "Q8_0") {
    for (int64_t b = 0; b < K / 32; ++b) {
      const uint8_t* p = row + 34 * b;
      int32_t D = 0;
      for (int i = 0; i < 32; ++i) D += (int8_t)p[2 + i] * yq[32 * b + i];
      acc = std::fmaf((float)D, fp16(p) * a.d[m * (K / 32) + b], acc);
    }
    return acc;
  }
  for (int64_t s = 0; s < K / 256; ++s) {
    const int8_t* y = yq + 256 * s;
    const int16_t* bs = a.bsums.data() + m * K / 16 + 16 * s;
    const float dy = a.d[m * (K / 256) + s];
    if (type == "Q6_K") {
      const uint8_t* p = row + 210 * s;
      int32_t I = 0;
      for (int e = 0; e < 256; ++e) {
        const int h = e / 128, k = (e % 128) / 32, l = e % 32;
        const uint8_t qlb = p[64 * h + 32 * (k & 1) + l], qhb = p[128 + 32 * h + l];
        const int q = ((k < 2 ? qlb : qlb >> 4) & 0xF) | (((qhb >> (2 * k)) & 3) << 4);
        I += (int8_t)p[192 + e / 16] * q * y[e];
      }
      for (int g = 0; g < 16; ++g) I -= 32 * (int8_t)p[192 + g] * bs[g];
      acc = std::fmaf((float)I, fp16(p + 208) * dy, acc);
      continue;
    }
    const int bytes = type == "Q4_K" ? 144 : 176;
    const uint8_t* p = row + bytes * s;
    const uint8_t* qs = p + (type == "Q4_K" ? 16 : 48);
    int32_t I = 0, C = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, mn;
      scale_min_k4(j, p + 4, sc, mn);
      int32_t D = 0;
      for (int i = 0; i < 32; ++i) {
        int q = (j & 1 ? qs[32 * (j >> 1) + i] >> 4 : qs[32 * (j >> 1) + i]) & 0xF;
        if (type == "Q5_K") q |= ((p[16 + i] >> j) & 1) << 4;
        D += q * y[32 * j + i];
      }
      I += sc * D;
      C += mn * (bs[2 * j] + bs[2 * j + 1]);
    }
    acc = std::fmaf((float)I, fp16(p) * dy, acc);
    acc = std::fmaf(-(float)C, fp16(p + 2) * dy, acc);
  }
  return acc;
}

}  // namespace x16_bench
