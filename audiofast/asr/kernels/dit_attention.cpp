// The SA3 DiT's self-attention in 8 bits, from its fused QKV rows to the rows `to_out` reads, in
// one pass per (sample, head) (audiofast/diffusion/int8_attention.py has the same arithmetic in
// PyTorch: what QAD trains against and the fallback where this library is not built).
//
// Per head: q, k RMS-normed and rotated (norm_rotate), then
//   q: 8 bits over each query's own range [min(0, q), max(0, q)] (as every int8 linear's input),
//   k: symmetric int8 per key,   v: symmetric int8 per channel (over the head's tokens),
//   scores = (q8 - zero) . k8 * scale_q * scale_k / sqrt(d)          (exact int32 sums)
//   p8 = round(255 exp(score - max)) per query (the max weight is exactly 255)
//   out = (p8 . v8) * scale_v / sum(p8)                               (exact int32 sums)
// With AVX-512 VNNI both products are vpdpbusd over 16 keys (or channels) x 4 bytes; without it
// the same integers are summed as floats (exact below 2^24: heads up to 512 wide and 512
// tokens), so both paths give the same sums and differ only in float rounding after them.
#include "dit_attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "array.h"
#include "avx2.h"
#include "pool.h"
#include "qk_norm_rope.h"
#include "quant_linear.h"

namespace audiofast {

namespace {

constexpr int64_t kTile = 16;  // keys per score tile, channels per value block

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// One (sample, head)'s operands and scores; reused by a thread across the heads it takes.
struct HeadScratch {
  int64_t nq, nk, d, keys;  // queries, keys, head dim, keys padded to whole tiles
  const float *q, *k, *v;              // float rows after norm + rope (nq / nk x d, head-major)
  std::vector<uint8_t> q8;             // nq x d, with q_zero
  std::vector<float> q_scale;          // nq
  std::vector<int32_t> q_zero;         // nq
  std::vector<int8_t> k8;              // nk x d
  std::vector<float> k_scale;          // keys (0 past nk)
  std::vector<int32_t> k_sum;          // keys
  std::vector<int8_t> v8;              // nk x d
  std::vector<float> v_scale;          // d
  std::vector<float> scores;           // nq x keys
  std::vector<uint8_t> p8;             // nq x keys (0 past nk)
  std::vector<int32_t> p_sum;          // nq
  std::vector<int8_t> k_tiles, v_tiles;  // VNNI layouts

  HeadScratch(int64_t nq_, int64_t nk_, int64_t d_)
      : nq(nq_), nk(nk_), d(d_), keys(round_up(nk_, kTile)), q(nullptr), k(nullptr),
        v(nullptr), q8(nq * d), q_scale(nq), q_zero(nq), k8(nk * d), k_scale(keys),
        k_sum(keys), v8(nk * d), v_scale(d), scores(nq * keys), p8(nq * keys), p_sum(nq),
        k_tiles(keys * d), v_tiles(keys * d) {}
};

// 8 lanes of int32 -> 8 bytes (saturating: the values are already in range).
inline void store8_u8(__m256i v, uint8_t* dst) {
  const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), _mm_packus_epi16(w, w));
}

inline void store8_i8(__m256i v, int8_t* dst) {
  const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), _mm_packs_epi16(w, w));
}

inline float hmax8(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  return *std::max_element(lanes, lanes + 8);
}

inline float hmin8(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  return *std::min_element(lanes, lanes + 8);
}

// round(x / scale) (nearest even, as torch.round and std::nearbyint), clamped.
inline __m256i round_div(__m256 x, __m256 scale, __m256i lo, __m256i hi) {
  const __m256i v = _mm256_cvtps_epi32(_mm256_div_ps(x, scale));
  return _mm256_min_epi32(_mm256_max_epi32(v, lo), hi);
}

float symmetric_scale(float amax) { return amax > 0.f ? amax / 127.f : 1.f; }

