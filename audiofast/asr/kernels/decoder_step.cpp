// Whisper's int8 decoder, all layers of a call in one C++ op (AVX2).
//
// The TorchScript step ran ~300 small ATen ops per token and fbgemm's int8 linears read their
// weights at ~15 GB/s, where this machine streams ~45 GB/s: a token took 8-10 ms for ~66 MB of
// weights and cross-attention K/V. Here every int8 linear is one pass over its weights, each
// weight row used for every query row while it is in L1.
//
// Every row is computed alone: its activations are quantized with its own range, the int8
// products are summed exactly in int32, attention runs per row. So a row's logits do not
// depend on how many rows share the call - a k-token draft verifies exactly as k single steps,
// which is what makes speculative decoding lossless here.
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "avx2.h"
#include "pool.h"

namespace audiofast {

namespace {

// Activations in 8 bits, over each row's own range. fbgemm keeps 7 (reduce_range) so that
// AVX2's pairwise u8 x s8 sums fit int16; 8 bits cut the decoder's KL to fp32 3-5x on the
// real clips (0.0021 -> 0.0004 on endgame, measured), and the AVX2 path below splits each
// activation in two instead (see block_avx2).
constexpr int kQMax = 255;
constexpr int kTensorsPerLinear = 4;  // packed int8 weight, scale, row sums, bias
constexpr int kTensorsPerLayer = 3 * 2 + 6 * kTensorsPerLinear;
constexpr int64_t kBlock = 16;  // outputs per packed weight block

// Weights are packed (see fused_decoder.pack_int8_weight) in blocks of 16 outputs: for each
// group of 4 inputs, 64 bytes hold those 4 weights of each of the 16 outputs. One 32-bit
// broadcast of 4 activations then multiplies all 16 outputs at once and every integer lane of
// the accumulator is one output: no horizontal sums.
struct Int8Linear {
  const int8_t* weight;  // (blocks, in / 4, 16 x 4)
  const float* scale;    // per output channel
  const int32_t* wsum;   // sum of each int8 weight row: the zero point's share of a product
  const float* bias;
  int64_t out, in, blocks;
};

struct RowScale {
  float scale;
  int32_t zero;
};

Int8Linear linear_at(const std::vector<torch::Tensor>& p, size_t i) {
  const auto& w = p[i];
  TORCH_CHECK(w.scalar_type() == torch::kChar && w.dim() == 3 && w.is_contiguous() &&
                  w.size(2) == 4 * kBlock && w.size(1) % 8 == 0,
              "int8 linear weights must be packed (blocks, in / 4, 64) int8 with in % 32 == 0");
  const int64_t out = p[i + 3].numel();
  TORCH_CHECK(out > 0 && (out + kBlock - 1) / kBlock == w.size(0),
              "int8 linear: the packed weight's blocks do not match the bias");
  for (size_t j = 1; j < kTensorsPerLinear; ++j)
    TORCH_CHECK(p[i + j].is_contiguous() && p[i + j].numel() == out,
                "int8 linear scale, row sums and bias must have one value per output");
  return {w.data_ptr<int8_t>(), p[i + 1].data_ptr<float>(), p[i + 2].data_ptr<int32_t>(),
          p[i + 3].data_ptr<float>(), out, w.size(1) * 4, w.size(0)};
}

// x -> q in [0, 127] over the row's own range (0 included, so 0 stays exact).
RowScale quantize_row(const float* x, int64_t n, uint8_t* q) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (int64_t k = 0; k < n; k += 8) {
    const __m256 v = _mm256_loadu_ps(x + k);
    lo = _mm256_min_ps(lo, v);
    hi = _mm256_max_ps(hi, v);
  }
  float los[8], his[8];
  _mm256_storeu_ps(los, lo);
  _mm256_storeu_ps(his, hi);
  const float low = *std::min_element(los, los + 8), high = *std::max_element(his, his + 8);
  float scale = (high - low) / kQMax;
  if (!(scale > 0.f)) scale = 1.f;  // an all-zero row
  const int32_t zero = std::clamp(static_cast<int32_t>(std::nearbyint(-low / scale)), 0, kQMax);
  const __m256 inv = _mm256_set1_ps(1.f / scale);
  const __m256i zv = _mm256_set1_epi32(zero), qmax = _mm256_set1_epi32(kQMax);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  auto to_int = [&](const float* p) {  // round to nearest even, shift, clamp to [0, 127]
    const __m256i v = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p), inv)), zv);
    return _mm256_min_epi32(_mm256_max_epi32(v, _mm256_setzero_si256()), qmax);
  };
  for (int64_t k = 0; k < n; k += 32) {
    const __m256i ab = _mm256_packs_epi32(to_int(x + k), to_int(x + k + 8));
    const __m256i cd = _mm256_packs_epi32(to_int(x + k + 16), to_int(x + k + 24));
    const __m256i packed = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k), packed);
  }
  return {scale, zero};
}

