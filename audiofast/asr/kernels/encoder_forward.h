// Whisper's encoder layers in one call (encoder_forward.cpp).
#pragma once
#include "array.h"

#include <cstdint>

namespace audiofast {

// x (batch x frames, heads x 64) float32: the convolutions' output plus positions, replaced
// by the encoder's output (after the final norm). params: the final norm (weight, bias), then
// per layer the attention norm (2), Q/K/V linear (4: queries, keys, values stacked), output
// linear (4), feed-forward norm (2), fc1 (4), fc2 (4). Each window attends only to itself.
void encoder_forward(float* x, int64_t batch, int64_t frames, int64_t heads,
                     const Array* params, int64_t n_params);

// Whisper's exact GELU in place over n floats (a multiple of 8), slices across threads.
void parallel_gelu(float* x, int64_t n);

}  // namespace audiofast
