// One int8 linear layer for the fused decoder (int8_linear.cpp): packed weights, each row's
// activations quantized alone, exact int32 sums (AVX2, or AVX-512 VNNI where the CPU has it).
#pragma once
#include "array.h"

#include <cstdint>
#include <vector>

namespace audiofast {

constexpr int kArraysPerLinear = 4;  // packed int8 weight, scale, row sums, bias
constexpr int64_t kBlock = 16;        // outputs per packed weight block

// Weights are packed (see fused_decoder.pack_int8_weight) in blocks of 16 outputs: for each
// group of 4 inputs, 64 bytes hold those 4 weights of each of the 16 outputs. One 32-bit
// broadcast of 4 activations then multiplies all 16 outputs at once and every integer lane of
// the accumulator is one output: no horizontal sums.
struct Int8Linear {
  const int8_t* weight;  // (blocks, in / 4, 16 x 4)
  const float* scale;    // per output channel
  const int32_t* wsum;   // sum of each int8 weight row: the zero point's share of a product
  const float* bias;
  int64_t out, in, blocks;
};

// The linear whose four arrays start at p[i], checked.
Int8Linear linear_at(const Array* p, size_t i);

// y (rows, out) = L(x (rows, in)); row m's outputs depend on row m alone.
void linear(const Int8Linear& L, const float* x, int64_t rows, float* y);

// Whether linears take the AVX-512 VNNI path (the CPU has it; AUDIOFAST_NO_VNNI unset).
bool use_vnni();

// Tests only: a parallel loop summing [0, n) that throws bad_alloc at index throw_at.
int64_t pool_selftest(int64_t n, int64_t throw_at);

}  // namespace audiofast
