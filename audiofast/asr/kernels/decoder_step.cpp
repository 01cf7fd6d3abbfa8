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

// Row m of a call: its sequence and its position in it. A sequence's rows are consecutive
// positions (a prompt, a verified draft); with several sequences their rows follow each other.
struct RowPlace {
  int64_t sequence, position;
};

// Causal self-attention of each row over its sequence's cache (keys 0 .. its position).
void self_attention(const float* qkv, const std::vector<RowPlace>& places, int64_t heads,
                    const std::vector<float*>& k_cache, const std::vector<float*>& v_cache,
                    int64_t n_ctx, float* out) {
  const int64_t rows = static_cast<int64_t>(places.size()), d = heads * kHeadDim;
  parallel_for(rows * heads, [&](int64_t t0, int64_t t1) {
    std::vector<float> scores(n_ctx + 8);
    alignas(32) float q[kHeadDim];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t m = t / heads, h = t % heads, s = places[m].sequence;
      const int64_t offset = h * n_ctx * kHeadDim;
      for (int64_t i = 0; i < kHeadDim; ++i) q[i] = qkv[m * 3 * d + h * kHeadDim + i] * 0.125f;
      attend(q, k_cache[s] + offset, v_cache[s] + offset, places[m].position + 1,
             scores.data(), out + m * d + h * kHeadDim);
    }
  });
}

// The model-wide inputs' checks, each failure one line naming the input: the op reads raw
// pointers, so a wrong array must be refused before any is read.
void check_params(const Array* params, int64_t n_params, int64_t layers, int64_t d) {
  check(n_params == kLayers + layers * kLayerSize,
        "decoder_forward: parameters do not match the cache's layer count");
  for (int i : {kEmbed, kPositions})
    check(params[i].is(kFloat32, 2) && params[i].size(1) == d,
          "decoder_forward: embeddings must be contiguous float32 (n, width)");
}

void check_cache(const Array& k_cache, const Array& v_cache) {
  check(k_cache.is(kFloat32, 5) && k_cache.size(4) == kHeadDim && v_cache.same_shape(k_cache) &&
            v_cache.dtype == kFloat32,
        "decoder_forward: k_cache and v_cache must be float32 (layers, sequences, heads, "
        "n_ctx, 64) of one shape");
}

// The ids of the top `k` logits of a row (ties: the lower id), best first. One pass keeping
// the best k so far: eight logits at a time are compared with the k-th best, and only one
// that beats it is inserted (a sort of the whole vocabulary cost 0.5 ms a row).
std::vector<int64_t> top_ids(const float* logits, int64_t n, int64_t k) {
  std::vector<int64_t> best;
  best.reserve(k + 1);
  auto insert = [&](int64_t id) {  // ids arrive in increasing order: a tie goes after
    size_t at = best.size();
    while (at > 0 && logits[id] > logits[best[at - 1]]) --at;
    best.insert(best.begin() + at, id);
    if (static_cast<int64_t>(best.size()) > k) best.pop_back();
  };
  int64_t i = 0;
  for (; i < n && static_cast<int64_t>(best.size()) < k; ++i) insert(i);
  for (; i + 8 <= n; i += 8) {
    const __m256 worst = _mm256_set1_ps(logits[best.back()]);
    if (!_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(logits + i), worst, _CMP_GT_OQ)))
      continue;
    for (int64_t j = i; j < i + 8; ++j)
      if (logits[j] > logits[best.back()]) insert(j);
  }
  for (; i < n; ++i)
    if (logits[i] > logits[best.back()]) insert(i);
  return best;
}

}  // namespace

