// Whisper's int8 decoder, all layers of a call in one function (decoder_step.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "array.h"

namespace audiofast {

// One sequence of a call: `rows` tokens at positions start .. start + rows - 1, its own
// self-attention cache and its own window's cross-attention K/V.
struct SequenceCall {
  int64_t start, rows;
  int64_t last;         // logits for its last `last` rows only (0: all of them)
  float* k_cache;       // layer 0 of its cache, (heads, n_ctx, 64) floats ...
  float* v_cache;
  int64_t layer_stride; // ... and the next layer this many floats further
  const Array* cross_k;  // per layer (heads, frames, 64): fp16, or int8 with the scales
  const Array* cross_v;
  const Array* cross_k_scale;  // per layer (heads, frames) float32, or null for fp16
  const Array* cross_v_scale;
};

// Every sequence's tokens (ids: their rows one sequence after the other) through every layer;
// logits (each sequence's logit rows, in order) written to `logits`, with each row's top
// `rescore` recomputed from the fp32 head, and (unless null) the same rows' final-norm hidden
// states, (rows, width), to `hidden`. params: as fused_decoder.FusedDecoder lists them;
// caches are written at the fed positions. Each row is computed as if fed alone, so a
// sequence's logits do not depend on the other sequences of the call.
void decoder_forward_sequences(const int64_t* ids, const std::vector<SequenceCall>& sequences,
                               int64_t layers, int64_t heads, int64_t n_ctx,
                               const Array* params, int64_t n_params, int64_t rescore,
                               float* logits, int64_t logits_size, float* hidden = nullptr);

// One call's sequences from one cache array. tokens ids (rows,) at positions start .. start +
// rows - 1 (or, with a cache of several sequences, one token per sequence at position start:
// best_of samples); logits (the last `last` rows only when last > 0). k_cache and v_cache
// (layers, sequences, heads, n_ctx, 64); cross_k and cross_v per layer (heads, frames, 64)
// fp16, or int8 with per-frame scales (else null), shared by every sequence.
void decoder_forward(const int64_t* ids, int64_t rows, int64_t start, int64_t last,
                     const Array* params, int64_t n_params, const Array& k_cache,
                     const Array& v_cache, const Array* cross_k, const Array* cross_v,
                     const Array* cross_k_scale, const Array* cross_v_scale, int64_t n_cross,
                     int64_t rescore, float* logits, int64_t logits_size,
                     float* hidden = nullptr);

// Several sequences, each with its own cache (layers, 1, heads, n_ctx, 64) and window: row
// counts, starts and `last`s per sequence; per sequence a pointer to its `n_cross` (= layers)
// cross arrays, and to their scales (the pointer arrays null for fp16 K/V).
void decoder_forward_batch(const int64_t* ids, int64_t n_seq, const int64_t* starts,
                           const int64_t* rows, const int64_t* lasts, const Array* params,
                           int64_t n_params, const Array* const* k_caches,
                           const Array* const* v_caches, const Array* const* cross_k,
                           const Array* const* cross_v, const Array* const* cross_k_scale,
                           const Array* const* cross_v_scale, int64_t n_cross, int64_t rescore,
                           float* logits, int64_t logits_size, float* hidden = nullptr);

}  // namespace audiofast
