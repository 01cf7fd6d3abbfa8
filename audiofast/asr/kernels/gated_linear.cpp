// The SA3 DiT's gated residual linears (audiofast/diffusion/int8_block.py): the attention
// output projection, x + to_out(a) * gate[b], and the feed-forward's second linear, whose
// input is the GLU value * silu(gate) of the first one's output, in one call each.
//
// In PyTorch the feed-forward half is a chunk, silu, a product and a quantization pass before
// the int8 GEMM and a sigmoid-gated addcmul after it; here the GLU and the 8-bit quantization
// are one pass per row and the gated residual is the GEMM's epilogue, applied in registers.
#include <cmath>
#include <vector>

#include "avx2.h"
#include "pool.h"
#include "quant_linear.h"

namespace audiofast {

namespace {

// value * silu(gate) over n floats (n a multiple of 8). The DiT's feed-forward takes its GLU
// in the projection's epilogue instead (Epilogue::glu_pairs); this is the path for the rest.
void glu_silu(const float* value, const float* gate, int64_t n, float* out) {
  for (int64_t k = 0; k < n; k += 8)
    _mm256_storeu_ps(out + k, glu8(_mm256_loadu_ps(value + k), _mm256_loadu_ps(gate + k)));
}

}  // namespace

void gated_linear(const QuantLinear& L, const float* x, int64_t rows, int64_t tokens, bool glu,
                  const float* residual, const float* gate, float* y) {
  const int64_t n = L.in;  // a multiple of 32 (linear_at checks)
  std::vector<uint8_t> xq(rows * n);
  std::vector<RowScale> rs(rows);
  parallel_for(rows, [&](int64_t r0, int64_t r1) {
    std::vector<float> a(glu ? n : 0);
    for (int64_t m = r0; m < r1; ++m) {
      const float* row = x + m * (glu ? 2 * n : n);
      if (glu) glu_silu(row, row + n, n, a.data());
      rs[m] = quantize_row(glu ? a.data() : row, n, &xq[m * n]);
    }
  });
  Epilogue epilogue;  // y = residual + y * gate[sample]
  epilogue.x = residual;
  epilogue.gate = gate;
  epilogue.tokens = tokens;
  linear_quantized(L, xq, rs.data(), rows, y, epilogue);
}

}  // namespace audiofast
