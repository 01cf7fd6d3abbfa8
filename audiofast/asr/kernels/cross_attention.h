// Cross-attention over a window's fp16 keys and values (cross_attention.cpp).
#pragma once
#include "array.h"

#include <cstdint>

namespace audiofast {

// out (rows, heads x 64) = each row's attention; q (rows, heads x 64) fp32, already scaled;
// keys, values (heads, frames, 64) fp16, checked. Rows and heads split across threads, each
// computed alone.
void cross_attention_rows(const float* q, int64_t rows, int64_t heads, const Array& keys,
                          const Array& values, float* out);

}  // namespace audiofast
