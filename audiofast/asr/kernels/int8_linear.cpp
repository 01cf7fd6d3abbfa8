// Int8 linear layers of the fused decoder, and the entry point of both kinds (quant_linear.h).
#include "quant_linear.h"

#include <atomic>
#include <new>
#include <string>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "avx2.h"
#include "pool.h"

namespace audiofast {

namespace {

// Activations in 8 bits, over each row's own range. fbgemm keeps 7 (reduce_range) so that
// AVX2's pairwise u8 x s8 sums fit int16; 8 bits cut the decoder's KL to fp32 3-5x on the
// real clips (0.0021 -> 0.0004 on endgame, measured), and the AVX2 path below splits each
// activation in two instead (see block_avx2).
constexpr int kQMax = 255;

}  // namespace

// x -> q in [0, 255] over the row's own range (0 included, so 0 stays exact).
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
  auto to_int = [&](const float* p) {  // round to nearest even, shift, clamp to [0, 255]
    const __m256i v =
        _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p), inv)), zv);
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

namespace {

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

// The same sums with AVX-512 VNNI for NB consecutive weight blocks (block i at wb + i * K *
// kBlock), sums (NB, R, 16). Integer sums are exact, so they are bit-identical to
// block_avx2's. Each broadcast activation word feeds NB blocks and each weight load R rows (a
// 4 x 4 tile: 8 loads per 16 vpdpbusd, where one block at a time needed 5 per 4); small tiles
// split K over S accumulators so that enough sums are in flight to hide vpdpbusd's latency.
template <int R, int NB>
__attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline)) inline void vnni_tile(
    const int8_t* wb, int64_t K, const uint8_t* const* x, __m512i (&total)[NB][R]) {
  constexpr int S = R * NB >= 8 ? 1 : R * NB >= 4 ? 2 : 4;
  __m512i acc[NB][R][S];
  for (auto& per_block : acc)
    for (auto& per_row : per_block)
      for (auto& a : per_row) a = _mm512_setzero_si512();
  for (int64_t g = 0; g < K / 4; g += S)
    for (int s = 0; s < S; ++s) {
      __m512i xb[R];
      for (int r = 0; r < R; ++r) {
        int32_t v;
        std::memcpy(&v, x[r] + 4 * (g + s), 4);
        xb[r] = _mm512_set1_epi32(v);
      }
      for (int b = 0; b < NB; ++b) {
        const __m512i w = _mm512_loadu_si512(wb + b * K * kBlock + (g + s) * 64);
        for (int r = 0; r < R; ++r) acc[b][r][s] = _mm512_dpbusd_epi32(acc[b][r][s], xb[r], w);
      }
    }
  for (int b = 0; b < NB; ++b)
    for (int r = 0; r < R; ++r) {
      total[b][r] = acc[b][r][0];
      for (int s = 1; s < S; ++s) total[b][r] = _mm512_add_epi32(total[b][r], acc[b][r][s]);
    }
}

// vnni_tile's sums stored (NB, R, 16).
template <int R, int NB>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void block_vnni(
    const int8_t* wb, int64_t K, const uint8_t* const* x, int32_t* sums) {
  __m512i total[NB][R];
  vnni_tile<R, NB>(wb, K, x, total);
  for (int b = 0; b < NB; ++b)
    for (int r = 0; r < R; ++r) _mm512_storeu_si512(sums + (b * R + r) * kBlock, total[b][r]);
}

// Where a tile's outputs go: row r's 16 outputs of block b at out[r] + 16 b, from
// fma(float(sum - zero_r * wsum), scale_r * scale, bias) (dequantize16's exact operations).
struct TileOut {
  const RowScale* rs;  // the tile's rows
  const int32_t* wsum;
  const float *scale, *bias;  // at the group's first output
  float* const* out;          // per row, at the group's first output
  const float* const* res;    // null, or per row: the gated residual's x and gate there
  const float* const* gate;
  bool glu_pairs;             // blocks (0, 1), (2, 3): value and gate of 16 outputs each
};

// dequantize16's operations on one accumulator of 16 sums (the same bits).
__attribute__((target("avx512f"))) inline __m512 dequantize_zmm(
    __m512i sums, RowScale q, const int32_t* wsum, const float* scale, const float* bias) {
  const __m512i exact = _mm512_sub_epi32(sums, _mm512_mullo_epi32(_mm512_set1_epi32(q.zero),
                                                                  _mm512_loadu_si512(wsum)));
  const __m512 sc = _mm512_mul_ps(_mm512_set1_ps(q.scale), _mm512_loadu_ps(scale));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), sc, _mm512_loadu_ps(bias));
}

