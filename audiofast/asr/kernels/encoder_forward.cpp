// Whisper's encoder layers, all of them in one C++ op (the convolutions run before it:
// fused_encoder.py).
//
// Run with torch doing attention and norms between our int8 linears, a 30 s window took as
// long as CTranslate2's encoder although every op alone was 2x faster: each hand-over woke
// the other runtime's threads while the previous one's were still spinning on the same two
// cores (a linear right after torch's attention took 14-20 ms instead of 7). Here every loop
// runs on the one pool. Linears: the decoder's int8 kernel, each frame quantized over its own
// range. Attention: a block of queries (4 on AVX2, 8 with VNNI) against 16 keys at a time from
// a per-head key layout read front to back (float32 keys; int8 keys and 8-bit queries with
// VNNI), softmax, then the float32 values.
#include "encoder_forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "avx2.h"
#include "pool.h"
#include "quant_linear.h"

namespace audiofast {

namespace {

constexpr int64_t kKeys = 16;    // keys per score tile
constexpr int64_t kQueries = 4;  // queries per tile

enum LayerParam : int { kAttnNorm = 0, kQkv = 2, kOut = 6, kFfnNorm = 10, kFc1 = 12, kFc2 = 16,
                        kLayerSize = 20 };
static_assert(kLayerSize == 2 * 2 + 4 * kArraysPerLinear);

// Keys rounded up to whole tiles (the tiles' and score rows' length).
int64_t padded_keys(int64_t frames) { return (frames + kKeys - 1) / kKeys * kKeys; }

// R query rows from q0 on (rows past `frames` repeat the last: computed, then dropped), head
// h, pre-scaled by 1 / sqrt(64) (exact), out of the qkv rows (frames, 3 x d).
void load_queries(const float* qkv, int64_t frames, int64_t d, int64_t h, int64_t q0,
                  int64_t R, float (*q)[kHeadDim]) {
  for (int64_t r = 0; r < R; ++r) {
    const float* src = qkv + std::min(q0 + r, frames - 1) * 3 * d + h * kHeadDim;
    for (int64_t i = 0; i < kHeadDim; ++i) q[r][i] = src[i] * 0.125f;
  }
}

// Layer norm of every row (eps 1e-5), rows across threads; the sums in 8 float lanes.
void layer_norm_rows(const float* x, const Array& weight, const Array& bias, int64_t rows,
                     int64_t d, float* out) {
  check(weight.is(kFloat32, 1) && bias.is(kFloat32, 1) && weight.size(0) == d &&
            bias.size(0) == d,
        "encoder_forward: layer norms must be float32 (width,)");
  const float* w = weight.ptr<float>();
  const float* b = bias.ptr<float>();
  parallel_for(rows, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const float* r = x + m * d;
      float* o = out + m * d;
      __m256 s = _mm256_setzero_ps();
      for (int64_t i = 0; i < d; i += 8) s = _mm256_add_ps(s, _mm256_loadu_ps(r + i));
      const __m256 mean = _mm256_set1_ps(sum8(s) / d);
      __m256 v = _mm256_setzero_ps();
      for (int64_t i = 0; i < d; i += 8) {
        const __m256 c = _mm256_sub_ps(_mm256_loadu_ps(r + i), mean);
        v = _mm256_fmadd_ps(c, c, v);
      }
      const __m256 inv = _mm256_set1_ps(1.f / std::sqrt(sum8(v) / d + 1e-5f));
      for (int64_t i = 0; i < d; i += 8) {
        const __m256 c = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(r + i), mean), inv);
        _mm256_storeu_ps(o + i, _mm256_fmadd_ps(c, _mm256_loadu_ps(w + i),
                                                _mm256_loadu_ps(b + i)));
      }
    }
  });
}

void add_into(float* x, const float* y, int64_t n) {
  parallel_for(n / 8, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0 * 8; i < i1 * 8; i += 8)
      _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  });
}

// One head's values (frames, 64) and, unless `tiles` is null, its keys as tiles of 16 keys x 64
// dims, dims outer (keys past `frames` zero), copied out of the qkv rows (frames, 3 x d).
void gather_head(const float* qkv, int64_t frames, int64_t d, int64_t h, float* tiles,
                 float* values) {
  const int64_t padded = padded_keys(frames);
  if (tiles) std::fill(tiles, tiles + padded * kHeadDim, 0.f);
  for (int64_t t = 0; t < frames; ++t) {
    if (tiles) {
      const float* k = qkv + t * 3 * d + d + h * kHeadDim;
      float* tile = tiles + (t / kKeys) * kKeys * kHeadDim + t % kKeys;
      for (int64_t i = 0; i < kHeadDim; ++i) tile[i * kKeys] = k[i];
    }
    std::copy_n(qkv + t * 3 * d + 2 * d + h * kHeadDim, kHeadDim, values + t * kHeadDim);
  }
}

