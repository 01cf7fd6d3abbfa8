// Cross-attention of one query row over a window's fp16 keys and values (AVX2 + F16C).
//
// The decoder reads every encoder frame's K and V on every token: 36 MB in fp32 at 1500
// frames, more than this CPU's L3, so a token's attention is a pass over DRAM. Stored in
// fp16 that pass halves; widening them with a separate op first wrote the fp32 copy back
// out and saved nothing, so here each frame is widened in registers as it is used.
#include <torch/extension.h>

#include "avx2.h"
#include "pool.h"

namespace audiofast {

// q (heads, 64) fp32, already scaled; keys, values (heads, frames, 64) fp16 -> (heads, 64).
torch::Tensor cross_attention(torch::Tensor q, torch::Tensor keys, torch::Tensor values) {
  TORCH_CHECK(q.dim() == 2 && q.size(1) == kHeadDim && q.scalar_type() == torch::kFloat,
              "q must be (heads, 64) float32");
  TORCH_CHECK(keys.scalar_type() == torch::kHalf && values.scalar_type() == torch::kHalf &&
                  keys.sizes() == values.sizes() && keys.size(0) == q.size(0) &&
                  keys.size(2) == kHeadDim && keys.is_contiguous() && values.is_contiguous(),
              "keys and values must be contiguous (heads, frames, 64) float16");
  q = q.contiguous();
  const int64_t heads = keys.size(0), frames = keys.size(1);
  auto out = torch::empty({heads, kHeadDim}, q.options());
  const auto* k = reinterpret_cast<const uint16_t*>(keys.data_ptr<at::Half>());
  const auto* v = reinterpret_cast<const uint16_t*>(values.data_ptr<at::Half>());
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  pool().run(heads, [&](int64_t h0, int64_t h1) {
    std::vector<float> scores(frames + 8);
    for (int64_t h = h0; h < h1; ++h)
      attend(qp + h * kHeadDim, k + h * frames * kHeadDim, v + h * frames * kHeadDim, frames,
             scores.data(), op + h * kHeadDim);
  });
  return out;
}

}  // namespace audiofast

TORCH_LIBRARY(audiofast, m) {
  m.def("cross_attention(Tensor q, Tensor keys, Tensor values) -> Tensor",
        audiofast::cross_attention);
}