// block_vnni with the dequantization done on the accumulators in registers, 16 outputs per
// instruction (whole blocks only): the same integers and float operations, so the same bits
// as block_vnni + dequantize16, without the sums' round trip through memory. At the DiT's
// 192 inputs the epilogue cost half as much as the products.
template <int R, int NB>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void block_vnni_out(
    const int8_t* wb, int64_t K, const uint8_t* const* x, const TileOut& o) {
  __m512i total[NB][R];
  vnni_tile<R, NB>(wb, K, x, total);
  __m512 ys[NB][R];
  for (int b = 0; b < NB; ++b)
    for (int r = 0; r < R; ++r)
      ys[b][r] = dequantize_zmm(total[b][r], o.rs[r], o.wsum + b * kBlock, o.scale + b * kBlock,
                                o.bias + b * kBlock);
  if (o.glu_pairs) {
    for (int b = 0; b + 1 < NB; b += 2)
      for (int r = 0; r < R; ++r)
        _mm512_storeu_ps(o.out[r] + b / 2 * kBlock, glu16(ys[b][r], ys[b + 1][r]));
    return;
  }
  for (int b = 0; b < NB; ++b)
    for (int r = 0; r < R; ++r) {
      __m512 y = ys[b][r];
      if (o.res)
        y = _mm512_fmadd_ps(y, _mm512_loadu_ps(o.gate[r] + b * kBlock),
                            _mm512_loadu_ps(o.res[r] + b * kBlock));
      _mm512_storeu_ps(o.out[r] + b * kBlock, y);
    }
}

using BlockOutFn = void (*)(const int8_t*, int64_t, const uint8_t* const*, const TileOut&);
template <int R>
constexpr BlockOutFn kVnniOutRow[4] = {block_vnni_out<R, 1>, block_vnni_out<R, 2>,
                                       block_vnni_out<R, 3>, block_vnni_out<R, 4>};
constexpr const BlockOutFn* kVnniOut[4] = {kVnniOutRow<1>, kVnniOutRow<2>, kVnniOutRow<3>,
                                           kVnniOutRow<4>};

// A block kernel: (weights, K, R activation rows, sums). block_vnni<R, NB> by run-time R and
// NB (1 .. 4 each) below.
using BlockFn = void (*)(const int8_t*, int64_t, const uint8_t* const*, int32_t*);
template <int R>
constexpr BlockFn kVnniRow[4] = {block_vnni<R, 1>, block_vnni<R, 2>, block_vnni<R, 3>,
                                   block_vnni<R, 4>};
constexpr const BlockFn* kVnni[4] = {kVnniRow<1>, kVnniRow<2>, kVnniRow<3>, kVnniRow<4>};

// out[j] = fma(float(sums[j] - zero * wsum[j]), scale_row * scale[j], bias[j]) for 16 outputs,
// eight at a time: the scalar tail's exact operations (int32 wrap, one rounding per fma), so
// the result is bit-identical; with many rows (the SA3 DiT) this epilogue was ~1/3 of a call.
inline void dequantize16(const int32_t* sums, RowScale q, const int32_t* wsum, const float* scale,
                         const float* bias, float* out) {
  const __m256i zero = _mm256_set1_epi32(q.zero);
  const __m256 row_scale = _mm256_set1_ps(q.scale);
  for (int h = 0; h < 16; h += 8) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wsum + h));
    const __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums + h));
    const __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(s, _mm256_mullo_epi32(zero, w)));
    const __m256 sc = _mm256_mul_ps(row_scale, _mm256_loadu_ps(scale + h));
    _mm256_storeu_ps(out + h, _mm256_fmadd_ps(v, sc, _mm256_loadu_ps(bias + h)));
  }
}

}  // namespace

bool use_vnni() {
  static const bool vnni = __builtin_cpu_supports("avx512vnni") &&
                           __builtin_cpu_supports("avx512bw") && !std::getenv("AUDIOFAST_NO_VNNI");
  return vnni;
}