// The head's q (8 bits over [min(0, q), max(0, q)] per row: qad.fake_quant_activation's
// arithmetic), k (symmetric per row) and v (symmetric per channel); d a multiple of 8.
void quantize_head(HeadScratch& s) {
  const int64_t d = s.d;
  const __m256 sign = _mm256_set1_ps(-0.f);
  const __m256i zero_i = _mm256_setzero_si256(), q_hi = _mm256_set1_epi32(255);
  const __m256i k_lo = _mm256_set1_epi32(-127), k_hi = _mm256_set1_epi32(127);
  alignas(32) int32_t lanes[8];
  for (int64_t t = 0; t < s.nq; ++t) {
    const float* q = s.q + t * d;
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8) {
      lo = _mm256_min_ps(lo, _mm256_loadu_ps(q + i));
      hi = _mm256_max_ps(hi, _mm256_loadu_ps(q + i));
    }
    const float low = hmin8(lo);
    float scale = (hmax8(hi) - low) / 255.f;
    if (!(scale > 0.f)) scale = 1.f;
    const int32_t zero = std::clamp(static_cast<int32_t>(std::nearbyint(-low / scale)), 0, 255);
    const __m256 sv = _mm256_set1_ps(scale);
    const __m256i zv = _mm256_set1_epi32(zero);
    for (int64_t i = 0; i < d; i += 8) {
      const __m256i v = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(q + i), sv));
      store8_u8(_mm256_min_epi32(_mm256_max_epi32(_mm256_add_epi32(v, zv), zero_i), q_hi),
                &s.q8[t * d + i]);
    }
    s.q_scale[t] = scale;
    s.q_zero[t] = zero;
  }
  for (int64_t t = 0; t < s.nk; ++t) {
    const float* k = s.k + t * d;
    __m256 amax = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8)
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(k + i)));
    const float ks = symmetric_scale(hmax8(amax));
    const __m256 ksv = _mm256_set1_ps(ks);
    __m256i total = _mm256_setzero_si256();
    for (int64_t i = 0; i < d; i += 8) {
      const __m256i v = round_div(_mm256_loadu_ps(k + i), ksv, k_lo, k_hi);
      total = _mm256_add_epi32(total, v);
      store8_i8(v, &s.k8[t * d + i]);
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), total);
    s.k_scale[t] = ks;
    s.k_sum[t] = std::accumulate(lanes, lanes + 8, 0);
  }
  std::fill(s.k_scale.begin() + s.nk, s.k_scale.end(), 0.f);
  std::fill(s.k_sum.begin() + s.nk, s.k_sum.end(), 0);
  for (int64_t i = 0; i < d; i += 8) {
    __m256 amax = _mm256_setzero_ps();
    for (int64_t t = 0; t < s.nk; ++t)
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(s.v + t * d + i)));
    alignas(32) float am[8];
    _mm256_store_ps(am, amax);
    for (int64_t j = 0; j < 8; ++j) s.v_scale[i + j] = symmetric_scale(am[j]);
    const __m256 vs = _mm256_loadu_ps(&s.v_scale[i]);
    for (int64_t t = 0; t < s.nk; ++t)
      store8_i8(round_div(_mm256_loadu_ps(s.v + t * d + i), vs, k_lo, k_hi), &s.v8[t * d + i]);
  }
}

// scores rows -> p8 rows (round(255 exp(s - max)), 0 past n) and their sums.
void softmax_8bit(HeadScratch& s) {
  const __m256 full = _mm256_set1_ps(255.f);
  for (int64_t i = 0; i < s.nq; ++i) {
    float* row = &s.scores[i * s.keys];
    for (int64_t t = s.nk; t < s.keys; ++t) row[t] = -INFINITY;
    __m256 most = _mm256_set1_ps(-INFINITY);
    for (int64_t t = 0; t < s.keys; t += 8) most = _mm256_max_ps(most, _mm256_loadu_ps(row + t));
    const __m256 top = _mm256_set1_ps(hmax8(most));
    uint8_t* p = &s.p8[i * s.keys];
    __m256i total = _mm256_setzero_si256();
    for (int64_t t = 0; t < s.keys; t += 8) {
      const __m256 w = _mm256_mul_ps(exp8(_mm256_sub_ps(_mm256_loadu_ps(row + t), top)), full);
      const __m256i v = _mm256_cvtps_epi32(w);  // nearest even; <= 255, exactly 255 at the max
      total = _mm256_add_epi32(total, v);
      store8_u8(v, p + t);
    }
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), total);
    s.p_sum[i] = std::accumulate(lanes, lanes + 8, 0);
  }
}