// out rows q0 .. q0 + 4 of one head (rows past `frames` are computed and dropped): scores over
// every key, softmax, then the values. scores holds 4 x padded floats.
void attend_tile(const float* qkv, int64_t frames, int64_t d, int64_t h, int64_t q0,
                 const float* tiles, const float* values, float* scores, float* out) {
  const int64_t padded = padded_keys(frames);
  alignas(32) float q[kQueries][kHeadDim];
  load_queries(qkv, frames, d, h, q0, kQueries, q);
  for (int64_t t = 0; t < padded; t += kKeys) {
    const float* tile = tiles + t * kHeadDim;
    __m256 acc[kQueries][2];
    for (auto& a : acc) a[0] = a[1] = _mm256_setzero_ps();
    for (int64_t i = 0; i < kHeadDim; ++i) {
      const __m256 k0 = _mm256_loadu_ps(tile + i * kKeys);
      const __m256 k1 = _mm256_loadu_ps(tile + i * kKeys + 8);
      for (int64_t r = 0; r < kQueries; ++r) {
        const __m256 qb = _mm256_broadcast_ss(&q[r][i]);
        acc[r][0] = _mm256_fmadd_ps(qb, k0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(qb, k1, acc[r][1]);
      }
    }
    for (int64_t r = 0; r < kQueries; ++r) {
      _mm256_storeu_ps(scores + r * padded + t, acc[r][0]);
      _mm256_storeu_ps(scores + r * padded + t + 8, acc[r][1]);
    }
  }
  float inv[kQueries];
  for (int64_t r = 0; r < kQueries; ++r) {
    float* s = scores + r * padded;
    std::fill(s + frames, s + padded, -INFINITY);
    __m256 most = _mm256_set1_ps(-INFINITY);  // 8 lanes: a scalar max chain was 1/5 here
    for (int64_t t = 0; t < padded; t += 8) most = _mm256_max_ps(most, _mm256_loadu_ps(s + t));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, most);
    inv[r] = softmax_numerators(s, padded, *std::max_element(lanes, lanes + 8));
  }
  for (int64_t c = 0; c < kHeadDim; c += 16) {
    __m256 acc[kQueries][2];
    for (auto& a : acc) a[0] = a[1] = _mm256_setzero_ps();
    for (int64_t t = 0; t < frames; ++t) {
      const __m256 v0 = _mm256_loadu_ps(values + t * kHeadDim + c);
      const __m256 v1 = _mm256_loadu_ps(values + t * kHeadDim + c + 8);
      for (int64_t r = 0; r < kQueries; ++r) {
        const __m256 p = _mm256_broadcast_ss(scores + r * padded + t);
        acc[r][0] = _mm256_fmadd_ps(p, v0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(p, v1, acc[r][1]);
      }
    }
    for (int64_t r = 0; r < kQueries && q0 + r < frames; ++r) {
      float* o = out + (q0 + r) * d + h * kHeadDim + c;
      const __m256 scale = _mm256_set1_ps(inv[r]);
      _mm256_storeu_ps(o, _mm256_mul_ps(acc[r][0], scale));
      _mm256_storeu_ps(o + 8, _mm256_mul_ps(acc[r][1], scale));
    }
  }
}

// One head's keys in int8 for VNNI scores: tiles of 16 keys, per group of 4 dims the 16 keys'
// 4 bytes side by side (vpdpbusd's layout), one symmetric scale per key and the key's int8 sum.
struct Int8Keys {
  int8_t* tiles;  // padded x 64
  float* scale;   // padded
  int32_t* sum;   // padded
};

void gather_keys_int8(const float* qkv, int64_t frames, int64_t d, int64_t h, Int8Keys k8) {
  const int64_t padded = padded_keys(frames);
  std::fill(k8.tiles, k8.tiles + padded * kHeadDim, int8_t{0});
  std::fill(k8.scale, k8.scale + padded, 0.f);
  std::fill(k8.sum, k8.sum + padded, 0);
  for (int64_t t = 0; t < frames; ++t) {
    const float* k = qkv + t * 3 * d + d + h * kHeadDim;
    float most = 0.f;
    for (int64_t i = 0; i < kHeadDim; ++i) most = std::max(most, std::fabs(k[i]));
    const float scale = most > 0.f ? most / 127.f : 1.f;
    int8_t* tile = k8.tiles + (t / kKeys) * kKeys * kHeadDim + (t % kKeys) * 4;
    int32_t total = 0;
    for (int64_t i = 0; i < kHeadDim; ++i) {
      const int32_t v = static_cast<int32_t>(std::nearbyint(k[i] / scale));
      tile[(i / 4) * kKeys * 4 + i % 4] = static_cast<int8_t>(std::clamp(v, -127, 127));
      total += std::clamp(v, -127, 127);
    }
    k8.scale[t] = scale;
    k8.sum[t] = total;
  }
}

// attend_tile with AVX-512 VNNI: scores from int8 keys and 8-bit queries (the encoder's mean
// relative error vs float32 0.0351 vs 0.0350 with float scores at 3000 frames, 0.044-0.048 vs
// 0.041-0.047 at 1000, CTranslate2's 0.042 / 0.052; 30 s windows ~1.2x faster), values in
// float32, 16 dims per register; 8 queries per call. Not the AVX2 path's arithmetic: close, not
// equal (the encoder's output need not match across CPUs; the decoder's must).
constexpr int64_t kQueries512 = 8;

// Scores of 8 queries (8-bit over each query's range) against int8 keys: 16 vpdpbusd per 16
// keys and query instead of 64 float FMAs.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void score_int8_512(
    const float (*q)[kHeadDim], const Int8Keys& k8, int64_t frames, int64_t padded,
    float* scores, __m512* most) {
  constexpr int64_t R = kQueries512;
  alignas(64) uint8_t qq[R][kHeadDim];
  RowScale qs[R];
  for (int64_t r = 0; r < R; ++r) qs[r] = quantize_row(q[r], kHeadDim, qq[r]);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t t = 0; t < padded; t += kKeys) {
    const int8_t* tile = k8.tiles + t * kHeadDim;
    __m512i acc[R];
    for (auto& a : acc) a = _mm512_setzero_si512();
    for (int64_t g = 0; g < kHeadDim / 4; ++g) {
      const __m512i w = _mm512_loadu_si512(tile + g * kKeys * 4);
      for (int64_t r = 0; r < R; ++r) {
        int32_t v;
        std::memcpy(&v, qq[r] + 4 * g, 4);
        acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_set1_epi32(v), w);
      }
    }
    const __m512 kscale = _mm512_loadu_ps(k8.scale + t);
    const __m512i ksum = _mm512_loadu_si512(k8.sum + t);
    const __mmask16 live = _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32(
        static_cast<int32_t>(std::min<int64_t>(kKeys, frames - t))));
    for (int64_t r = 0; r < R; ++r) {
      const __m512i exact = _mm512_sub_epi32(acc[r], _mm512_mullo_epi32(
          _mm512_set1_epi32(qs[r].zero), ksum));
      const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(exact),
                                     _mm512_mul_ps(_mm512_set1_ps(qs[r].scale), kscale));
      const __m512 masked = _mm512_mask_blend_ps(live, _mm512_set1_ps(-INFINITY), v);
      _mm512_storeu_ps(scores + r * padded + t, masked);
      most[r] = _mm512_max_ps(most[r], masked);
    }
  }
}