void decoder_forward_sequences(const int64_t* ids, const std::vector<SequenceCall>& sequences,
                               int64_t layers, int64_t heads, int64_t n_ctx,
                               const Array* params, int64_t n_params, int64_t rescore,
                               float* logits, int64_t logits_size, float* hidden_out) {
  check(!sequences.empty(), "decoder_forward: nothing to decode");
  check(n_params > kLayers, "decoder_forward: parameters do not match the cache's layer count");
  const Array& embed = params[kEmbed];
  const Array& positions = params[kPositions];
  const int64_t d = embed.size(1);
  check(heads * kHeadDim == d && d % 32 == 0, "decoder_forward: model width must be heads x 64");
  check_params(params, n_params, layers, d);
  // Where every row lives, and which rows give logits (each sequence's last `last`).
  std::vector<RowPlace> places;
  std::vector<int64_t> out_rows;
  for (int64_t s = 0; s < static_cast<int64_t>(sequences.size()); ++s) {
    const SequenceCall& seq = sequences[s];
    check(seq.rows > 0, "decoder_forward: every sequence needs at least one token");
    check(seq.start >= 0 && seq.start + seq.rows <= n_ctx,
          "decoder_forward: positions exceed the decoder context");
    for (int64_t l = 0; l < layers; ++l)
      check_cross({&seq.cross_k[l], &seq.cross_v[l],
                   seq.cross_k_scale ? &seq.cross_k_scale[l] : nullptr,
                   seq.cross_v_scale ? &seq.cross_v_scale[l] : nullptr}, heads);
    const int64_t first_out = seq.last > 0 ? std::max<int64_t>(0, seq.rows - seq.last) : 0;
    for (int64_t j = 0; j < seq.rows; ++j) {
      if (j >= first_out) out_rows.push_back(static_cast<int64_t>(places.size()));
      places.push_back({s, seq.start + j});
    }
  }
  const int64_t rows = static_cast<int64_t>(places.size());
  std::vector<float> x(rows * d);  // the residual stream
  float* xp = x.data();
  for (int64_t m = 0; m < rows; ++m) {
    check(ids[m] >= 0 && ids[m] < embed.size(0), "decoder_forward: token id out of the vocabulary");
    const float* e = embed.ptr<float>() + ids[m] * d;
    const float* pos = positions.ptr<float>() + places[m].position * d;
    for (int64_t i = 0; i < d; ++i) xp[m * d + i] = e[i] + pos[i];
  }
  const int64_t ff = linear_at(params, kLayers + kFc1).out;
  std::vector<float> normed(rows * d), qkv(rows * 3 * d), attn(rows * d), y(rows * d),
      hidden(rows * ff);
  std::vector<float*> kc(sequences.size()), vc(sequences.size());
  std::vector<CrossKV> windows(rows);
  for (int64_t l = 0; l < layers; ++l) {
    const size_t base = kLayers + l * kLayerSize;
    const auto qkv_proj = linear_at(params, base + kQkv);
    const auto self_out = linear_at(params, base + kSelfOut);
    const auto cross_q = linear_at(params, base + kCrossQ);
    const auto cross_out = linear_at(params, base + kCrossOut);
    const auto fc1 = linear_at(params, base + kFc1), fc2 = linear_at(params, base + kFc2);
    for (size_t s = 0; s < sequences.size(); ++s) {
      kc[s] = sequences[s].k_cache + l * sequences[s].layer_stride;
      vc[s] = sequences[s].v_cache + l * sequences[s].layer_stride;
    }
    for (int64_t m = 0; m < rows; ++m) {
      const SequenceCall& seq = sequences[places[m].sequence];
      windows[m] = {&seq.cross_k[l], &seq.cross_v[l],
                    seq.cross_k_scale ? &seq.cross_k_scale[l] : nullptr,
                    seq.cross_v_scale ? &seq.cross_v_scale[l] : nullptr};
    }

    layer_norm(xp, params[base + kSelfNorm], params[base + kSelfNorm + 1], rows, d,
               normed.data());
    linear(qkv_proj, normed.data(), rows, qkv.data());
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t slot = (h * n_ctx + places[m].position) * kHeadDim;
        std::copy_n(&qkv[m * 3 * d + d + h * kHeadDim], kHeadDim, kc[places[m].sequence] + slot);
        std::copy_n(&qkv[m * 3 * d + 2 * d + h * kHeadDim], kHeadDim,
                    vc[places[m].sequence] + slot);
      }
    self_attention(qkv.data(), places, heads, kc, vc, n_ctx, attn.data());
    linear(self_out, attn.data(), rows, y.data());
    for (int64_t i = 0; i < rows * d; ++i) xp[i] += y[i];

    layer_norm(xp, params[base + kCrossNorm], params[base + kCrossNorm + 1], rows, d,
               normed.data());
    linear(cross_q, normed.data(), rows, y.data());
    for (int64_t i = 0; i < rows * d; ++i) y[i] *= 0.125f;  // 1 / sqrt(64), exact
    cross_attention_rows(y.data(), rows, heads, windows.data(), attn.data());
    linear(cross_out, attn.data(), rows, y.data());
    for (int64_t i = 0; i < rows * d; ++i) xp[i] += y[i];

    layer_norm(xp, params[base + kFfnNorm], params[base + kFfnNorm + 1], rows, d,
               normed.data());
    linear(fc1, normed.data(), rows, hidden.data());
    gelu(hidden.data(), rows * ff);
    linear(fc2, hidden.data(), rows, y.data());
    for (int64_t i = 0; i < rows * d; ++i) xp[i] += y[i];
  }
  // The logit rows, gathered: one pass of the head over all of them.
  const int64_t n_out = static_cast<int64_t>(out_rows.size());
  for (int64_t j = 0; j < n_out; ++j) std::copy_n(xp + out_rows[j] * d, d, attn.data() + j * d);
  layer_norm(attn.data(), params[kFinalNorm], params[kFinalNorm + 1], n_out, d, normed.data());
  if (hidden_out) std::copy_n(normed.data(), n_out * d, hidden_out);  // block drafter's input
  const auto head = linear_at(params, kHead);
  check(logits_size == n_out * head.out, "decoder_forward: logits buffer of the wrong size");
  linear(head, normed.data(), n_out, logits);
  const Array& exact = params[kExactHead];
  if (rescore > 0 && exact.numel() > 0) {
    check(exact.is(kFloat32, 2) && exact.size(0) == head.out && exact.size(1) == d,
          "decoder_forward: the exact head must be float32 (vocabulary, width)");
    // The int8 head's top candidates, exactly: near-ties among them decide words.
    parallel_for(n_out, [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m) {
        float* row = logits + m * head.out;
        for (int64_t id : top_ids(row, head.out, std::min(rescore, head.out)))
          row[id] = dot(exact.ptr<float>() + id * d, &normed[m * d], d);
      }
    });
  }
}

