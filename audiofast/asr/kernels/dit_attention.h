// The SA3 DiT's self-attention in 8 bits (dit_attention.cpp).
#pragma once

#include <cstdint>

namespace audiofast {

// qkv (batch x tokens, 3 x heads x d) -> out (batch x tokens, heads x d): per head, q and k
// RMS-normed (gains q_gain, k_gain of d) and rotated on their first `rot` channels (cos, sin:
// tokens x rot), v times value_mask (batch x tokens; null: none), then attention with 8-bit
// queries, keys, softmax weights and values (the arithmetic is in dit_attention.cpp's header).
void dit_attention_int8(const float* qkv, int64_t batch, int64_t tokens, int64_t heads,
                        int64_t d, int64_t rot, const float* q_gain, const float* k_gain,
                        float eps, const float* cos, const float* sin, const float* value_mask,
                        float* out);

// Whether heads of width d take the VNNI path (the CPU has it and d is a multiple of 16).
bool dit_attention_uses_vnni(int64_t d);

}  // namespace audiofast
