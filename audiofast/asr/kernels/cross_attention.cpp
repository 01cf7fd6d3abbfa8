// Cross-attention of one query row over a window's fp16 keys and values (AVX2 + F16C).
//
// The decoder reads every encoder frame's K and V on every token: 36 MB in fp32 at 1500
// frames, more than this CPU's L3, so a token's attention is a pass over DRAM. Stored in
// fp16 that pass halves; widening them with a separate op first wrote the fp32 copy back
// out and saved nothing, so here each frame is widened in registers as it is used.
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/extension.h>

namespace {

constexpr int64_t kHeadDim = 64;  // every Whisper size: d_model / heads == 64

inline __m256 load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline float sum8(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_hadd_ps(x, x);
  return _mm_cvtss_f32(_mm_hadd_ps(x, x));
}

// scores[t] = q . k[t], each frame's 64 values contiguous: keys are read front to back.
void head_scores(const float* q, const uint16_t* k, int64_t frames, float* scores) {
  __m256 qv[8];
  for (int i = 0; i < 8; ++i) qv[i] = _mm256_loadu_ps(q + 8 * i);
  for (int64_t t = 0; t < frames; ++t) {
    const uint16_t* row = k + t * kHeadDim;
    __m256 a = _mm256_mul_ps(qv[0], load8(row));
    __m256 b = _mm256_mul_ps(qv[1], load8(row + 8));
    for (int i = 2; i < 8; i += 2) {
      a = _mm256_fmadd_ps(qv[i], load8(row + 8 * i), a);
      b = _mm256_fmadd_ps(qv[i + 1], load8(row + 8 * i + 8), b);
    }
    scores[t] = sum8(_mm256_add_ps(a, b));
  }
}

// out = sum_t p[t] * v[t]: eight 8-wide accumulators hold the 64 outputs.
void head_values(const float* p, const uint16_t* v, int64_t frames, float* out) {
  __m256 acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t t = 0; t < frames; ++t) {
    const __m256 pt = _mm256_set1_ps(p[t]);
    const uint16_t* row = v + t * kHeadDim;
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(pt, load8(row + 8 * i), acc[i]);
  }
  for (int i = 0; i < 8; ++i) _mm256_storeu_ps(out + 8 * i, acc[i]);
}

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
  auto scores = torch::empty({heads, frames}, q.options());
  const auto* k = reinterpret_cast<const uint16_t*>(keys.data_ptr<at::Half>());
  const auto* v = reinterpret_cast<const uint16_t*>(values.data_ptr<at::Half>());
  at::parallel_for(0, heads, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h)
      head_scores(q.data_ptr<float>() + h * kHeadDim, k + h * frames * kHeadDim, frames,
                  scores.data_ptr<float>() + h * frames);
  });
  auto probs = scores.softmax(-1);
  auto out = torch::empty({heads, kHeadDim}, q.options());
  at::parallel_for(0, heads, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h)
      head_values(probs.data_ptr<float>() + h * frames, v + h * frames * kHeadDim, frames,
                  out.data_ptr<float>() + h * kHeadDim);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(audiofast, m) {
  m.def("cross_attention(Tensor q, Tensor keys, Tensor values) -> Tensor", cross_attention);
}
