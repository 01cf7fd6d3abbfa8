// Cross-attention over a window's fp16 or int8 keys and values (AVX2 + F16C).
//
// The decoder reads every encoder frame's K and V on every token: 36 MB in fp32 at 1500
// frames, more than this CPU's L3, so a token's attention is a pass over DRAM. Stored in
// fp16 that pass halves; widening them with a separate op first wrote the fp32 copy back
// out and saved nothing, so here each frame is widened in registers as it is used. int8 rows
// (one scale per frame and head) halve the pass again.
#include "cross_attention.h"

#include <algorithm>
#include <vector>

#include "avx2.h"
#include "pool.h"

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

void cross_attention_rows(const float* q, int64_t rows, int64_t heads, const CrossKV* windows,
                          float* out) {
  const int64_t d = heads * kHeadDim;
  int64_t most = 0;
  for (int64_t m = 0; m < rows; ++m) most = std::max(most, windows[m].keys->size(1));
  parallel_for(rows * heads, [&](int64_t t0, int64_t t1) {
    std::vector<float> scores(most + 8);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t m = t / heads, h = t % heads;
      const CrossKV& w = windows[m];
      const int64_t frames = w.keys->size(1), at = h * frames * kHeadDim;
      float* o = out + m * d + h * kHeadDim;
      const float* qh = q + m * d + h * kHeadDim;
      if (w.keys->dtype == kInt8)
        attend(qh, w.keys->ptr<const int8_t>() + at, w.values->ptr<const int8_t>() + at,
               frames, scores.data(), o, w.key_scale->ptr<const float>() + h * frames,
               w.value_scale->ptr<const float>() + h * frames);
      else
        attend(qh, w.keys->ptr<const uint16_t>() + at, w.values->ptr<const uint16_t>() + at,
               frames, scores.data(), o);
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

}  // namespace audiofast
