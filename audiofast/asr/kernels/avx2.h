// Small AVX2 + F16C helpers shared by the kernels.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace audiofast {

constexpr int64_t kHeadDim = 64;  // every Whisper size: d_model / heads == 64

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

inline __m256 load8(const uint16_t* p) {  // fp16, widened
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline __m256 load8(const int8_t* p) {  // int8, widened (exact)
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

inline float sum8(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_hadd_ps(x, x);
  return _mm_cvtss_f32(_mm_hadd_ps(x, x));
}

// a . b over n floats (n a multiple of 16), always summed in the same order.
inline float dot(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  return sum8(_mm256_add_ps(s0, s1));
}

// exp(x) for x <= 0 (softmax after subtracting the max): 2^n * e^r with a degree-6
// polynomial for e^r (the Cephes expf coefficients), ~1e-7 relative error.
constexpr float kExpMin = -87.3f, kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(kExpMin));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                          _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// exp8's operations on 16 lanes (the same bits lane for lane), for AVX-512 paths.
__attribute__((target("avx512f"))) inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(kExpMin));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[i]));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n),
                                                          _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

// value * silu(gate) lane by lane, silu(g) = g * sigmoid(g) with sigmoid from exp(-|g|) (exp8
// wants x <= 0): the DiT feed-forward's GLU. glu16 does the same operations on 16 lanes.
inline __m256 glu8(__m256 value, __m256 g) {
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 e = exp8(_mm256_or_ps(g, _mm256_set1_ps(-0.f)));  // exp(-|g|)
  const __m256 inv = _mm256_div_ps(one, _mm256_add_ps(one, e));
  const __m256 neg = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 sig = _mm256_blendv_ps(inv, _mm256_mul_ps(e, inv), neg);
  return _mm256_mul_ps(value, _mm256_mul_ps(g, sig));
}

__attribute__((target("avx512f"))) inline __m512 glu16(__m512 value, __m512 g) {
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512 e = exp16(_mm512_castsi512_ps(_mm512_or_si512(  // exp(-|g|)
      _mm512_castps_si512(g), _mm512_castps_si512(_mm512_set1_ps(-0.f)))));
  const __m512 inv = _mm512_div_ps(one, _mm512_add_ps(one, e));
  const __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512 sig = _mm512_mask_blend_ps(neg, inv, _mm512_mul_ps(e, inv));
  return _mm512_mul_ps(value, _mm512_mul_ps(g, sig));
}

// Exact (erf) GELU, as Whisper's, in place over n floats (n a multiple of 8): erf by
// Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7). ATen's gelu would run through oneDNN and
// start an OpenMP region per call, whose spinning thread then competed with ours.
inline void gelu(float* x, int64_t n) {
  const __m256 sign = _mm256_set1_ps(-0.f), one = _mm256_set1_ps(1.f);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 z = _mm256_mul_ps(v, _mm256_set1_ps(0.70710678118654752f));  // x / sqrt(2)
    const __m256 a = _mm256_andnot_ps(sign, z);
    const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), a, one));
    __m256 p = _mm256_set1_ps(1.061405429f);
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
    p = _mm256_mul_ps(p, t);
    const __m256 erf_abs = _mm256_fnmadd_ps(p, exp8(_mm256_mul_ps(_mm256_xor_ps(a, sign), a)), one);
    const __m256 erf = _mm256_or_ps(erf_abs, _mm256_and_ps(sign, z));  // erf is odd
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), v),
                                          _mm256_add_ps(one, erf)));
  }
}

// A row of n scores (n a multiple of 8) -> exp(score - top) in place; returns 1 / their sum.
inline float softmax_numerators(float* s, int64_t n, float top) {
  const __m256 topv = _mm256_set1_ps(top);
  __m256 total = _mm256_setzero_ps();
  for (int64_t t = 0; t < n; t += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), topv));
    _mm256_storeu_ps(s + t, e);
    total = _mm256_add_ps(total, e);
  }
  return 1.f / sum8(total);
}

// A query's score for key t: times the key's scale (int8 keys), stored, its running max kept.
inline void keep_score(float score, int64_t t, const float* key_scale, float* row, float& top) {
  if (key_scale) score *= key_scale[t];
  row[t] = score;
  top = score > top ? score : top;
}

// One query's n scores (a row of `padded` floats, top = their max) -> the weights its values
// are summed with: exp(score - top), times the value_scale of int8 values; returns 1 / the
// sum of the exps. Both attention paths call it: their softmax is the same arithmetic.
inline float score_weights(float* s, int64_t n, int64_t padded, float top,
                           const float* value_scale) {
  for (int64_t t = n; t < padded; ++t) s[t] = -INFINITY;
  const float inv_total = softmax_numerators(s, padded, top);
  if (value_scale)
    for (int64_t t = 0; t < n; ++t) s[t] *= value_scale[t];
  return inv_total;
}