namespace {

QuantLinear int8_at(const Array* p, size_t i) {
  const Array& w = p[i];
  check(w.is(kInt8, 3) && w.size(2) == 4 * kBlock && w.size(1) % 8 == 0,
        "int8 linear weights must be packed (blocks, in / 4, 64) int8 with in % 32 == 0");
  const int64_t out = p[i + 3].numel();
  check(out > 0 && (out + kBlock - 1) / kBlock == w.size(0),
        "int8 linear: the packed weight's blocks do not match the bias");
  for (size_t j = 1; j < kArraysPerLinear; ++j)
    check(p[i + j].numel() == out,
          "int8 linear scale, row sums and bias must have one value per output");
  check(p[i + 1].dtype == kFloat32 && p[i + 2].dtype == kInt32 && p[i + 3].dtype == kFloat32,
        "int8 linear scale and bias must be float32, row sums int32");
  QuantLinear L{};
  L.bits = 8;
  L.int8 = {w.ptr<int8_t>(), p[i + 1].ptr<float>(), p[i + 2].ptr<int32_t>()};
  L.bias = p[i + 3].ptr<float>();
  L.out = out;
  L.in = w.size(1) * 4;
  L.blocks = w.size(0);
  return L;
}

QuantLinear int4_at(const Array* p, size_t i) {
  const Array& w = p[i];
  const Array& scale = p[i + 1];
  check(w.size(2) == 4 * kBlock && w.ndim == 3 && w.size(1) % 4 == 0,
        "int4 linear weights must be packed (blocks, in / 8, 64) uint8 with in % 32 == 0");
  const int64_t out = p[i + 3].numel(), in = w.size(1) * 8;
  check(out > 0 && (out + kBlock - 1) / kBlock == w.size(0),
        "int4 linear: the packed weight's blocks do not match the bias");
  check(scale.is(kFloat16, 3) && scale.size(0) == w.size(0) && scale.size(2) == kBlock &&
            scale.size(1) > 0 && in % scale.size(1) == 0 && (in / scale.size(1)) % 8 == 0,
        "int4 linear scales must be (blocks, in / group, 16) float16, group a multiple of 8");
  check(p[i + 2].is(kFloat32, 1) && p[i + 2].numel() == out && p[i + 3].dtype == kFloat32,
        "int4 linear zero terms and bias must be float32, one per output");
  QuantLinear L{};
  L.bits = 4;
  L.int4 = {w.ptr<uint8_t>(), scale.ptr<uint16_t>(), p[i + 2].ptr<float>(), in / scale.size(1)};
  L.bias = p[i + 3].ptr<float>();
  L.out = out;
  L.in = in;
  L.blocks = w.size(0);
  return L;
}

}  // namespace

QuantLinear linear_at(const Array* p, size_t i) {
  return p[i].dtype == kUInt8 ? int4_at(p, i) : int8_at(p, i);
}

// y (rows, out) = L(x (rows, in)), each row quantized alone; blocks of outputs across
// threads, each block's weights read once for all rows (four at a time).
void linear(const QuantLinear& L, const float* x, int64_t rows, float* y, int64_t width) {
  if (width < 0) width = L.in;
  std::vector<uint8_t> xq(rows * L.in);
  std::vector<RowScale> rs(rows);
  auto quantize = [&](int64_t r0, int64_t r1) {
    if (width == L.in) {
      for (int64_t m = r0; m < r1; ++m) rs[m] = quantize_row(x + m * L.in, L.in, &xq[m * L.in]);
      return;
    }
    std::vector<float> padded(L.in, 0.f);  // the tail stays zero
    for (int64_t m = r0; m < r1; ++m) {
      std::memcpy(padded.data(), x + m * width, width * sizeof(float));
      rs[m] = quantize_row(padded.data(), L.in, &xq[m * L.in]);
    }
  };
  if (rows <= 4)
    quantize(0, rows);
  else
    parallel_for(rows, quantize);
  linear_quantized(L, xq, rs.data(), rows, y);
}

namespace {

// out[j] = fma(out[j], gate[j], x[j]) for j < n: the gated residual, rounded once.
void add_gated(float* out, const float* gate, const float* x, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm256_storeu_ps(out + j, _mm256_fmadd_ps(_mm256_loadu_ps(out + j), _mm256_loadu_ps(gate + j),
                                              _mm256_loadu_ps(x + j)));
  for (; j < n; ++j) out[j] = std::fma(out[j], gate[j], x[j]);
}

}  // namespace

