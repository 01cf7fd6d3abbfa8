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

// Cross-attention in 8 bits: q rows (batch x tokens, heads x d) over kv rows (batch x context,
// 2 x heads x d) -> out (batch x tokens, heads x d); q and k RMS-normed per head, no positions,
// no mask (SA3 does not mask cross-attention).
void dit_cross_attention_int8(const float* q, const float* kv, int64_t batch, int64_t tokens,
                              int64_t context, int64_t heads, int64_t d, const float* q_gain,
                              const float* k_gain, float eps, float* out);

// Whether heads of width d take the VNNI path (the CPU has it and d is a multiple of 16).
bool dit_attention_uses_vnni(int64_t d);

}  // namespace audiofast