inline __m256i bcast4(const uint8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return _mm256_set1_epi32(v);
}

// Each row's activations for the AVX2 path: x = 2 * (x >> 1) + (x & 1), halves side by side
// (K bytes of x >> 1, then K bytes of x & 1): a pair of 7-bit x s8 products fits the int16
// that _mm256_maddubs_epi16 sums into, where a pair of 8-bit ones could saturate.
void split_row(const uint8_t* q, int64_t n, uint8_t* out) {
  const __m256i low7 = _mm256_set1_epi8(0x7f), one = _mm256_set1_epi8(1);
  for (int64_t k = 0; k < n; k += 32) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + k));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k),
                        _mm256_and_si256(_mm256_srli_epi16(v, 1), low7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + n + k), _mm256_and_si256(v, one));
  }
}

// sums (R, 16) of one weight block against R split rows (AVX2: maddubs makes pairs, madd
// adds pairs of pairs, times 2 for the high halves). Exact: the same integers as VNNI's.
template <int R>
void block_avx2(const int8_t* wb, int64_t K, const uint8_t* const* x, int32_t* sums) {
  const __m256i ones = _mm256_set1_epi16(1), twos = _mm256_set1_epi16(2);
  __m256i lo[R], hi[R];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_si256();
  auto dot = [&](__m256i acc, __m256i high, __m256i low, __m256i w) {
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(high, w), twos));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(low, w), ones));
  };
  for (int64_t g = 0; g < K / 4; ++g) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + g * 64));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + g * 64 + 32));
    for (int r = 0; r < R; ++r) {
      const __m256i high = bcast4(x[r] + 4 * g), low = bcast4(x[r] + K + 4 * g);
      lo[r] = dot(lo[r], high, low, w0);
      hi[r] = dot(hi[r], high, low, w1);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sums + r * kBlock), lo[r]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sums + r * kBlock + 8), hi[r]);
  }
}

// The same sums with AVX-512 VNNI, one instruction per 64 byte products. Integer sums are
// exact, so they are bit-identical to block_avx2's; four accumulators per row hide
// vpdpbusd's latency.
template <int R>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void block_vnni(
    const int8_t* wb, int64_t K, const uint8_t* const* x, int32_t* sums) {
  __m512i acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_si512();
  for (int64_t g = 0; g < K / 4; g += 4)
    for (int j = 0; j < 4; ++j) {
      const __m512i w = _mm512_loadu_si512(wb + (g + j) * 64);
      for (int r = 0; r < R; ++r) {
        int32_t v;
        std::memcpy(&v, x[r] + 4 * (g + j), 4);
        acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], _mm512_set1_epi32(v), w);
      }
    }
  for (int r = 0; r < R; ++r)
    _mm512_storeu_si512(sums + r * kBlock,
                        _mm512_add_epi32(_mm512_add_epi32(acc[r][0], acc[r][1]),
                                         _mm512_add_epi32(acc[r][2], acc[r][3])));
}

bool use_vnni() {
  static const bool vnni = __builtin_cpu_supports("avx512vnni") &&
                           __builtin_cpu_supports("avx512bw") && !std::getenv("AUDIOFAST_NO_VNNI");
  return vnni;
}

