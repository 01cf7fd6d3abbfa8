// Whisper's int8 decoder, all layers of a call in one function (decoder_step.cpp).
#pragma once
#include <cstdint>

#include "array.h"

namespace audiofast {

// tokens ids (rows,) at positions start .. start + rows - 1 through every layer (or, with a
// cache of several sequences, one token per sequence at position start); logits (the last
// `last` rows only when last > 0) written to `logits`, with each row's top `rescore`
// recomputed from the fp32 head. params: as fused_decoder.FusedDecoder lists them; k_cache and
// v_cache (layers, sequences, heads, n_ctx, 64) are written at the fed positions; cross_k and
// cross_v per layer (heads, frames, 64) fp16, or int8 with per-frame scales (else null).
void decoder_forward(const int64_t* ids, int64_t rows, int64_t start, int64_t last,
                     const Array* params, int64_t n_params, const Array& k_cache,
                     const Array& v_cache, const Array* cross_k, const Array* cross_v,
                     const Array* cross_k_scale, const Array* cross_v_scale, int64_t n_cross,
                     int64_t rescore, float* logits, int64_t logits_size);

}  // namespace audiofast
