// The SA3 DiT's self-attention heads out of its fused QKV rows, in one pass: per-head RMS norm
// of queries and keys, rotary positions on their first `rot` channels (half-split pairs), and
// the (batch, heads, tokens, head_dim) layout attention reads (audiofast/diffusion/int8_block.py).
// In PyTorch that is two norms, two rotations and four layout copies per block.
#include "qk_norm_rope.h"

#include <cmath>
#include <vector>

#include "array.h"
#include "avx2.h"
#include "pool.h"

namespace audiofast {

void norm_rotate(const float* src, const float* gain, int64_t d, int64_t rot, float eps,
                 const float* cos, const float* sin, float* scratch, float* dst) {
  const int64_t half = rot / 2;
  if (d % 8 == 0 && half % 8 == 0) {  // the DiT's heads (32 wide, 16 rotated): 8 lanes
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8) {
      const __m256 x = _mm256_loadu_ps(src + i);
      acc = _mm256_fmadd_ps(x, x, acc);
    }
    const __m256 inv = _mm256_set1_ps(1.f / std::sqrt(sum8(acc) / static_cast<float>(d) + eps));
    for (int64_t i = 0; i < d; i += 8)
      _mm256_storeu_ps(scratch + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(src + i), inv),
                                                  _mm256_loadu_ps(gain + i)));
    for (int64_t i = 0; i < half; i += 8) {
      const __m256 a = _mm256_loadu_ps(scratch + i), b = _mm256_loadu_ps(scratch + i + half);
      const __m256 c0 = _mm256_loadu_ps(cos + i), s0 = _mm256_loadu_ps(sin + i);
      const __m256 c1 = _mm256_loadu_ps(cos + i + half), s1 = _mm256_loadu_ps(sin + i + half);
      _mm256_storeu_ps(dst + i, _mm256_fmsub_ps(a, c0, _mm256_mul_ps(b, s0)));
      _mm256_storeu_ps(dst + i + half, _mm256_fmadd_ps(b, c1, _mm256_mul_ps(a, s1)));
    }
    for (int64_t i = rot; i < d; i += 8) _mm256_storeu_ps(dst + i, _mm256_loadu_ps(scratch + i));
    return;
  }
  float sum = 0.f;
  for (int64_t i = 0; i < d; ++i) sum += src[i] * src[i];
  const float inv = 1.f / std::sqrt(sum / static_cast<float>(d) + eps);
  for (int64_t i = 0; i < d; ++i) scratch[i] = src[i] * inv * gain[i];
  for (int64_t i = 0; i < half; ++i)
    dst[i] = scratch[i] * cos[i] - scratch[i + half] * sin[i];
  for (int64_t i = half; i < rot; ++i)
    dst[i] = scratch[i] * cos[i] + scratch[i - half] * sin[i];
  for (int64_t i = rot; i < d; ++i) dst[i] = scratch[i];
}

void qk_norm_rope(const float* qkv, int64_t batch, int64_t tokens, int64_t heads, int64_t d,
                  int64_t rot, const float* q_gain, const float* k_gain, float eps,
                  const float* cos, const float* sin, float* q, float* k, float* v) {
  check(rot % 2 == 0 && rot <= d, "qk_norm_rope: rotary channels must be even and <= head dim");
  const int64_t width = heads * d;
  parallel_for(batch * tokens, [&](int64_t r0, int64_t r1) {
    std::vector<float> scratch(d);
    for (int64_t m = r0; m < r1; ++m) {
      const int64_t b = m / tokens, n = m % tokens;
      const float* row = qkv + m * 3 * width;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t out = ((b * heads + h) * tokens + n) * d;
        norm_rotate(row + h * d, q_gain, d, rot, eps, cos + n * rot, sin + n * rot,
                    scratch.data(), q + out);
        norm_rotate(row + width + h * d, k_gain, d, rot, eps, cos + n * rot, sin + n * rot,
                    scratch.data(), k + out);
        const float* vs = row + 2 * width + h * d;
        for (int64_t i = 0; i < d; ++i) v[out + i] = vs[i];
      }
    }
  });
}

}  // namespace audiofast
