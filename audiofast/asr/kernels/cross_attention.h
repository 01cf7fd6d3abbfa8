// Cross-attention over a window's fp16 or int8 keys and values (cross_attention.cpp).
#pragma once
#include "array.h"

#include <cstdint>

namespace audiofast {

// out (rows, heads x 64) = each row's attention; q (rows, heads x 64) fp32, already scaled;
// keys, values (heads, frames, 64) fp16, or int8 with key_scale / value_scale (heads, frames)
// float32 (one per frame and head; null for fp16), checked. Rows and heads split across
// threads, each computed alone.
void cross_attention_rows(const float* q, int64_t rows, int64_t heads, const Array& keys,
                          const Array& values, const Array* key_scale,
                          const Array* value_scale, float* out);

// The same checks alone (decoder_forward refuses bad inputs before reading any).
void check_cross(const Array& keys, const Array& values, const Array* key_scale,
                 const Array* value_scale, int64_t heads);

}  // namespace audiofast
