// Cross-attention over a window's fp16 or int8 keys and values (AVX2 + F16C; AVX-512 on CPUs
// with the decoder's VNNI kernels, the same outputs).
//
// The decoder reads every encoder frame's K and V on every token: 36 MB in fp32 at 1500
// frames, more than the 2-core EPYC's L3, so a token's attention was a pass over DRAM. Stored in
// fp16 that pass halves; widening them with a separate op first wrote the fp32 copy back
// out and saved nothing, so here each frame is widened in registers as it is used. int8 rows
// (one scale per frame and head) halve the pass again.
#include "cross_attention.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "avx2.h"
#include "pool.h"
#include "quant_linear.h"

namespace audiofast {

void check_cross(const CrossKV& window, int64_t heads) {
  const Array& keys = *window.keys;
  const bool int8 = keys.dtype == kInt8;
  check((keys.is(kFloat16, 3) || keys.is(kInt8, 3)) && keys.size(0) == heads &&
            keys.size(2) == kHeadDim && window.values->dtype == keys.dtype &&
            keys.same_shape(*window.values),
        "cross-attention keys and values must be contiguous (heads, frames, 64) float16 or "
        "int8, one shape");
  check(int8 == (window.key_scale != nullptr && window.value_scale != nullptr),
        "cross-attention: int8 keys and values need their scales, float16 ones none");
  if (int8)
    for (const Array* s : {window.key_scale, window.value_scale})
      check(s->is(kFloat32, 2) && s->size(0) == heads && s->size(1) == keys.size(1),
            "cross-attention scales must be float32 (heads, frames)");
}

namespace {

#define AVX512 __attribute__((target("avx512f")))

AVX512 inline __m512 load16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

AVX512 inline __m512 load16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
      reinterpret_cast<const __m128i*>(p))));
}

// attend_rows_fixed (avx2.h) in 16-float registers, bit-identical: a register holds two of the
// AVX2 path's 8-float chunks side by side, so its lower half sums what that path's `a` does
// and its upper half `b`, each lane in the same order; the values' lanes likewise. Twice the
// floats per instruction, and 32 registers keep every query's sums in registers.
template <int R, typename T>
AVX512 void attend_rows_512(const float* q, int64_t q_stride, const T* keys, const T* values,
                            int64_t n, float* scores, float* out, int64_t out_stride,
                            const float* key_scale, const float* value_scale) {
  const int64_t padded = (n + 7) & ~int64_t{7};
  __m512 qv[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) qv[r][j] = _mm512_loadu_ps(q + r * q_stride + 16 * j);
  float top[R];
  for (int r = 0; r < R; ++r) top[r] = -INFINITY;
  for (int64_t t = 0; t < n; ++t) {
    const T* row = keys + t * kHeadDim;
    __m512 k[4];
    for (int j = 0; j < 4; ++j) k[j] = load16(row + 16 * j);
    for (int r = 0; r < R; ++r) {
      __m512 ab = _mm512_mul_ps(qv[r][0], k[0]);
      for (int j = 1; j < 4; ++j) ab = _mm512_fmadd_ps(qv[r][j], k[j], ab);
      const __m256 upper = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(ab), 1));
      keep_score(sum8(_mm256_add_ps(_mm512_castps512_ps256(ab), upper)), t, key_scale,
                 scores + r * padded, top[r]);
    }
  }
  float inv_total[R];
  for (int r = 0; r < R; ++r)
    inv_total[r] = score_weights(scores + r * padded, n, padded, top[r], value_scale);
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; ++t) {
    const T* row = values + t * kHeadDim;
    __m512 v[4];
    for (int j = 0; j < 4; ++j) v[j] = load16(row + 16 * j);
    for (int r = 0; r < R; ++r) {
      const __m512 p = _mm512_set1_ps(scores[r * padded + t]);
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_fmadd_ps(p, v[j], acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m512 inv = _mm512_set1_ps(inv_total[r]);
    for (int j = 0; j < 4; ++j)
      _mm512_storeu_ps(out + r * out_stride + 16 * j, _mm512_mul_ps(acc[r][j], inv));
  }
}

// R (1 .. kAttendRows) queries over one head's window, on the AVX-512 path where the CPU has
// the decoder's VNNI kernels (use_vnni), else on avx2.h's: the same outputs either way.
template <typename T>
void attend_window(const float* q, int64_t stride, int64_t R, const T* keys, const T* values,
                   int64_t n, float* scores, float* out, const float* key_scale,
                   const float* value_scale) {
  if (!use_vnni())
    return attend_rows(q, stride, R, keys, values, n, scores, out, stride, key_scale,
                       value_scale);
  using Fn = void (*)(const float*, int64_t, const T*, const T*, int64_t, float*, float*,
                      int64_t, const float*, const float*);
  static constexpr Fn fixed[kAttendRows] = {attend_rows_512<1, T>, attend_rows_512<2, T>,
                                            attend_rows_512<3, T>, attend_rows_512<4, T>};
  fixed[R - 1](q, stride, keys, values, n, scores, out, stride, key_scale, value_scale);
}

#undef AVX512

bool same_window(const CrossKV& a, const CrossKV& b) {
  return a.keys->data == b.keys->data && a.values->data == b.values->data &&
         a.keys->same_shape(*b.keys) &&
         (a.key_scale == nullptr ? nullptr : a.key_scale->data) ==
             (b.key_scale == nullptr ? nullptr : b.key_scale->data);
}

}  // namespace