// softmax_8bit on 16 lanes (keys a multiple of 16 here): the same p8 and sums.
__attribute__((target("avx512f,avx512bw"))) void softmax_8bit_16(HeadScratch& s) {
  const __m512 full = _mm512_set1_ps(255.f);
  for (int64_t i = 0; i < s.nq; ++i) {
    float* row = &s.scores[i * s.keys];
    for (int64_t t = s.nk; t < s.keys; ++t) row[t] = -INFINITY;
    __m512 most = _mm512_set1_ps(-INFINITY);
    for (int64_t t = 0; t < s.keys; t += 16) most = _mm512_max_ps(most, _mm512_loadu_ps(row + t));
    const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(most));
    uint8_t* p = &s.p8[i * s.keys];
    __m512i total = _mm512_setzero_si512();
    for (int64_t t = 0; t < s.keys; t += 16) {
      const __m512 w = _mm512_mul_ps(exp16(_mm512_sub_ps(_mm512_loadu_ps(row + t), top)), full);
      const __m512i v = _mm512_cvtps_epi32(w);  // nearest even; <= 255, exactly 255 at the max
      total = _mm512_add_epi32(total, v);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p + t), _mm512_cvtusepi32_epi8(v));
    }
    s.p_sum[i] = _mm512_reduce_add_epi32(total);
  }
}

// Scores and weighted values with the integers summed as floats (any CPU).
void attend_float(HeadScratch& s, float inv_sqrt_d, float* out, int64_t out_stride) {
  const int64_t d = s.d;
  std::vector<float> kt(d * s.keys, 0.f), qf(d), acc(d);
  for (int64_t t = 0; t < s.nk; ++t)
    for (int64_t i = 0; i < d; ++i) kt[i * s.keys + t] = s.k8[t * d + i];
  for (int64_t r = 0; r < s.nq; ++r) {
    for (int64_t i = 0; i < d; ++i) qf[i] = static_cast<float>(s.q8[r * d + i] - s.q_zero[r]);
    float* row = &s.scores[r * s.keys];
    std::fill(row, row + s.keys, 0.f);
    for (int64_t i = 0; i < d; ++i)
      for (int64_t t = 0; t < s.keys; ++t) row[t] += qf[i] * kt[i * s.keys + t];
    const float qs = s.q_scale[r] * inv_sqrt_d;
    for (int64_t t = 0; t < s.nk; ++t) row[t] *= qs * s.k_scale[t];
  }
  softmax_8bit(s);
  for (int64_t r = 0; r < s.nq; ++r) {
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t t = 0; t < s.nk; ++t) {
      const float p = s.p8[r * s.keys + t];
      for (int64_t i = 0; i < d; ++i) acc[i] += p * s.v8[t * d + i];
    }
    const float inv = 1.f / static_cast<float>(s.p_sum[r]);
    for (int64_t i = 0; i < d; ++i) out[r * out_stride + i] = acc[i] * s.v_scale[i] * inv;
  }
}

