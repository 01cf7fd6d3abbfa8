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

// value * silu(gate) over n floats (n a multiple of 8); silu(g) = g * sigmoid(g) with
// sigmoid from exp(-|g|) (exp8 wants x <= 0).
void glu_silu(const float* value, const float* gate, int64_t n, float* out) {
  const __m256 sign = _mm256_set1_ps(-0.f), one = _mm256_set1_ps(1.f);
  for (int64_t k = 0; k < n; k += 8) {
    const __m256 g = _mm256_loadu_ps(gate + k);
    const __m256 e = exp8(_mm256_or_ps(g, sign));  // exp(-|g|)
    const __m256 inv = _mm256_div_ps(one, _mm256_add_ps(one, e));
    const __m256 neg = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
    const __m256 sig = _mm256_blendv_ps(inv, _mm256_mul_ps(e, inv), neg);
    _mm256_storeu_ps(out + k, _mm256_mul_ps(_mm256_loadu_ps(value + k), _mm256_mul_ps(g, sig)));
  }
}

// The same on 16 lanes (n a multiple of 16): the same operations, so the same bits.
__attribute__((target("avx512f"))) void glu_silu16(const float* value, const float* gate,
                                                   int64_t n, float* out) {
  const __m512 sign = _mm512_set1_ps(-0.f), one = _mm512_set1_ps(1.f);
  for (int64_t k = 0; k < n; k += 16) {
    const __m512 g = _mm512_loadu_ps(gate + k);
    const __m512 e = exp16(_mm512_castsi512_ps(_mm512_or_si512(  // exp(-|g|)
        _mm512_castps_si512(g), _mm512_castps_si512(sign))));
    const __m512 inv = _mm512_div_ps(one, _mm512_add_ps(one, e));
    const __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 sig = _mm512_mask_blend_ps(neg, inv, _mm512_mul_ps(e, inv));
    _mm512_storeu_ps(out + k, _mm512_mul_ps(_mm512_loadu_ps(value + k), _mm512_mul_ps(g, sig)));
  }
}

}  // namespace

void gated_linear(const QuantLinear& L, const float* x, int64_t rows, int64_t tokens, bool glu,
                  const float* residual, const float* gate, float* y) {
  const int64_t n = L.in;  // a multiple of 32 (linear_at checks)
  std::vector<uint8_t> xq(rows * n);
  std::vector<RowScale> rs(rows);
  const bool wide = use_vnni() && n % 16 == 0;  // the VNNI flag implies AVX-512F
  parallel_for(rows, [&](int64_t r0, int64_t r1) {
    std::vector<float> a(glu ? n : 0);
    for (int64_t m = r0; m < r1; ++m) {
      const float* row = x + m * (glu ? 2 * n : n);
      if (glu) (wide ? glu_silu16 : glu_silu)(row, row + n, n, a.data());
      rs[m] = quantize_row(glu ? a.data() : row, n, &xq[m * n]);
    }
  });
  const GatedResidual epilogue{residual, gate, tokens};  // y = residual + y * gate[sample]
  linear_quantized(L, xq, rs.data(), rows, y, residual ? &epilogue : nullptr);
}

}  // namespace audiofast
