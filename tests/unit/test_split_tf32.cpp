// The arithmetic of dtype fp32 on tensor cores (runtime/include/hectorgen/tc_gemm.cuh, Fp32Math::kSplitTf32),
// emulated on the host: each fp32 operand is split into a tf32 head (cvt.rna: round to nearest, ties away from
// zero, 10 explicit significand bits) and the tf32 rounding of what the head leaves out; a product is taken as
// tail_a * head_b + head_a * tail_b + head_a * head_b, each term exact in fp32 (11 x 11 significand bits), added
// in fp32. The claims of docs/gemm_template.md checked here: the split keeps 22 of the 24 significand bits; a K = 64
// dot product so computed is within 2x of fp32's own error, and some 600x more exact than tf32's single rounding.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

namespace {

// cvt.rna.tf32.f32: keep the sign, the exponent and the top 10 significand bits, rounding to nearest with ties away
// from zero (add half an ulp of tf32 to the magnitude's bits, then clear the 13 low bits). Finite inputs only.
float to_tf32(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  bits = (bits + 0x1000u) & ~0x1fffu;
  float r;
  std::memcpy(&r, &bits, sizeof r);
  return r;
}

struct Split {
  float head, tail;
};
Split split_tf32(float v) {
  const float head = to_tf32(v);
  return {head, to_tf32(v - head)};
}

// sum_k a[k] * b[k] in fp32 accumulators, k in order, with the three split products of each term (small first, as
// warp_mma_step_split issues them), or with tf32's single rounding.
float dot_split(const float* a, const float* b, int n) {
  float acc = 0.f;
  for (int k = 0; k < n; ++k) {
    const Split x = split_tf32(a[k]), y = split_tf32(b[k]);
    acc += x.tail * y.head;
    acc += x.head * y.tail;
    acc += x.head * y.head;
  }
  return acc;
}
float dot_tf32(const float* a, const float* b, int n) {
  float acc = 0.f;
  for (int k = 0; k < n; ++k) acc += to_tf32(a[k]) * to_tf32(b[k]);
  return acc;
}
float dot_fp32(const float* a, const float* b, int n) {
  float acc = 0.f;
  for (int k = 0; k < n; ++k) acc += a[k] * b[k];
  return acc;
}

}  // namespace

TEST_CASE("tf32 rounding emulates cvt.rna: 10 significand bits, ties away from zero", "[tc][split]") {
  CHECK(to_tf32(1.0f) == 1.0f);
  CHECK(to_tf32(1.0f + 0x1p-11f) == 1.0f + 0x1p-10f);   // a tie: away from zero
  CHECK(to_tf32(-1.0f - 0x1p-11f) == -1.0f - 0x1p-10f);
  CHECK(to_tf32(1.0f + 0x1p-12f) == 1.0f);              // below half an ulp
  CHECK(to_tf32(1.0f + 0x1p-10f) == 1.0f + 0x1p-10f);   // representable
}

TEST_CASE("a split keeps 22 significand bits of an fp32 value", "[tc][split]") {
  std::mt19937 rng(20261128);
  std::uniform_real_distribution<float> mantissa(1.f, 2.f);
  std::uniform_int_distribution<int> exponent(-30, 30);
  double worst = 0, worst_head = 0;
  for (int i = 0; i < 200000; ++i) {
    const float v = std::ldexp(mantissa(rng), exponent(rng)) * (i % 2 ? -1.f : 1.f);
    const Split s = split_tf32(v);
    CHECK(to_tf32(s.head) == s.head);
    CHECK(to_tf32(s.tail) == s.tail);
    worst = std::max(worst, std::abs((static_cast<double>(s.head) + s.tail - v) / v));
    worst_head = std::max(worst_head, std::abs((static_cast<double>(s.head) - v) / v));
  }
  CHECK(worst <= 0x1p-22);       // head + tail: 22 bits
  CHECK(worst_head > 0x1p-12);   // the head alone: tf32's 11
}

TEST_CASE("K = 64 dot products of split operands are about as exact as fp32's, far more than tf32's", "[tc][split]") {
  std::mt19937 rng(7);
  std::normal_distribution<float> value(0.f, 1.f);
  constexpr int kK = 64;
  double worst_split = 0, worst_fp32 = 0, worst_tf32 = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    float a[kK], b[kK];
    double exact = 0, magnitude = 0;
    for (int k = 0; k < kK; ++k) {
      a[k] = value(rng);
      b[k] = value(rng);
      exact += static_cast<double>(a[k]) * b[k];
      magnitude += std::abs(static_cast<double>(a[k]) * b[k]);
    }
    // Errors relative to sum |a_k b_k|, the scale of a dot product's rounding.
    worst_split = std::max(worst_split, std::abs(dot_split(a, b, kK) - exact) / magnitude);
    worst_fp32 = std::max(worst_fp32, std::abs(dot_fp32(a, b, kK) - exact) / magnitude);
    worst_tf32 = std::max(worst_tf32, std::abs(dot_tf32(a, b, kK) - exact) / magnitude);
  }
  INFO("worst relative errors: split " << worst_split << ", fp32 " << worst_fp32 << ", tf32 " << worst_tf32);
  CHECK(worst_split <= 2 * worst_fp32);
  CHECK(worst_split < 1e-6);
  CHECK(worst_tf32 > 300 * worst_split);  // ~600x: the fp32 sums, not the products, bound the split
}
