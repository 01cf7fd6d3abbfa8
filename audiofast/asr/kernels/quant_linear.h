// The fused decoder's quantized linear layers: int8 weights per output channel
// (int8_linear.cpp) or int4 weights per group of inputs (int4_linear.cpp). Either way each row's
// activations are quantized to 8 bits over the row's own range and products are summed exactly
// in int32 (AVX2, or AVX-512 VNNI where the CPU has it: the same integers), so a row's outputs
// never depend on the rows beside it and both instruction sets give identical floats.
#pragma once
#include "array.h"

#include <cstdint>
#include <vector>

namespace audiofast {

constexpr int kArraysPerLinear = 4;  // packed weight, scales, zero-point terms, bias
constexpr int64_t kBlock = 16;        // outputs per packed weight block

// int8 (arrays: weight int8, scale f32, row sums i32, bias f32). Weights are packed (see
// int8_pack.pack_int8_weight) in blocks of 16 outputs: for each group of 4 inputs, 64 bytes
// hold those 4 weights of each of the 16 outputs. One 32-bit broadcast of 4 activations then
// multiplies all 16 outputs at once and every integer lane of the accumulator is one output.
struct Int8Weights {
  const int8_t* weight;  // (blocks, in / 4, 16 x 4)
  const float* scale;    // per output channel
  const int32_t* wsum;   // sum of each int8 weight row: the zero point's share of a product
};

// int4 (arrays: weight uint8, scales f16, zero terms f32, bias f32; see int4_pack.py). The
// same blocks of 16 outputs, two 4-input groups per 64 bytes: byte 4 o + i holds input
// 8 p + i of output o in its low nibble and input 8 p + 4 + i in its high one, each stored as
// w + 8 (w in [-8, 7]). Each output has one fp16 scale per `group` inputs.
struct Int4Weights {
  const uint8_t* weight;   // (blocks, in / 8, 64)
  const uint16_t* scale;   // (blocks, in / group, 16) fp16
  const float* zero_term;  // per output: sum over groups of scale x the group's weight sum
  int64_t group;
};

struct QuantLinear {
  int bits;  // 8 or 4
  Int8Weights int8;
  Int4Weights int4;
  const float* bias;
  int64_t out, in, blocks;
};

// The linear whose four arrays start at p[i], checked; the weight's dtype says which kind.
QuantLinear linear_at(const Array* p, size_t i);

// y (rows, out) = L(x (rows, in)); row m's outputs depend on row m alone. width (default
// L.in): x's row width when the packed weight is zero-padded to the next multiple of 32 (the
// SA3 DiT's 513-wide io layers): each row is padded with zeros as it is quantized, which is
// exact (the range always holds 0 and the padded weights are 0).
void linear(const QuantLinear& L, const float* x, int64_t rows, float* y, int64_t width = -1);

// Whether linears take the AVX-512 VNNI path (the CPU has it; AUDIOFAST_NO_VNNI unset).
bool use_vnni();

// A row of activations in 8 bits over its own range: x ~ scale * (q - zero), 0 exact.
struct RowScale {
  float scale;
  int32_t zero;
};
RowScale quantize_row(const float* x, int64_t n, uint8_t* q);

// What happens to each output as it is made (the default: nothing).
struct Epilogue {
  // A gated residual: y = fma(L(a), gate[row / tokens], x) (x rows x out, gate samples x out).
  const float* x = nullptr;
  const float* gate = nullptr;
  int64_t tokens = 1;
  // A GLU: output blocks 2k and 2k + 1 (16 channels each) are the value and gate of y's
  // channels 16k..16k+15, y = value * silu(gate), out / 2 wide (L.out a multiple of 32; the
  // weights packed in that order, int8_pack.glu_pairs_order).
  bool glu_pairs = false;
};

// y = L(rows already quantized by quantize_row: q rows x in, one scale each), through the
// epilogue. q may be rewritten (the AVX2 path splits each row in place of it).
void linear_quantized(const QuantLinear& L, std::vector<uint8_t>& q, const RowScale* rs,
                      int64_t rows, float* y, const Epilogue& epilogue = {});

// The SA3 DiT's pre-norm linears (modulated_linear.cpp): y = L(rms(x) * mult[b] + shift[b])
// with b = row / tokens (a sample's adaLN vectors, the norm's gain folded into mult), the norm,
// the modulation and the 8-bit quantization in one pass over x. glu_pairs: y = the GLU of
// L's output (Epilogue::glu_pairs), out / 2 wide.
void modulated_linear(const QuantLinear& L, const float* x, int64_t rows, int64_t tokens,
                      const float* mult, const float* shift, float eps, float* y,
                      bool glu_pairs = false);

// The SA3 DiT's gated residual linears (gated_linear.cpp): y = residual + L(a) * gate[b] with
// a = x (rows x in) or, glu, a = x[:, :in] * silu(x[:, in:]) (x rows 2 x in wide); b = row /
// tokens; residual null: y = L(a). L.out a multiple of 8.
void gated_linear(const QuantLinear& L, const float* x, int64_t rows, int64_t tokens, bool glu,
                  const float* residual, const float* gate, float* y);

// The int4 path (int4_linear.cpp), given every row already quantized (q: rows x in).
void linear_int4(const QuantLinear& L, const uint8_t* q, const RowScale* rs, int64_t rows,
                 float* y);

// Tests only: a parallel loop summing [0, n) that throws bad_alloc at index throw_at.
int64_t pool_selftest(int64_t n, int64_t throw_at);

}  // namespace audiofast