// y (rows, out) = L(x (rows, in)), each row quantized alone; blocks of outputs across
// threads, each block's weights read once for all rows (four at a time).
void linear(const Int8Linear& L, const float* x, int64_t rows, float* y) {
  std::vector<uint8_t> xq(rows * L.in);
  std::vector<RowScale> rs(rows);
  auto quantize = [&](int64_t r0, int64_t r1) {
    for (int64_t m = r0; m < r1; ++m) rs[m] = quantize_row(x + m * L.in, L.in, &xq[m * L.in]);
  };
  if (rows <= 4)
    quantize(0, rows);
  else
    pool().run(rows, quantize);
  const bool vnni = use_vnni();
  if (!vnni) {  // the AVX2 kernel reads each row split in two halves (split_row)
    std::vector<uint8_t> halves(rows * 2 * L.in);
    for (int64_t m = 0; m < rows; ++m) split_row(&xq[m * L.in], L.in, &halves[m * 2 * L.in]);
    xq.swap(halves);
  }
  const int64_t stride = vnni ? L.in : 2 * L.in;
  using Block = void (*)(const int8_t*, int64_t, const uint8_t* const*, int32_t*);
  static constexpr Block avx2[4] = {block_avx2<1>, block_avx2<2>, block_avx2<3>, block_avx2<4>};
  static constexpr Block vnni512[4] = {block_vnni<1>, block_vnni<2>, block_vnni<3>,
                                       block_vnni<4>};
  pool().run(L.blocks, [&](int64_t b0, int64_t b1) {
    alignas(64) int32_t sums[4 * kBlock];
    for (int64_t b = b0; b < b1; ++b) {
      const int8_t* wb = L.weight + b * L.in * kBlock;
      const int64_t n0 = b * kBlock, width = std::min(kBlock, L.out - n0);
      for (int64_t m0 = 0; m0 < rows; m0 += 4) {
        const int tile = static_cast<int>(std::min<int64_t>(4, rows - m0));
        const uint8_t* xs[4];
        for (int r = 0; r < tile; ++r) xs[r] = &xq[(m0 + r) * stride];
        (vnni ? vnni512 : avx2)[tile - 1](wb, L.in, xs, sums);
        for (int r = 0; r < tile; ++r) {
          const RowScale q = rs[m0 + r];
          float* out = y + (m0 + r) * L.out + n0;
          for (int64_t j = 0; j < width; ++j)  // fma: rounded once, the same on every ISA
            out[j] = std::fma(static_cast<float>(sums[r * kBlock + j] - q.zero * L.wsum[n0 + j]),
                              q.scale * L.scale[n0 + j], L.bias[n0 + j]);
        }
      }
    }
  });
}

void layer_norm(const float* x, const torch::Tensor& weight, const torch::Tensor& bias,
                int64_t rows, int64_t d, float* out) {
  const float* w = weight.data_ptr<float>();
  const float* b = bias.data_ptr<float>();
  for (int64_t m = 0; m < rows; ++m) {
    const float* r = x + m * d;
    float* o = out + m * d;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < d; ++i) mean += r[i];
    mean /= d;
    for (int64_t i = 0; i < d; ++i) var += (r[i] - mean) * (r[i] - mean);
    const float inv = static_cast<float>(1.0 / std::sqrt(var / d + 1e-5));
    for (int64_t i = 0; i < d; ++i) o[i] = static_cast<float>(r[i] - mean) * inv * w[i] + b[i];
  }
}

// Where a row of a call lives: one sequence at consecutive positions (a prompt, a verified
// draft), or - with several cached sequences - row m is sequence m, all at one position
// (best_of samples decoded side by side).
struct Rows {
  int64_t start, sequences;
  int64_t sequence(int64_t m) const { return sequences > 1 ? m : 0; }
  int64_t position(int64_t m) const { return sequences > 1 ? start : start + m; }
};

// Causal self-attention of each row over its sequence's cache (keys 0 .. its position).
void self_attention(const float* qkv, int64_t rows, const Rows& at, int64_t heads,
                    const float* k_cache, const float* v_cache, int64_t n_ctx, float* out) {
  const int64_t d = heads * kHeadDim, per_sequence = heads * n_ctx * kHeadDim;
  pool().run(rows * heads, [&](int64_t t0, int64_t t1) {
    std::vector<float> scores(n_ctx + 8);
    alignas(32) float q[kHeadDim];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t m = t / heads, h = t % heads;
      const int64_t offset = at.sequence(m) * per_sequence + h * n_ctx * kHeadDim;
      for (int64_t i = 0; i < kHeadDim; ++i) q[i] = qkv[m * 3 * d + h * kHeadDim + i] * 0.125f;
      attend(q, k_cache + offset, v_cache + offset, at.position(m) + 1, scores.data(),
             out + m * d + h * kHeadDim);
    }
  });
}

