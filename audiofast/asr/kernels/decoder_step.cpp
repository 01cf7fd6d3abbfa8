// Whisper's int8 decoder, all layers of a call in one C++ op.
//
// The TorchScript step ran ~300 small ATen ops per token around fbgemm's int8 linears; a token
// reads ~66 MB (int8 weights, fp16 cross-attention K/V), ~1.5 ms at this machine's ~45 GB/s,
// and took 1.8 ms there (3 ms once OpenMP stopped spinning) vs 1.3 ms here: every int8 linear
// is one pass over its packed weights (int8_linear.cpp), the rest plain loops.
//
// Every row is computed alone: its activations are quantized with its own range, the int8
// products are summed exactly in int32, attention runs per row. So a row's logits do not
// depend on how many rows share the call - a k-token draft verifies exactly as k single steps,
// which is what makes speculative decoding lossless here.
#include "decoder_step.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "avx2.h"
#include "cross_attention.h"
#include "quant_linear.h"
#include "pool.h"

namespace audiofast {

namespace {

// decoder_forward's params, as fused_decoder.FusedDecoder lists them: 9 model-wide tensors,
// then per layer three norms (weight, bias) and six linears (kArraysPerLinear each).
enum Param : int { kEmbed = 0, kPositions = 1, kFinalNorm = 2, kHead = 4, kExactHead = 8,
                   kLayers = 9 };
enum LayerParam : int { kSelfNorm = 0, kQkv = 2, kSelfOut = 6, kCrossNorm = 10, kCrossQ = 12,
                        kCrossOut = 16, kFfnNorm = 20, kFc1 = 22, kFc2 = 26, kLayerSize = 30 };
static_assert(kLayerSize == 3 * 2 + 6 * kArraysPerLinear);

void layer_norm(const float* x, const Array& weight, const Array& bias, int64_t rows, int64_t d,
                float* out) {
  check(weight.is(kFloat32, 1) && bias.is(kFloat32, 1) && weight.size(0) == d &&
            bias.size(0) == d,
        "decoder_forward: layer norms must be float32 (width,)");
  const float* w = weight.ptr<float>();
  const float* b = bias.ptr<float>();
  for (int64_t m = 0; m < rows; ++m) {
    const float* r = x + m * d;
    float* o = out + m * d;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < d; ++i) mean += r[i];
    mean /= d;
    for (int64_t i = 0; i < d; ++i) var += (r[i] - mean) * (r[i] - mean);
    const float inv = static_cast<float>(1.0 / std::sqrt(var / d + 1e-5));
    for (int64_t i = 0; i < d; ++i) o[i] = static_cast<float>(r[i] - mean) * inv * w[i] + b[i];
  }
}

// Where a row of a call lives: one sequence at consecutive positions (a prompt, a verified
// draft), or - with several cached sequences - row m is sequence m, all at one position
// (best_of samples decoded side by side).
struct Rows {
  int64_t start, sequences;
  int64_t sequence(int64_t m) const { return sequences > 1 ? m : 0; }
  int64_t position(int64_t m) const { return sequences > 1 ? start : start + m; }
};

// Causal self-attention of each row over its sequence's cache (keys 0 .. its position).
void self_attention(const float* qkv, int64_t rows, const Rows& at, int64_t heads,
                    const float* k_cache, const float* v_cache, int64_t n_ctx, float* out) {
  const int64_t d = heads * kHeadDim, per_sequence = heads * n_ctx * kHeadDim;
  parallel_for(rows * heads, [&](int64_t t0, int64_t t1) {
    std::vector<float> scores(n_ctx + 8);
    alignas(32) float q[kHeadDim];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t m = t / heads, h = t % heads;
      const int64_t offset = at.sequence(m) * per_sequence + h * n_ctx * kHeadDim;
      for (int64_t i = 0; i < kHeadDim; ++i) q[i] = qkv[m * 3 * d + h * kHeadDim + i] * 0.125f;
      attend(q, k_cache + offset, v_cache + offset, at.position(m) + 1, scores.data(),
             out + m * d + h * kHeadDim);
    }
  });
}


// Every input's dtype and shape, each failure one line naming the input: the op reads raw
// pointers, so a wrong array must be refused before any is read.
void check_inputs(const Array* params, const Array& k_cache, const Array& v_cache,
                  const Array* cross_k, const Array* cross_v, const Array* cross_k_scale,
                  const Array* cross_v_scale, int64_t layers, int64_t d) {
  check(k_cache.is(kFloat32, 5) && k_cache.size(4) == kHeadDim && v_cache.same_shape(k_cache) &&
            v_cache.dtype == kFloat32,
        "decoder_forward: k_cache and v_cache must be float32 (layers, sequences, heads, "
        "n_ctx, 64) of one shape");
  for (int i : {kEmbed, kPositions})
    check(params[i].is(kFloat32, 2) && params[i].size(1) == d,
          "decoder_forward: embeddings must be contiguous float32 (n, width)");
  for (int64_t l = 0; l < layers; ++l)
    check_cross(cross_k[l], cross_v[l], cross_k_scale ? &cross_k_scale[l] : nullptr,
                cross_v_scale ? &cross_v_scale[l] : nullptr, k_cache.size(2));
}

