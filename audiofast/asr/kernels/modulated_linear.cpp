// The SA3 DiT's pre-norm linears: RMS norm, adaLN modulation and 8-bit quantization of each
// token in one pass, then the int8 linear (audiofast/diffusion/int8_block.py).
//
// In PyTorch these are six full passes over the activations (square, mean, scale, gain,
// modulate, shift) and a seventh inside the kernel to quantize; at the proving ground's sizes
// they cost as much as the int8 linears themselves.
#include "quant_linear.h"

#include <cmath>
#include <vector>

#include "avx2.h"
#include "pool.h"

namespace audiofast {

void modulated_linear(const QuantLinear& L, const float* x, int64_t rows, int64_t tokens,
                      const float* mult, const float* shift, float eps, float* y,
                      bool glu_pairs) {
  const int64_t n = L.in;  // a multiple of 32 (linear_at checks)
  std::vector<uint8_t> xq(rows * n);
  std::vector<RowScale> rs(rows);
  parallel_for(rows, [&](int64_t r0, int64_t r1) {
    std::vector<float> h(n);
    for (int64_t m = r0; m < r1; ++m) {
      const float* row = x + m * n;
      const float* a = mult + (m / tokens) * n;
      const float* c = shift + (m / tokens) * n;
      __m256 acc = _mm256_setzero_ps();
      for (int64_t k = 0; k < n; k += 8) {
        const __m256 v = _mm256_loadu_ps(row + k);
        acc = _mm256_fmadd_ps(v, v, acc);
      }
      float lanes[8];
      _mm256_storeu_ps(lanes, acc);
      float sum = 0.f;
      for (float lane : lanes) sum += lane;
      const __m256 inv = _mm256_set1_ps(1.f / std::sqrt(sum / static_cast<float>(n) + eps));
      for (int64_t k = 0; k < n; k += 8) {
        const __m256 normed = _mm256_mul_ps(_mm256_loadu_ps(row + k), inv);
        _mm256_storeu_ps(&h[k], _mm256_fmadd_ps(normed, _mm256_loadu_ps(a + k),
                                                _mm256_loadu_ps(c + k)));
      }
      rs[m] = quantize_row(h.data(), n, &xq[m * n]);
    }
  });
  Epilogue epilogue;
  epilogue.glu_pairs = glu_pairs;
  linear_quantized(L, xq, rs.data(), rows, y, epilogue);
}

}  // namespace audiofast