// Each row's attention over the window's fp16 cross-attention K/V (q already scaled).
void cross_attention_rows(const float* q, int64_t rows, int64_t heads, const torch::Tensor& keys,
                          const torch::Tensor& values, float* out) {
  TORCH_CHECK(keys.scalar_type() == torch::kHalf && values.scalar_type() == torch::kHalf &&
                  keys.is_contiguous() && values.is_contiguous() && keys.size(0) == heads &&
                  keys.size(2) == kHeadDim && keys.sizes() == values.sizes(),
              "cross-attention K/V must be contiguous (heads, frames, 64) float16");
  const int64_t frames = keys.size(1), d = heads * kHeadDim;
  const auto* k = reinterpret_cast<const uint16_t*>(keys.data_ptr<at::Half>());
  const auto* v = reinterpret_cast<const uint16_t*>(values.data_ptr<at::Half>());
  pool().run(rows * heads, [&](int64_t t0, int64_t t1) {
    std::vector<float> scores(frames + 8);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t m = t / heads, h = t % heads;
      attend(q + m * d + h * kHeadDim, k + h * frames * kHeadDim, v + h * frames * kHeadDim,
             frames, scores.data(), out + m * d + h * kHeadDim);
    }
  });
}

}  // namespace

// tokens (rows,) at positions start .. start + rows - 1 through every layer (or, with a cache
// of several sequences, one token per sequence at position start); logits (last rows only
// when last > 0) with the top `rescore` of each row recomputed from the fp32 head.
torch::Tensor decoder_forward(torch::Tensor tokens, int64_t start, int64_t last,
                              std::vector<torch::Tensor> params, torch::Tensor k_cache,
                              torch::Tensor v_cache, std::vector<torch::Tensor> cross_k,
                              std::vector<torch::Tensor> cross_v, int64_t rescore) {
  const auto& embed = params[0];
  const auto& positions = params[1];
  const int64_t d = embed.size(1), rows = tokens.size(0), layers = k_cache.size(0);
  const int64_t sequences = k_cache.size(1), heads = k_cache.size(2), n_ctx = k_cache.size(3);
  const Rows at{start, sequences};
  TORCH_CHECK(tokens.dim() == 1 && tokens.scalar_type() == torch::kLong && rows > 0,
              "tokens must be a non-empty 1-D int64 tensor");
  TORCH_CHECK(sequences == 1 || rows == sequences,
              "with several cached sequences, give one token per sequence");
  TORCH_CHECK(start >= 0 && at.position(rows - 1) < n_ctx, "positions exceed the decoder context");
  TORCH_CHECK(heads * kHeadDim == d && d % 32 == 0, "model width must be heads x 64");
  TORCH_CHECK(params.size() == 9 + layers * kTensorsPerLayer && cross_k.size() == layers &&
                  cross_v.size() == layers && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "decoder_forward: parameters do not match the cache's layer count");
  const int64_t* ids = tokens.data_ptr<int64_t>();
  auto x = torch::empty({rows, d});
  float* xp = x.data_ptr<float>();
  for (int64_t m = 0; m < rows; ++m) {
    TORCH_CHECK(ids[m] >= 0 && ids[m] < embed.size(0), "token id out of the vocabulary");
    const float* e = embed.data_ptr<float>() + ids[m] * d;
    const float* pos = positions.data_ptr<float>() + at.position(m) * d;
    for (int64_t i = 0; i < d; ++i) xp[m * d + i] = e[i] + pos[i];
  }
  const int64_t ff = params[9 + 25].numel();  // fc1 bias: its output width
  std::vector<float> normed(rows * d), qkv(rows * 3 * d), attn(rows * d), y(rows * d),
      hidden(rows * ff);
  for (int64_t l = 0; l < layers; ++l) {
    const size_t base = 9 + l * kTensorsPerLayer;
    const auto qkv_proj = linear_at(params, base + 2), self_out = linear_at(params, base + 6);
    const auto cross_q = linear_at(params, base + 12), cross_out = linear_at(params, base + 16);
    const auto fc1 = linear_at(params, base + 22), fc2 = linear_at(params, base + 26);
    const int64_t per_sequence = heads * n_ctx * kHeadDim;
    float* kc = k_cache.data_ptr<float>() + l * sequences * per_sequence;
    float* vc = v_cache.data_ptr<float>() + l * sequences * per_sequence;

    layer_norm(xp, params[base], params[base + 1], rows, d, normed.data());
    linear(qkv_proj, normed.data(), rows, qkv.data());
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t slot =
            at.sequence(m) * per_sequence + (h * n_ctx + at.position(m)) * kHeadDim;
        std::copy_n(&qkv[m * 3 * d + d + h * kHeadDim], kHeadDim, kc + slot);
        std::copy_n(&qkv[m * 3 * d + 2 * d + h * kHeadDim], kHeadDim, vc + slot);
      }
    self_attention(qkv.data(), rows, at, heads, kc, vc, n_ctx, attn.data());
    linear(self_out, attn.data(), rows, y.data());
    for (int64_t i = 0; i < rows * d; ++i) xp[i] += y[i];

    layer_norm(xp, params[base + 10], params[base + 11], rows, d, normed.data());
    linear(cross_q, normed.data(), rows, y.data());
    for (int64_t i = 0; i < rows * d; ++i) y[i] *= 0.125f;  // 1 / sqrt(64), exact
    cross_attention_rows(y.data(), rows, heads, cross_k[l], cross_v[l], attn.data());
    linear(cross_out, attn.data(), rows, y.data());
    for (int64_t i = 0; i < rows * d; ++i) xp[i] += y[i];

    layer_norm(xp, params[base + 20], params[base + 21], rows, d, normed.data());
    linear(fc1, normed.data(), rows, hidden.data());
    gelu(hidden.data(), rows * ff);
    linear(fc2, hidden.data(), rows, y.data());
    for (int64_t i = 0; i < rows * d; ++i) xp[i] += y[i];
  }
  const int64_t out_rows = last > 0 ? std::min(last, rows) : rows;
  const float* tail = xp + (rows - out_rows) * d;
  layer_norm(tail, params[2], params[3], out_rows, d, normed.data());
  const auto head = linear_at(params, 4);
  auto logits = torch::empty({out_rows, head.out});
  linear(head, normed.data(), out_rows, logits.data_ptr<float>());
  const auto& exact = params[8];
  if (rescore > 0 && exact.numel() > 0) {
    // The int8 head's top candidates, exactly: near-ties among them decide words.
    const auto top = std::get<1>(logits.topk(std::min(rescore, head.out), 1));
    const auto ids_top = top.accessor<int64_t, 2>();
    float* lp = logits.data_ptr<float>();
    for (int64_t m = 0; m < out_rows; ++m)
      for (int64_t j = 0; j < top.size(1); ++j) {
        const int64_t id = ids_top[m][j];
        lp[m * head.out + id] = dot(exact.data_ptr<float>() + id * d, &normed[m * d], d);
      }
  }
  return logits;
}

// One int8 linear on (rows, in) float32 rows: what decoder_forward runs for each projection.
torch::Tensor int8_linear(torch::Tensor x, std::vector<torch::Tensor> linear_tensors) {
  TORCH_CHECK(linear_tensors.size() == kTensorsPerLinear,
              "int8_linear takes (weight, scale, row sums, bias)");
  const auto L = linear_at(linear_tensors, 0);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == L.in && x.scalar_type() == torch::kFloat,
              "x must be (rows, in) float32");
  x = x.contiguous();
  auto y = torch::empty({x.size(0), L.out});
  linear(L, x.data_ptr<float>(), x.size(0), y.data_ptr<float>());
  return y;
}

}  // namespace audiofast

TORCH_LIBRARY_FRAGMENT(audiofast, m) {
  m.def("int8_linear(Tensor x, Tensor[] linear) -> Tensor", audiofast::int8_linear);
  m.def("decoder_forward(Tensor tokens, int start, int last, Tensor[] params, Tensor k_cache, "
        "Tensor v_cache, Tensor[] cross_k, Tensor[] cross_v, int rescore) -> Tensor",
        audiofast::decoder_forward);
}
