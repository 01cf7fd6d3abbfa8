// The SA3 DiT's self-attention heads from its QKV rows (qk_norm_rope.cpp).
#pragma once

#include <cstdint>

namespace audiofast {

// dst = rope(rms(src) * gain) for one head of one token (d floats; scratch holds d floats).
void norm_rotate(const float* src, const float* gain, int64_t d, int64_t rot, float eps,
                 const float* cos, const float* sin, float* scratch, float* dst);

// qkv (batch x tokens, 3 x heads x d) -> q, k, v (batch, heads, tokens, d): q and k RMS-normed
// per head (gains q_gain, k_gain of d) then rotated on their first `rot` channels by the angles
// whose cos and sin are (tokens, rot); v copied.
void qk_norm_rope(const float* qkv, int64_t batch, int64_t tokens, int64_t heads, int64_t d,
                  int64_t rot, const float* q_gain, const float* k_gain, float eps,
                  const float* cos, const float* sin, float* q, float* k, float* v);

}  // namespace audiofast