void decoder_forward(const int64_t* ids, int64_t rows, int64_t start, int64_t last,
                     const Array* params, int64_t n_params, const Array& k_cache,
                     const Array& v_cache, const Array* cross_k, const Array* cross_v,
                     const Array* cross_k_scale, const Array* cross_v_scale, int64_t n_cross,
                     int64_t rescore, float* logits, int64_t logits_size, float* hidden) {
  check(rows > 0, "decoder_forward: tokens must be a non-empty 1-D int64 array");
  check_cache(k_cache, v_cache);
  const int64_t layers = k_cache.size(0), sequences = k_cache.size(1);
  const int64_t heads = k_cache.size(2), n_ctx = k_cache.size(3);
  check(n_cross == layers, "decoder_forward: parameters do not match the cache's layer count");
  check(sequences == 1 || rows == sequences,
        "decoder_forward: with several cached sequences, give one token per sequence");
  check(sequences == 1 || last <= 0,
        "decoder_forward: with several cached sequences, every row gives logits");
  const int64_t per_sequence = heads * n_ctx * kHeadDim;
  std::vector<SequenceCall> calls;
  for (int64_t s = 0; s < sequences; ++s)
    calls.push_back({start, sequences > 1 ? 1 : rows,
                     sequences > 1 ? 0 : last, k_cache.ptr<float>() + s * per_sequence,
                     v_cache.ptr<float>() + s * per_sequence, sequences * per_sequence, cross_k,
                     cross_v, cross_k_scale, cross_v_scale});
  decoder_forward_sequences(ids, calls, layers, heads, n_ctx, params, n_params, rescore, logits,
                            logits_size, hidden);
}

void decoder_forward_batch(const int64_t* ids, int64_t n_seq, const int64_t* starts,
                           const int64_t* rows, const int64_t* lasts, const Array* params,
                           int64_t n_params, const Array* const* k_caches,
                           const Array* const* v_caches, const Array* const* cross_k,
                           const Array* const* cross_v, const Array* const* cross_k_scale,
                           const Array* const* cross_v_scale, int64_t n_cross, int64_t rescore,
                           float* logits, int64_t logits_size, float* hidden) {
  check(n_seq > 0, "decoder_forward_batch: no sequences");
  const Array& first = *k_caches[0];
  std::vector<SequenceCall> calls;
  for (int64_t s = 0; s < n_seq; ++s) {
    const Array &k = *k_caches[s], &v = *v_caches[s];
    check_cache(k, v);
    check(k.size(1) == 1 && k.same_shape(first),
          "decoder_forward_batch: every cache must be (layers, 1, heads, n_ctx, 64), one shape");
    calls.push_back({starts[s], rows[s], lasts[s], k.ptr<float>(), v.ptr<float>(),
                     k.size(2) * k.size(3) * kHeadDim, cross_k[s], cross_v[s],
                     cross_k_scale ? cross_k_scale[s] : nullptr,
                     cross_v_scale ? cross_v_scale[s] : nullptr});
  }
  check(n_cross == first.size(0),
        "decoder_forward_batch: parameters do not match the cache's layer count");
  decoder_forward_sequences(ids, calls, first.size(0), first.size(2), first.size(3), params,
                            n_params, rescore, logits, logits_size, hidden);
}

}  // namespace audiofast