void linear_quantized(const QuantLinear& L, std::vector<uint8_t>& xq, const RowScale* rs,
                      int64_t rows, float* y, const Epilogue& epilogue) {
  const Epilogue* residual = epilogue.x ? &epilogue : nullptr;
  const bool glu = epilogue.glu_pairs;
  check((!residual && !glu) || L.bits == 8, "linear epilogues need an int8 linear");
  check(!glu || (L.out % (2 * kBlock) == 0 && !residual),
        "a GLU epilogue needs whole pairs of output blocks and no residual");
  const int64_t width = glu ? L.out / 2 : L.out;  // of a row of y
  if (L.bits == 4) return linear_int4(L, xq.data(), rs, rows, y);
  const bool vnni = use_vnni();
  if (!vnni) {  // the AVX2 kernel reads each row split in two halves (split_row)
    std::vector<uint8_t> halves(rows * 2 * L.in);
    for (int64_t m = 0; m < rows; ++m) split_row(&xq[m * L.in], L.in, &halves[m * 2 * L.in]);
    xq.swap(halves);
  }
  const int64_t stride = vnni ? L.in : 2 * L.in;
  static constexpr BlockFn avx2[4] = {block_avx2<1>, block_avx2<2>, block_avx2<3>,
                                      block_avx2<4>};
  // Rows in panels of kPanel: a panel's activations stay in L2 while the thread's weight
  // blocks pass over them (the encoder's 1500 rows x 2048 inputs did not fit). Blocks go
  // kGroup at a time: one pass of the VNNI kernel per group and 4-row tile.
  constexpr int64_t kPanel = 128, kGroup = 4;
  const int64_t per_unit = glu ? 2 : 1;  // a GLU's pairs of blocks stay on one thread
  parallel_for(L.blocks / per_unit, [&](int64_t u0, int64_t u1) {
    const int64_t b0 = u0 * per_unit, b1 = u1 * per_unit;
    alignas(64) int32_t sums[kGroup * 4 * kBlock];
    alignas(64) float pair[4][2 * kBlock];  // per row: a GLU's value and gate off the VNNI path
    for (int64_t p0 = 0; p0 < rows; p0 += kPanel) {
      const int64_t p1 = std::min(rows, p0 + kPanel);
      for (int64_t g0 = b0; g0 < b1; g0 += kGroup) {
        const int group = static_cast<int>(std::min(kGroup, b1 - g0));
        const int8_t* wg = L.int8.weight + g0 * L.in * kBlock;
        for (int64_t m0 = p0; m0 < p1; m0 += 4) {
          const int tile = static_cast<int>(std::min<int64_t>(4, p1 - m0));
          const uint8_t* xs[4];
          for (int r = 0; r < tile; ++r) xs[r] = &xq[(m0 + r) * stride];
          const int64_t n0 = g0 * kBlock;
          float* outs[4];
          const float *res[4], *gate[4];
          for (int r = 0; r < tile; ++r) {
            outs[r] = y + (m0 + r) * width + n0 / per_unit;
            if (!residual) continue;
            res[r] = residual->x + (m0 + r) * L.out + n0;
            gate[r] = residual->gate + (m0 + r) / residual->tokens * L.out + n0;
          }
          if (vnni && n0 + group * kBlock <= L.out) {  // whole blocks: dequantized in registers
            const TileOut o{rs + m0, L.int8.wsum + n0, L.int8.scale + n0, L.bias + n0, outs,
                            residual ? res : nullptr, gate, glu};
            kVnniOut[tile - 1][group - 1](wg, L.in, xs, o);
            continue;
          }
          if (vnni)
            kVnni[tile - 1][group - 1](wg, L.in, xs, sums);
          else
            for (int b = 0; b < group; ++b)
              avx2[tile - 1](wg + b * L.in * kBlock, L.in, xs, sums + b * tile * kBlock);
          for (int b = 0; b < group; ++b) {
            const int64_t c0 = n0 + b * kBlock, n = std::min(kBlock, L.out - c0);
            for (int r = 0; r < tile; ++r) {
              const RowScale q = rs[m0 + r];
              const int32_t* block_sums = sums + (b * tile + r) * kBlock;
              float* out = glu ? pair[r] + b % 2 * kBlock : outs[r] + b * kBlock;
              if (n == kBlock)
                dequantize16(block_sums, q, L.int8.wsum + c0, L.int8.scale + c0, L.bias + c0,
                             out);
              else
                for (int64_t j = 0; j < n; ++j)  // fma: rounded once, the same on every ISA
                  out[j] = std::fma(
                      static_cast<float>(block_sums[j] - q.zero * L.int8.wsum[c0 + j]),
                      q.scale * L.int8.scale[c0 + j], L.bias[c0 + j]);
              if (residual) add_gated(out, gate[r] + b * kBlock, res[r] + b * kBlock, n);
              if (glu && b % 2 == 1)  // value and gate of these 16 outputs are both in
                for (int64_t j = 0; j < kBlock; j += 8)
                  _mm256_storeu_ps(outs[r] + b / 2 * kBlock + j,
                                   glu8(_mm256_loadu_ps(pair[r] + j),
                                        _mm256_loadu_ps(pair[r] + kBlock + j)));
            }
          }
        }
      }
    }
  });
}

// Tests only: a parallel loop over [0, n) whose slice holding index throw_at throws
// std::bad_alloc (-1: none); returns the sum of the indices. Shows a worker's exception reaching
// the caller as an error instead of ending the process.
int64_t pool_selftest(int64_t n, int64_t throw_at) {
  std::atomic<int64_t> total{0};
  parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (i == throw_at) throw std::bad_alloc();
      total += i;
    }
  });
  return total.load();
}

}  // namespace audiofast