// Values as blocks of 16 channels x 4 tokens: tokens t0..t0+3 (rows, d apart; null past the
// last token: zeros) interleaved byte by byte, 4 x 16 at a time.
void interleave_values(const int8_t* v8, int64_t d, int64_t t0, int64_t nk, int8_t* dst) {
  static const int8_t zeros[512] = {};
  const int8_t* rows[4];
  for (int j = 0; j < 4; ++j) rows[j] = t0 + j < nk ? v8 + (t0 + j) * d : zeros;
  for (int64_t c = 0; c < d; c += kTile, dst += 4 * kTile) {
    const auto load = [&](int j) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[j] + c));
    };
    const __m128i a = load(0), b = load(1), c2 = load(2), d2 = load(3);
    const __m128i ab_lo = _mm_unpacklo_epi8(a, b), ab_hi = _mm_unpackhi_epi8(a, b);
    const __m128i cd_lo = _mm_unpacklo_epi8(c2, d2), cd_hi = _mm_unpackhi_epi8(c2, d2);
    auto* out = reinterpret_cast<__m128i*>(dst);
    _mm_storeu_si128(out, _mm_unpacklo_epi16(ab_lo, cd_lo));      // channels 0-3
    _mm_storeu_si128(out + 1, _mm_unpackhi_epi16(ab_lo, cd_lo));  // 4-7
    _mm_storeu_si128(out + 2, _mm_unpacklo_epi16(ab_hi, cd_hi));  // 8-11
    _mm_storeu_si128(out + 3, _mm_unpackhi_epi16(ab_hi, cd_hi));  // 12-15
  }
}

// out rows = (p8 . v8) * v_scale / p_sum with vpdpbusd, kBlocks blocks of 16 channels
// (compile-time, so the sums stay in registers: with a run-time count they lived on the stack
// and were zeroed by a memset per query pair, a third of the kernel). Two queries share each
// value block load; an odd last query is computed twice and stored once.
template <int kBlocks>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void weighted_values(
    const HeadScratch& s, float* out, int64_t out_stride) {
  constexpr int64_t kRows = 2;
  for (int64_t r0 = 0; r0 < s.nq; r0 += kRows) {
    int64_t rows[kRows];
    for (int64_t j = 0; j < kRows; ++j) rows[j] = std::min(r0 + j, s.nq - 1);
    __m512i acc[kRows][kBlocks];
    for (auto& per_row : acc)
      for (auto& a : per_row) a = _mm512_setzero_si512();
    for (int64_t g = 0; g < s.keys / 4; ++g) {
      __m512i pv[kRows];
      for (int64_t j = 0; j < kRows; ++j) {
        int32_t four;
        std::memcpy(&four, &s.p8[rows[j] * s.keys + 4 * g], 4);
        pv[j] = _mm512_set1_epi32(four);
      }
      for (int64_t b = 0; b < kBlocks; ++b) {
        const __m512i w = _mm512_loadu_si512(&s.v_tiles[(g * kBlocks + b) * kTile * 4]);
        for (int64_t j = 0; j < kRows; ++j) acc[j][b] = _mm512_dpbusd_epi32(acc[j][b], pv[j], w);
      }
    }
    for (int64_t j = 0; j < std::min(kRows, s.nq - r0); ++j) {
      const int64_t r = rows[j];
      const __m512 inv = _mm512_set1_ps(1.f / static_cast<float>(s.p_sum[r]));
      for (int64_t b = 0; b < kBlocks; ++b)
        _mm512_storeu_ps(out + r * out_stride + b * kTile, _mm512_mul_ps(_mm512_mul_ps(
            _mm512_cvtepi32_ps(acc[j][b]), _mm512_loadu_ps(&s.v_scale[b * kTile])), inv));
    }
  }
}