// One head's attention of R <= kAttendRows pre-scaled queries (row r at q + r * q_stride, 64
// floats) over the same n keys and values (n x 64, float, fp16 or int8 widened as read; int8
// rows times their key_scale / value_scale, else those are null), row r into out + r *
// out_stride; scores needs R x (n rounded up to 8) floats. Each key and value row is widened
// once for all R queries (a draft's rows share their window), yet every query's arithmetic is
// the one-query case's, in the same order: a row's output does not depend on R.
constexpr int64_t kAttendRows = 4;
constexpr int64_t kValueBlock = 64;  // values summed 64 keys at a time: 8 KB of fp16, in L1

template <int R, typename T>
void attend_rows_fixed(const float* q, int64_t q_stride, const T* keys, const T* values,
                       int64_t n, float* scores, float* out, int64_t out_stride,
                       const float* key_scale, const float* value_scale) {
  const int64_t padded = (n + 7) & ~int64_t{7};
  float top[R];
  for (int r = 0; r < R; ++r) top[r] = -INFINITY;
  for (int64_t t = 0; t < n; ++t) {
    const T* row = keys + t * kHeadDim;
    __m256 k[8];
    for (int i = 0; i < 8; ++i) k[i] = load8(row + 8 * i);
    for (int r = 0; r < R; ++r) {
      const float* qr = q + r * q_stride;
      __m256 a = _mm256_mul_ps(_mm256_loadu_ps(qr), k[0]);
      __m256 b = _mm256_mul_ps(_mm256_loadu_ps(qr + 8), k[1]);
      for (int i = 2; i < 8; i += 2) {
        a = _mm256_fmadd_ps(_mm256_loadu_ps(qr + 8 * i), k[i], a);
        b = _mm256_fmadd_ps(_mm256_loadu_ps(qr + 8 * i + 8), k[i + 1], b);
      }
      keep_score(sum8(_mm256_add_ps(a, b)), t, key_scale, scores + r * padded, top[r]);
    }
  }
  float inv_total[R];
  for (int r = 0; r < R; ++r)
    inv_total[r] = score_weights(scores + r * padded, n, padded, top[r], value_scale);
  // Values: per block of keys, 16 dims at a time (2 registers per query), the sums kept in
  // `total` between blocks; each lane still sums over the keys in order.
  alignas(32) float total[R][kHeadDim] = {};
  for (int64_t b0 = 0; b0 < n; b0 += kValueBlock) {
    const int64_t b1 = std::min(n, b0 + kValueBlock);
    for (int64_t c = 0; c < kHeadDim; c += 16) {
      __m256 acc[R][2];
      for (int r = 0; r < R; ++r) {
        acc[r][0] = _mm256_load_ps(&total[r][c]);
        acc[r][1] = _mm256_load_ps(&total[r][c + 8]);
      }
      for (int64_t t = b0; t < b1; ++t) {
        const T* row = values + t * kHeadDim + c;
        const __m256 v0 = load8(row), v1 = load8(row + 8);
        for (int r = 0; r < R; ++r) {
          const __m256 p = _mm256_broadcast_ss(scores + r * padded + t);
          acc[r][0] = _mm256_fmadd_ps(p, v0, acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(p, v1, acc[r][1]);
        }
      }
      for (int r = 0; r < R; ++r) {
        _mm256_store_ps(&total[r][c], acc[r][0]);
        _mm256_store_ps(&total[r][c + 8], acc[r][1]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m256 inv = _mm256_set1_ps(inv_total[r]);
    for (int64_t c = 0; c < kHeadDim; c += 8)
      _mm256_storeu_ps(out + r * out_stride + c, _mm256_mul_ps(_mm256_load_ps(&total[r][c]), inv));
  }
}

// attend_rows_fixed<R> for a run-time R (1 .. kAttendRows).
template <typename T>
void attend_rows(const float* q, int64_t q_stride, int64_t R, const T* keys, const T* values,
                 int64_t n, float* scores, float* out, int64_t out_stride,
                 const float* key_scale = nullptr, const float* value_scale = nullptr) {
  using Fn = void (*)(const float*, int64_t, const T*, const T*, int64_t, float*, float*,
                      int64_t, const float*, const float*);
  static constexpr Fn fixed[kAttendRows] = {attend_rows_fixed<1, T>, attend_rows_fixed<2, T>,
                                            attend_rows_fixed<3, T>, attend_rows_fixed<4, T>};
  fixed[R - 1](q, q_stride, keys, values, n, scores, out, out_stride, key_scale, value_scale);
}

// One query's attention (attend_rows with R = 1); scores needs n (+ 7) floats.
template <typename T>
void attend(const float* q, const T* keys, const T* values, int64_t n, float* scores,
            float* out, const float* key_scale = nullptr, const float* value_scale = nullptr) {
  attend_rows(q, 0, 1, keys, values, n, scores, out, 0, key_scale, value_scale);
}

}  // namespace audiofast