__attribute__((target("avx512f"))) void attend_tile_512(
    const float* qkv, int64_t frames, int64_t d, int64_t h, int64_t q0, const Int8Keys& k8,
    const float* values, float* scores, float* out) {
  const int64_t padded = padded_keys(frames);
  constexpr int64_t R = kQueries512;
  alignas(64) float q[R][kHeadDim];
  load_queries(qkv, frames, d, h, q0, R, q);
  __m512 most[R];
  for (auto& m : most) m = _mm512_set1_ps(-INFINITY);
  score_int8_512(q, k8, frames, padded, scores, most);
  float inv[R];
  for (int64_t r = 0; r < R; ++r)
    inv[r] = softmax_numerators(scores + r * padded, padded, _mm512_reduce_max_ps(most[r]));
  for (int64_t r0 = 0; r0 < R; r0 += 4) {
    __m512 acc[4][4];
    for (auto& a : acc)
      for (auto& x : a) x = _mm512_setzero_ps();
    for (int64_t t = 0; t < frames; ++t) {
      const float* v = values + t * kHeadDim;
      const __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
      const __m512 v2 = _mm512_loadu_ps(v + 32), v3 = _mm512_loadu_ps(v + 48);
      for (int64_t r = 0; r < 4; ++r) {
        const __m512 p = _mm512_set1_ps(scores[(r0 + r) * padded + t]);
        acc[r][0] = _mm512_fmadd_ps(p, v0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(p, v1, acc[r][1]);
        acc[r][2] = _mm512_fmadd_ps(p, v2, acc[r][2]);
        acc[r][3] = _mm512_fmadd_ps(p, v3, acc[r][3]);
      }
    }
    for (int64_t r = 0; r < 4 && q0 + r0 + r < frames; ++r) {
      float* o = out + (q0 + r0 + r) * d + h * kHeadDim;
      const __m512 scale = _mm512_set1_ps(inv[r0 + r]);
      for (int j = 0; j < 4; ++j) _mm512_storeu_ps(o + 16 * j, _mm512_mul_ps(acc[r][j], scale));
    }
  }
}

// Full (non-causal) self-attention of one window: qkv (frames, 3 x d) -> out (frames, d).
void window_attention(const float* qkv, int64_t frames, int64_t heads, float* out) {
  const int64_t d = heads * kHeadDim, padded = padded_keys(frames);
  const bool vnni = use_vnni();  // int8 keys; else float key tiles
  std::vector<float> tiles(vnni ? 0 : heads * padded * kHeadDim),
      values(heads * frames * kHeadDim);
  std::vector<int8_t> key_tiles(vnni ? heads * padded * kHeadDim : 0);
  std::vector<float> key_scale(vnni ? heads * padded : 0);
  std::vector<int32_t> key_sum(vnni ? heads * padded : 0);
  std::vector<Int8Keys> keys8(heads);
  parallel_for(heads, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      gather_head(qkv, frames, d, h, vnni ? nullptr : &tiles[h * padded * kHeadDim],
                  &values[h * frames * kHeadDim]);
      if (!vnni) continue;
      keys8[h] = {&key_tiles[h * padded * kHeadDim], &key_scale[h * padded],
                  &key_sum[h * padded]};
      gather_keys_int8(qkv, frames, d, h, keys8[h]);
    }
  });
  const int64_t per_tile = vnni ? kQueries512 : kQueries;
  const int64_t blocks = (frames + per_tile - 1) / per_tile;
  parallel_for(heads * blocks, [&](int64_t t0, int64_t t1) {
    std::vector<float> scores(per_tile * padded);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t h = t / blocks, q0 = (t % blocks) * per_tile;
      const float* head_values = &values[h * frames * kHeadDim];
      if (vnni)
        attend_tile_512(qkv, frames, d, h, q0, keys8[h], head_values, scores.data(), out);
      else
        attend_tile(qkv, frames, d, h, q0, &tiles[h * padded * kHeadDim], head_values,
                    scores.data(), out);
    }
  });
}

}  // namespace