// The ids of the top `k` logits of a row (ties: the lower id), in no particular order.
std::vector<int64_t> top_ids(const float* logits, int64_t n, int64_t k) {
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = i;
  std::nth_element(ids.begin(), ids.begin() + (k - 1), ids.end(), [&](int64_t a, int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  ids.resize(k);
  return ids;
}

}  // namespace

void decoder_forward(const int64_t* ids, int64_t rows, int64_t start, int64_t last,
                     const Array* params, int64_t n_params, const Array& k_cache,
                     const Array& v_cache, const Array* cross_k, const Array* cross_v,
                     const Array* cross_k_scale, const Array* cross_v_scale, int64_t n_cross,
                     int64_t rescore, float* logits, int64_t logits_size) {
  check(rows > 0, "decoder_forward: tokens must be a non-empty 1-D int64 array");
  check(n_params > kLayers && k_cache.ndim == 5,
        "decoder_forward: parameters do not match the cache's layer count");
  const Array& embed = params[kEmbed];
  const Array& positions = params[kPositions];
  const int64_t d = embed.size(1), layers = k_cache.size(0);
  const int64_t sequences = k_cache.size(1), heads = k_cache.size(2), n_ctx = k_cache.size(3);
  const Rows at{start, sequences};
  check(sequences == 1 || rows == sequences,
        "decoder_forward: with several cached sequences, give one token per sequence");
  check(start >= 0 && at.position(rows - 1) < n_ctx,
        "decoder_forward: positions exceed the decoder context");
  check(heads * kHeadDim == d && d % 32 == 0, "decoder_forward: model width must be heads x 64");
  check(n_params == kLayers + layers * kLayerSize && n_cross == layers,
        "decoder_forward: parameters do not match the cache's layer count");
  check_inputs(params, k_cache, v_cache, cross_k, cross_v, cross_k_scale, cross_v_scale, layers,
               d);
  std::vector<float> x(rows * d);  // the residual stream
  float* xp = x.data();
  for (int64_t m = 0; m < rows; ++m) {
    check(ids[m] >= 0 && ids[m] < embed.size(0), "decoder_forward: token id out of the vocabulary");
    const float* e = embed.ptr<float>() + ids[m] * d;
    const float* pos = positions.ptr<float>() + at.position(m) * d;
    for (int64_t i = 0; i < d; ++i) xp[m * d + i] = e[i] + pos[i];
  }
  const int64_t ff = linear_at(params, kLayers + kFc1).out;
  std::vector<float> normed(rows * d), qkv(rows * 3 * d), attn(rows * d), y(rows * d),
      hidden(rows * ff);
  for (int64_t l = 0; l < layers; ++l) {
    const size_t base = kLayers + l * kLayerSize;
    const auto qkv_proj = linear_at(params, base + kQkv);
    const auto self_out = linear_at(params, base + kSelfOut);
    const auto cross_q = linear_at(params, base + kCrossQ);
    const auto cross_out = linear_at(params, base + kCrossOut);
    const auto fc1 = linear_at(params, base + kFc1), fc2 = linear_at(params, base + kFc2);
    const int64_t per_sequence = heads * n_ctx * kHeadDim;
    float* kc = k_cache.ptr<float>() + l * sequences * per_sequence;
    float* vc = v_cache.ptr<float>() + l * sequences * per_sequence;

    layer_norm(xp, params[base + kSelfNorm], params[base + kSelfNorm + 1], rows, d,
               normed.data());
    linear(qkv_proj, normed.data(), rows, qkv.data());
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t slot =
            at.sequence(m) * per_sequence + (h * n_ctx + at.position(m)) * kHeadDim;
        std::copy_n(&qkv[m * 3 * d + d + h * kHeadDim], kHeadDim, kc + slot);
        std::copy_n(&qkv[m * 3 * d + 2 * d + h * kHeadDim], kHeadDim, vc + slot);
      }
    self_attention(qkv.data(), rows, at, heads, kc, vc, n_ctx, attn.data());
    linear(self_out, attn.data(), rows, y.data());
    for (int64_t i = 0; i < rows * d; ++i) xp[i] += y[i];

    layer_norm(xp, params[base + kCrossNorm], params[base + kCrossNorm + 1], rows, d,
               normed.data());
    linear(cross_q, normed.data(), rows, y.data());
    for (int64_t i = 0; i < rows * d; ++i) y[i] *= 0.125f;  // 1 / sqrt(64), exact
    cross_attention_rows(y.data(), rows, heads, cross_k[l], cross_v[l],
                         cross_k_scale ? &cross_k_scale[l] : nullptr,
                         cross_v_scale ? &cross_v_scale[l] : nullptr, attn.data());
    linear(cross_out, attn.data(), rows, y.data());
    for (int64_t i = 0; i < rows * d; ++i) xp[i] += y[i];

    layer_norm(xp, params[base + kFfnNorm], params[base + kFfnNorm + 1], rows, d,
               normed.data());
    linear(fc1, normed.data(), rows, hidden.data());
    gelu(hidden.data(), rows * ff);
    linear(fc2, hidden.data(), rows, y.data());
    for (int64_t i = 0; i < rows * d; ++i) xp[i] += y[i];
  }
  const int64_t out_rows = last > 0 ? std::min(last, rows) : rows;
  const float* tail = xp + (rows - out_rows) * d;
  layer_norm(tail, params[kFinalNorm], params[kFinalNorm + 1], out_rows, d, normed.data());
  const auto head = linear_at(params, kHead);
  check(logits_size == out_rows * head.out, "decoder_forward: logits buffer of the wrong size");
  linear(head, normed.data(), out_rows, logits);
  const Array& exact = params[kExactHead];
  if (rescore > 0 && exact.numel() > 0) {
    check(exact.is(kFloat32, 2) && exact.size(0) == head.out && exact.size(1) == d,
          "decoder_forward: the exact head must be float32 (vocabulary, width)");
    // The int8 head's top candidates, exactly: near-ties among them decide words.
    for (int64_t m = 0; m < out_rows; ++m) {
      float* row = logits + m * head.out;
      for (int64_t id : top_ids(row, head.out, std::min(rescore, head.out)))
        row[id] = dot(exact.ptr<float>() + id * d, &normed[m * d], d);
    }
  }
}

}  // namespace audiofast
