// Cross-attention of one query row over a window's fp16 keys and values (AVX2 + F16C).
//
// The decoder reads every encoder frame's K and V on every token: 36 MB in fp32 at 1500
// frames, more than this CPU's L3, so a token's attention is a pass over DRAM. Stored in
// fp16 that pass halves; widening them with a separate op first wrote the fp32 copy back
// out and saved nothing, so here each frame is widened in registers as it is used.
#include "cross_attention.h"

#include "avx2.h"
#include "pool.h"

namespace audiofast {

void cross_attention_rows(const float* q, int64_t rows, int64_t heads, const Array& keys,
                          const Array& values, float* out) {
  check(keys.is(kFloat16, 3) && keys.size(0) == heads && keys.size(2) == kHeadDim &&
            values.dtype == kFloat16 && keys.same_shape(values),
        "keys and values must be contiguous (heads, frames, 64) float16");
  const int64_t frames = keys.size(1), d = heads * kHeadDim;
  const auto* k = keys.ptr<const uint16_t>();
  const auto* v = values.ptr<const uint16_t>();
  parallel_for(rows * heads, [&](int64_t t0, int64_t t1) {
    std::vector<float> scores(frames + 8);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t m = t / heads, h = t % heads;
      attend(q + m * d + h * kHeadDim, k + h * frames * kHeadDim, v + h * frames * kHeadDim,
             frames, scores.data(), out + m * d + h * kHeadDim);
    }
  });
}

}  // namespace audiofast
