// The library's C interface, called from Python through ctypes (kernels/__init__.py).
//
// Every function returns a status (0: done; 1: bad input, raised as ValueError; 2: out of
// memory, MemoryError; 3: anything else, RuntimeError) and leaves the message for
// audiofast_last_error(). No exception crosses into Python.
#include <cstdint>
#include <new>
#include <string>

#include "array.h"
#include "cross_attention.h"
#include "decoder_step.h"
#include "encoder_forward.h"
#include "quant_linear.h"
#include "qk_norm_rope.h"
#include "dit_attention.h"
#include "pool.h"

namespace {

thread_local std::string last_error;

template <typename F>
int guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (const audiofast::InputError& e) {
    last_error = e.what();
    return 1;
  } catch (const std::bad_alloc&) {
    last_error = "out of memory";
    return 2;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 3;
  }
}

}  // namespace

extern "C" {

const char* audiofast_last_error() { return last_error.c_str(); }

int audiofast_decoder_forward(const int64_t* ids, int64_t rows, int64_t start, int64_t last,
                              const audiofast::Array* params, int64_t n_params,
                              const audiofast::Array* k_cache, const audiofast::Array* v_cache,
                              const audiofast::Array* cross_k, const audiofast::Array* cross_v,
                              const audiofast::Array* cross_k_scale,
                              const audiofast::Array* cross_v_scale,
                              int64_t n_cross, int64_t rescore, float* logits,
                              int64_t logits_size, float* hidden) {
  return guarded([&] {
    audiofast::decoder_forward(ids, rows, start, last, params, n_params, *k_cache, *v_cache,
                               cross_k, cross_v, cross_k_scale, cross_v_scale, n_cross,
                               rescore, logits, logits_size, hidden);
  });
}

// Several sequences in one call, each with its own cache and window (decoder_step.h).
int audiofast_decoder_forward_batch(const int64_t* ids, int64_t n_seq, const int64_t* starts,
                                    const int64_t* rows, const int64_t* lasts,
                                    const audiofast::Array* params, int64_t n_params,
                                    const audiofast::Array* const* k_caches,
                                    const audiofast::Array* const* v_caches,
                                    const audiofast::Array* const* cross_k,
                                    const audiofast::Array* const* cross_v,
                                    const audiofast::Array* const* cross_k_scale,
                                    const audiofast::Array* const* cross_v_scale,
                                    int64_t n_cross, int64_t rescore, float* logits,
                                    int64_t logits_size, float* hidden) {
  return guarded([&] {
    audiofast::decoder_forward_batch(ids, n_seq, starts, rows, lasts, params, n_params, k_caches,
                                     v_caches, cross_k, cross_v, cross_k_scale, cross_v_scale,
                                     n_cross, rescore, logits, logits_size, hidden);
  });
}

// y (rows, out) = the int8 or int4 linear whose four arrays are `linear`, on x (rows, in) f32.
int audiofast_quant_linear(const float* x, int64_t rows, int64_t in,
                          const audiofast::Array* linear, float* y, int64_t y_size) {
  return guarded([&] {
    const auto L = audiofast::linear_at(linear, 0);
    // in: the weight's packed width, or its real one when packing zero-padded it to 32
    audiofast::check(in == L.in || (in > 0 && in < L.in && in > L.in - 32),
                     "quant_linear: x must be (rows, in) float32");
    audiofast::check(y_size == rows * L.out, "quant_linear: output buffer of the wrong size");
    audiofast::linear(L, x, rows, y, in);
  });
}

// The DiT's rms norm + adaLN modulation + int8 linear in one call (quant_linear.h).
int audiofast_modulated_linear(const float* x, int64_t rows, int64_t in, int64_t tokens,
                               const float* mult, const float* shift, int64_t n_mod, float eps,
                               const audiofast::Array* linear, int glu_pairs, float* y,
                               int64_t y_size) {
  return guarded([&] {
    const auto L = audiofast::linear_at(linear, 0);
    audiofast::check(in == L.in && L.bits == 8, "modulated_linear: x must be (rows, in) float32 "
                     "for an int8 linear");
    audiofast::check(tokens > 0 && rows % tokens == 0,
                     "modulated_linear: rows must be whole samples of `tokens` rows");
    audiofast::check(n_mod == rows / tokens * in, "modulated_linear: mult and shift must be "
                     "(samples, in)");
    audiofast::check(!glu_pairs || L.out % 32 == 0,
                     "modulated_linear: a GLU needs an output width that is a multiple of 32");
    audiofast::check(y_size == rows * (glu_pairs ? L.out / 2 : L.out),
                     "modulated_linear: output buffer of the wrong size");
    audiofast::modulated_linear(L, x, rows, tokens, mult, shift, eps, y, glu_pairs != 0);
  });
}

// The DiT's gated residual linears, with the GLU before the second feed-forward linear
// (quant_linear.h).
int audiofast_gated_linear(const float* x, int64_t rows, int64_t in, int64_t tokens, int glu,
                           const float* residual, const float* gate, int64_t n_gate,
                           const audiofast::Array* linear, float* y, int64_t y_size) {
  return guarded([&] {
    const auto L = audiofast::linear_at(linear, 0);
    audiofast::check(in == (glu ? 2 : 1) * L.in && L.bits == 8,
                     glu ? "gated_linear: x must be (rows, 2 x in) float32 for an int8 linear"
                         : "gated_linear: x must be (rows, in) float32 for an int8 linear");
    audiofast::check(tokens > 0 && rows % tokens == 0,
                     "gated_linear: rows must be whole samples of `tokens` rows");
    audiofast::check(!residual || (n_gate == rows / tokens * L.out && L.out % 8 == 0),
                     "gated_linear: gate must be (samples, out)");
    audiofast::check(y_size == rows * L.out, "gated_linear: output buffer of the wrong size");
    audiofast::gated_linear(L, x, rows, tokens, glu != 0, residual, gate, y);
  });
}

// The DiT's self-attention heads: q/k RMS norm + RoPE + head layout (qk_norm_rope.h).
int audiofast_qk_norm_rope(const float* qkv, int64_t batch, int64_t tokens, int64_t heads,
                           int64_t d, int64_t rot, const float* q_gain, const float* k_gain,
                           float eps, const float* cos, const float* sin, float* q, float* k,
                           float* v) {
  return guarded([&] {
    audiofast::qk_norm_rope(qkv, batch, tokens, heads, d, rot, q_gain, k_gain, eps, cos, sin, q,
                            k, v);
  });
}

// The DiT's self-attention in 8 bits from its QKV rows (dit_attention.h).
int audiofast_dit_attention_int8(const float* qkv, int64_t batch, int64_t tokens, int64_t heads,
                                 int64_t d, int64_t rot, const float* q_gain,
                                 const float* k_gain, float eps, const float* cos,
                                 const float* sin, const float* value_mask, float* out) {
  return guarded([&] {
    audiofast::dit_attention_int8(qkv, batch, tokens, heads, d, rot, q_gain, k_gain, eps, cos,
                                  sin, value_mask, out);
  });
}

// The DiT's cross-attention in 8 bits from its q and kv rows (dit_attention.h).
int audiofast_dit_cross_attention_int8(const float* q, const float* kv, int64_t batch,
                                       int64_t tokens, int64_t context, int64_t heads, int64_t d,
                                       const float* q_gain, const float* k_gain, float eps,
                                       float* out) {
  return guarded([&] {
    audiofast::dit_cross_attention_int8(q, kv, batch, tokens, context, heads, d, q_gain, k_gain,
                                        eps, out);
  });
}

int audiofast_dit_attention_uses_vnni(int64_t d) {
  return audiofast::dit_attention_uses_vnni(d) ? 1 : 0;
}

// Whisper's encoder layers over x (batch x frames, width) in place (encoder_forward.h).
int audiofast_encoder_forward(float* x, int64_t batch, int64_t frames, int64_t heads,
                              const audiofast::Array* params, int64_t n_params) {
  return guarded([&] { audiofast::encoder_forward(x, batch, frames, heads, params, n_params); });
}

// Exact GELU in place (encoder_forward.h): after each of the fused encoder's convolutions
// (fused_encoder.py).
int audiofast_gelu(float* x, int64_t n) {
  return guarded([&] { audiofast::parallel_gelu(x, n); });
}

// keys, values (heads, frames, 64) fp16 from a window's projected kv (frames, 2 x heads x 64).
int audiofast_split_heads_f16(const float* kv, int64_t frames, int64_t heads, uint16_t* keys,
                              uint16_t* values) {
  return guarded([&] { audiofast::split_heads_f16(kv, frames, heads, keys, values); });
}

// The same in int8 with a scale per (head, frame) (split_heads_i8).
int audiofast_split_heads_i8(const float* kv, int64_t frames, int64_t heads, int8_t* keys,
                             int8_t* values, float* key_scale, float* value_scale) {
  return guarded([&] {
    audiofast::split_heads_i8(kv, frames, heads, keys, values, key_scale, value_scale);
  });
}

int audiofast_pool_selftest(int64_t n, int64_t throw_at, int64_t* total) {
  return guarded([&] { *total = audiofast::pool_selftest(n, throw_at); });
}

// Which dot-product path quantized linears take here: 1 AVX-512 VNNI, 0 AVX2.
int audiofast_uses_vnni() { return audiofast::use_vnni() ? 1 : 0; }

void audiofast_set_threads(int threads) { audiofast::pool_threads.store(threads); }
}