void parallel_gelu(float* x, int64_t n) {
  check(n % 8 == 0, "gelu: the length must be a multiple of 8");
  constexpr int64_t kSlice = 4096;
  parallel_for((n + kSlice - 1) / kSlice, [&](int64_t b0, int64_t b1) {
    gelu(x + b0 * kSlice, std::min(n, b1 * kSlice) - b0 * kSlice);
  });
}

void encoder_forward(float* x, int64_t batch, int64_t frames, int64_t heads,
                     const Array* params, int64_t n_params) {
  const int64_t d = heads * kHeadDim, rows = batch * frames;
  check(batch > 0 && frames > 0, "encoder_forward: nothing to encode");
  check(n_params >= 2 && (n_params - 2) % kLayerSize == 0,
        "encoder_forward: parameters must be the final norm, then 20 arrays per layer");
  const int64_t layers = (n_params - 2) / kLayerSize;
  const int64_t ff = linear_at(params, 2 + kFc1).out;
  std::vector<float> normed(rows * d), qkv(rows * 3 * d), attn(rows * d), y(rows * d),
      hidden(rows * ff);
  for (int64_t l = 0; l < layers; ++l) {
    const Array* p = params + 2 + l * kLayerSize;
    const auto qkv_proj = linear_at(p, kQkv), out_proj = linear_at(p, kOut);
    const auto fc1 = linear_at(p, kFc1), fc2 = linear_at(p, kFc2);
    check(qkv_proj.in == d && qkv_proj.out == 3 * d && out_proj.in == d && out_proj.out == d &&
              fc1.in == d && fc1.out == ff && fc2.in == ff && fc2.out == d,
          "encoder_forward: linear shapes do not match the model width");
    layer_norm_rows(x, p[kAttnNorm], p[kAttnNorm + 1], rows, d, normed.data());
    linear(qkv_proj, normed.data(), rows, qkv.data());
    for (int64_t b = 0; b < batch; ++b)
      window_attention(&qkv[b * frames * 3 * d], frames, heads, &attn[b * frames * d]);
    linear(out_proj, attn.data(), rows, y.data());
    add_into(x, y.data(), rows * d);
    layer_norm_rows(x, p[kFfnNorm], p[kFfnNorm + 1], rows, d, normed.data());
    linear(fc1, normed.data(), rows, hidden.data());
    parallel_gelu(hidden.data(), rows * ff);
    linear(fc2, hidden.data(), rows, y.data());
    add_into(x, y.data(), rows * d);
  }
  layer_norm_rows(x, params[0], params[1], rows, d, x);
}

}  // namespace audiofast