// The same with vpdpbusd (d a multiple of 16, at most 128): keys as tiles of 16 keys x 4 dims,
// values as blocks of 16 channels x 4 tokens. Four queries share each key tile load and keep
// four independent sums in flight (one dependent chain stalled on vpdpbusd's latency); a
// short last group repeats its last query and stores it once.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void attend_vnni(
    HeadScratch& s, float inv_sqrt_d, float* out, int64_t out_stride) {
  const int64_t d = s.d, groups = d / 4;
  std::fill(s.k_tiles.begin(), s.k_tiles.end(), int8_t{0});
  for (int64_t t = 0; t < s.nk; ++t)
    for (int64_t g = 0; g < groups; ++g)
      std::memcpy(&s.k_tiles[(t / kTile) * kTile * d + g * kTile * 4 + (t % kTile) * 4],
                  &s.k8[t * d + 4 * g], 4);
  constexpr int64_t kQueries = 4;
  for (int64_t t0 = 0; t0 < s.keys; t0 += kTile) {
    const int8_t* tile = &s.k_tiles[t0 * d];
    const __m512 kscale = _mm512_mul_ps(_mm512_loadu_ps(&s.k_scale[t0]),
                                        _mm512_set1_ps(inv_sqrt_d));
    const __m512i ksum = _mm512_loadu_si512(&s.k_sum[t0]);
    for (int64_t r0 = 0; r0 < s.nq; r0 += kQueries) {
      int64_t rows[kQueries];
      for (int64_t j = 0; j < kQueries; ++j) rows[j] = std::min(r0 + j, s.nq - 1);
      __m512i acc[kQueries];
      for (auto& a : acc) a = _mm512_setzero_si512();
      for (int64_t g = 0; g < groups; ++g) {
        const __m512i w = _mm512_loadu_si512(tile + g * kTile * 4);
        for (int64_t j = 0; j < kQueries; ++j) {
          int32_t four;
          std::memcpy(&four, &s.q8[rows[j] * d + 4 * g], 4);
          acc[j] = _mm512_dpbusd_epi32(acc[j], _mm512_set1_epi32(four), w);
        }
      }
      for (int64_t j = 0; j < std::min(kQueries, s.nq - r0); ++j) {
        const int64_t r = rows[j];
        const __m512i exact = _mm512_sub_epi32(acc[j], _mm512_mullo_epi32(
            _mm512_set1_epi32(s.q_zero[r]), ksum));
        _mm512_storeu_ps(&s.scores[r * s.keys + t0], _mm512_mul_ps(
            _mm512_cvtepi32_ps(exact), _mm512_mul_ps(_mm512_set1_ps(s.q_scale[r]), kscale)));
      }
    }
  }
  softmax_8bit_16(s);
  const int64_t blocks = d / kTile;
  for (int64_t t0 = 0; t0 < s.keys; t0 += 4)
    interleave_values(s.v8.data(), d, t0, s.nk, &s.v_tiles[(t0 / 4) * blocks * kTile * 4]);
  using Fn = void (*)(const HeadScratch&, float*, int64_t);
  static constexpr Fn kByBlocks[8] = {weighted_values<1>, weighted_values<2>, weighted_values<3>,
                                      weighted_values<4>, weighted_values<5>, weighted_values<6>,
                                      weighted_values<7>, weighted_values<8>};
  kByBlocks[blocks - 1](s, out, out_stride);
}

// Rows of one operand: sample b's token t starts at base + (b * tokens + t) * stride.
struct Rows {
  const float* base;
  int64_t stride, tokens;
  const float* at(int64_t b, int64_t t) const { return base + (b * tokens + t) * stride; }
};

// Row (sample b, token t) of one operand, every head RMS-normed and rotated (rot 0: none;
// gain null: copied, times mask[b * tokens + t] if given), into head-major dst (batch, heads,
// tokens, d). Reading whole rows in order keeps the hardware prefetcher ahead: a
// (sample, head) at a time reads 128 bytes per row 2 KB apart, and waited on every load.
void gather_heads(Rows src, int64_t b, int64_t t, int64_t heads, int64_t d, int64_t rot,
                  const float* gain, float eps, const float* cos, const float* sin,
                  const float* mask, float* scratch, float* dst) {
  const float none = 0.f;  // cos / sin when nothing rotates (rot 0 reads none of it)
  const float* row = src.at(b, t);
  const float m = mask ? mask[b * src.tokens + t] : 1.f;
  for (int64_t h = 0; h < heads; ++h) {
    float* out = dst + ((b * heads + h) * src.tokens + t) * d;
    if (gain)
      norm_rotate(row + h * d, gain, d, rot, eps, rot ? cos + t * rot : &none,
                  rot ? sin + t * rot : &none, scratch, out);
    else
      for (int64_t i = 0; i < d; ++i) out[i] = row[h * d + i] * m;
  }
}