void cross_attention_rows(const float* q, int64_t rows, int64_t heads, const CrossKV* windows,
                          float* out) {
  const int64_t d = heads * kHeadDim;
  // Runs of up to kAttendRows consecutive rows over one window (a verified draft's rows): each
  // run reads its window's keys and values once per head instead of once per row.
  std::vector<std::pair<int64_t, int64_t>> runs;  // (first row, rows)
  int64_t most = 0;
  for (int64_t m = 0; m < rows; ++m) {
    most = std::max(most, windows[m].keys->size(1));
    if (!runs.empty() && runs.back().second < kAttendRows &&
        same_window(windows[runs.back().first], windows[m]))
      ++runs.back().second;
    else
      runs.push_back({m, 1});
  }
  const int64_t n_runs = static_cast<int64_t>(runs.size());
  parallel_for(n_runs * heads, [&](int64_t t0, int64_t t1) {
    std::vector<float> scores(kAttendRows * (most + 8));
    for (int64_t t = t0; t < t1; ++t) {
      const auto [m, R] = runs[t / heads];
      const int64_t h = t % heads;
      const CrossKV& w = windows[m];
      const int64_t frames = w.keys->size(1), at = h * frames * kHeadDim;
      float* o = out + m * d + h * kHeadDim;
      const float* qh = q + m * d + h * kHeadDim;
      if (w.keys->dtype == kInt8)
        attend_window(qh, d, R, w.keys->ptr<const int8_t>() + at,
                      w.values->ptr<const int8_t>() + at, frames, scores.data(), o,
                      w.key_scale->ptr<const float>() + h * frames,
                      w.value_scale->ptr<const float>() + h * frames);
      else
        attend_window(qh, d, R, w.keys->ptr<const uint16_t>() + at,
                      w.values->ptr<const uint16_t>() + at, frames, scores.data(), o, nullptr,
                      nullptr);
    }
  });
}

void split_heads_f16(const float* kv, int64_t frames, int64_t heads, uint16_t* keys,
                     uint16_t* values) {
  const int64_t d = heads * kHeadDim;
  parallel_for(2 * heads, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t half = t / heads, h = t % heads;  // half 0: keys, 1: values
      uint16_t* out = (half ? values : keys) + h * frames * kHeadDim;
      for (int64_t f = 0; f < frames; ++f) {
        const float* row = kv + f * 2 * d + half * d + h * kHeadDim;
        for (int64_t i = 0; i < kHeadDim; i += 8)
          _mm_storeu_si128(reinterpret_cast<__m128i*>(out + f * kHeadDim + i),
                           _mm256_cvtps_ph(_mm256_loadu_ps(row + i), _MM_FROUND_TO_NEAREST_INT));
      }
    }
  });
}

void split_heads_i8(const float* kv, int64_t frames, int64_t heads, int8_t* keys,
                    int8_t* values, float* key_scale, float* value_scale) {
  const int64_t d = heads * kHeadDim;
  parallel_for(2 * heads, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t half = t / heads, h = t % heads;  // half 0: keys, 1: values
      int8_t* out = (half ? values : keys) + h * frames * kHeadDim;
      float* scales = (half ? value_scale : key_scale) + h * frames;
      for (int64_t f = 0; f < frames; ++f) {
        const float* row = kv + f * 2 * d + half * d + h * kHeadDim;
        __m256 top = _mm256_setzero_ps();
        const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        for (int64_t i = 0; i < kHeadDim; i += 8)
          top = _mm256_max_ps(top, _mm256_and_ps(_mm256_loadu_ps(row + i), magnitude));
        float lanes[8];
        _mm256_storeu_ps(lanes, top);
        float scale = *std::max_element(lanes, lanes + 8) / 127.0f;
        if (scale == 0.0f) scale = 1.0f;
        scales[f] = scale;
        const __m256 divisor = _mm256_set1_ps(scale);
        for (int64_t i = 0; i < kHeadDim; i += 8) {  // x / scale rounded to nearest even
          const __m256i q = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(row + i), divisor));
          const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(q),
                                            _mm256_extracti128_si256(q, 1));
          _mm_storel_epi64(reinterpret_cast<__m128i*>(out + f * kHeadDim + i),
                           _mm_packs_epi16(w, w));
        }
      }
    }
  });
}

}  // namespace audiofast
