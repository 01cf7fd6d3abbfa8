// Cross-attention over a window's fp16 or int8 keys and values (cross_attention.cpp).
#pragma once
#include "array.h"

#include <cstdint>

namespace audiofast {

// One window's keys and values for one layer: (heads, frames, 64) float16, or int8 with
// key_scale / value_scale (heads, frames) float32 (one per frame and head; null for fp16).
struct CrossKV {
  const Array* keys;
  const Array* values;
  const Array* key_scale;
  const Array* value_scale;
};

// out (rows, heads x 64) = each row's attention over its own window (`windows[m]`, checked
// before the call); q (rows, heads x 64) fp32, already scaled. Rows and heads split across
// threads, each computed alone.
void cross_attention_rows(const float* q, int64_t rows, int64_t heads, const CrossKV* windows,
                          float* out);

// A window's checks (decoder_forward refuses bad inputs before reading any).
void check_cross(const CrossKV& window, int64_t heads);

// A window's projected keys and values, kv (frames, 2 x heads x 64) float32 (keys, then
// values), into (heads, frames, 64) fp16 each, rounded to nearest even (as numpy's float16).
void split_heads_f16(const float* kv, int64_t frames, int64_t heads, uint16_t* keys,
                     uint16_t* values);

// The same in int8 for ``-kv8``: each (head, frame)'s 64 values over one symmetric scale,
// max |x| / 127 (1 where all are zero), x / scale rounded to nearest even; as
// FusedDecoder.project_audio computed it in numpy.
void split_heads_i8(const float* kv, int64_t frames, int64_t heads, int8_t* keys,
                    int8_t* values, float* key_scale, float* value_scale);

}  // namespace audiofast