// Attention of q rows over k, v rows, every (sample, head) alone: the q / k norms and rotary
// positions (rot 0: none), v times value_mask (b x nk, may be null), 8-bit operands. Two
// passes: rows to head-major floats (gather_heads), then each (sample, head) from those.
void attention_int8(Rows q, Rows k, Rows v, int64_t batch, int64_t heads, int64_t d,
                    int64_t rot, const float* q_gain, const float* k_gain, float eps,
                    const float* cos, const float* sin, const float* value_mask, float* out) {
  check(rot % 2 == 0 && rot <= d, "dit_attention: rotary channels must be even and <= head dim");
  check(d % 8 == 0 && d <= 512 && q.tokens <= 512 && k.tokens <= 512,
        "dit_attention: head dim must be a multiple of 8, head dim and tokens at most 512");
  const int64_t width = heads * d, nq = q.tokens, nk = k.tokens;
  const bool vnni = dit_attention_uses_vnni(d);
  const float inv_sqrt_d = 1.f / std::sqrt(static_cast<float>(d));
  // reused across calls (a DiT pass makes two per block): fresh pages cost ~1 ms per call
  thread_local std::vector<float> heads_buf;
  const int64_t q_size = batch * heads * nq * d, kv_size = batch * heads * nk * d;
  if (static_cast<int64_t>(heads_buf.size()) < q_size + 2 * kv_size)
    heads_buf.resize(q_size + 2 * kv_size);
  float* qh = heads_buf.data();
  float *kh = qh + q_size, *vh = kh + kv_size;
  parallel_for(batch * std::max(nq, nk), [&](int64_t r0, int64_t r1) {
    std::vector<float> scratch(d);
    const int64_t n = std::max(nq, nk);
    for (int64_t r = r0; r < r1; ++r) {  // row r: token r % n of sample r / n
      const int64_t b = r / n, t = r % n;
      if (t < nq)
        gather_heads(q, b, t, heads, d, rot, q_gain, eps, cos, sin, nullptr, scratch.data(), qh);
      if (t < nk) {
        gather_heads(k, b, t, heads, d, rot, k_gain, eps, cos, sin, nullptr, scratch.data(), kh);
        gather_heads(v, b, t, heads, d, 0, nullptr, eps, cos, sin, value_mask, scratch.data(),
                     vh);
      }
    }
  });
  parallel_for(batch * heads, [&](int64_t w0, int64_t w1) {
    HeadScratch s(nq, nk, d);
    for (int64_t w = w0; w < w1; ++w) {
      s.q = qh + w * nq * d;
      s.k = kh + w * nk * d;
      s.v = vh + w * nk * d;
      quantize_head(s);
      const int64_t b = w / heads, h = w % heads;
      float* dst = out + b * nq * width + h * d;
      if (vnni)
        attend_vnni(s, inv_sqrt_d, dst, width);
      else
        attend_float(s, inv_sqrt_d, dst, width);
    }
  });
}

}  // namespace

bool dit_attention_uses_vnni(int64_t d) { return use_vnni() && d % kTile == 0 && d <= 128; }

void dit_attention_int8(const float* qkv, int64_t batch, int64_t tokens, int64_t heads,
                        int64_t d, int64_t rot, const float* q_gain, const float* k_gain,
                        float eps, const float* cos, const float* sin, const float* value_mask,
                        float* out) {
  const int64_t width = heads * d;
  attention_int8({qkv, 3 * width, tokens}, {qkv + width, 3 * width, tokens},
                 {qkv + 2 * width, 3 * width, tokens}, batch, heads, d, rot, q_gain, k_gain, eps,
                 cos, sin, value_mask, out);
}

void dit_cross_attention_int8(const float* q, const float* kv, int64_t batch, int64_t tokens,
                              int64_t context, int64_t heads, int64_t d, const float* q_gain,
                              const float* k_gain, float eps, float* out) {
  const int64_t width = heads * d;
  attention_int8({q, width, tokens}, {kv, 2 * width, context}, {kv + width, 2 * width, context},
                 batch, heads, d, 0, q_gain, k_gain, eps, nullptr, nullptr, nullptr, out);
}

}  // namespace audiofast
