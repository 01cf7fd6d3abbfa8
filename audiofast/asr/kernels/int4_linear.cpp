// Int4 linear layers of the fused decoder (layout in quant_linear.h). Half the bytes of int8 per
// weight: the decoder step is memory-bound, so bytes read per token are what a token costs.
//
// Per block of 16 outputs and per group of inputs the products are summed exactly in int32
// (activations u8, weights s4 widened to s8), then each group's sums are scaled by its fp16
// scales into float accumulators. The float steps are one shared routine, so the AVX2 and
// AVX-512 VNNI paths (which produce the same integers) give bit-identical outputs.
#include <algorithm>
#include <cstring>
#include <vector>

#include "avx2.h"
#include "pool.h"
#include "quant_linear.h"

namespace audiofast {

namespace {

inline __m256i bcast4(const uint8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return _mm256_set1_epi32(v);
}

// One block of 16 outputs for R rows: for each group, exact int32 sums of q . u (u the stored
// nibble, w + 8, in [0, 15]: a valid s8 operand, so no widening step), minus 8 x the group's
// activation sum (exact: the w = u - 8 correction), then acc += float(sums) x the group's
// scales. Float accumulators stay in registers across groups; per lane the float operations
// are the same on both paths (cvt, fma in group order), so the outputs are bit-identical.
//
// AVX2: a maddubs pair of u8 x [0, 15] products is at most 2 x 255 x 15 = 7650, so two pairs
// summed in int16 (15300) cannot saturate.
template <int R>
void block_avx2(const uint8_t* wb, const uint16_t* scales, int64_t groups, int64_t pairs,
                const uint8_t* const* x, const int32_t* const* qsum, float* acc_out) {
  const __m256i nibble = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g, wb += pairs * 64) {
    __m256i lo[R], hi[R];  // outputs 0-7, 8-15
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_si256();
    for (int64_t p = 0; p < pairs; ++p) {
      const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + p * 64));
      const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + p * 64 + 32));
      const __m256i a0 = _mm256_and_si256(v0, nibble);
      const __m256i b0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), nibble);
      const __m256i a1 = _mm256_and_si256(v1, nibble);
      const __m256i b1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), nibble);
      for (int r = 0; r < R; ++r) {
        const uint8_t* xr = x[r] + g * pairs * 8 + 8 * p;
        const __m256i xa = bcast4(xr), xb = bcast4(xr + 4);
        const __m256i s0 =
            _mm256_add_epi16(_mm256_maddubs_epi16(xa, a0), _mm256_maddubs_epi16(xb, b0));
        const __m256i s1 =
            _mm256_add_epi16(_mm256_maddubs_epi16(xa, a1), _mm256_maddubs_epi16(xb, b1));
        lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(s0, ones));
        hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(s1, ones));
      }
    }
    const __m256 s0 = load8(scales + g * kBlock), s1 = load8(scales + g * kBlock + 8);
    for (int r = 0; r < R; ++r) {
      const __m256i offset = _mm256_set1_epi32(8 * qsum[r][g]);
      acc[r][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(lo[r], offset)), s0,
                                  acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(hi[r], offset)), s1,
                                  acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(acc_out + r * kBlock, acc[r][0]);
    _mm256_storeu_ps(acc_out + r * kBlock + 8, acc[r][1]);
  }
}

// The same block with AVX-512 VNNI: one 64-byte load and two dpbusd per row per 8 inputs.
template <int R>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void block_vnni(
    const uint8_t* wb, const uint16_t* scales, int64_t groups, int64_t pairs,
    const uint8_t* const* x, const int32_t* const* qsum, float* acc_out) {
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g, wb += pairs * 64) {
    __m512i lo[R], hi[R];  // low- and high-nibble inputs
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm512_setzero_si512();
    for (int64_t p = 0; p < pairs; ++p) {
      const __m512i v = _mm512_loadu_si512(wb + p * 64);
      const __m512i a = _mm512_and_si512(v, nibble);
      const __m512i b = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
      for (int r = 0; r < R; ++r) {
        int32_t xa, xb;
        std::memcpy(&xa, x[r] + g * pairs * 8 + 8 * p, 4);
        std::memcpy(&xb, x[r] + g * pairs * 8 + 8 * p + 4, 4);
        lo[r] = _mm512_dpbusd_epi32(lo[r], _mm512_set1_epi32(xa), a);
        hi[r] = _mm512_dpbusd_epi32(hi[r], _mm512_set1_epi32(xb), b);
      }
    }
    const __m512 s = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + g * kBlock)));
    for (int r = 0; r < R; ++r) {
      const __m512i sums = _mm512_sub_epi32(_mm512_add_epi32(lo[r], hi[r]),
                                            _mm512_set1_epi32(8 * qsum[r][g]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), s, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(acc_out + r * kBlock, acc[r]);
}

}  // namespace

// x ~ xs (q - z), so row . w = xs (sum_g s_g (q . w4)_g - z sum_g s_g sum(w4_g)): the second sum
// is the packed zero term, fixed per output.
void linear_int4(const QuantLinear& L, const uint8_t* q, const RowScale* rs, int64_t rows,
                 float* y) {
  const Int4Weights& W = L.int4;
  const int64_t groups = L.in / W.group, pairs = W.group / 8;
  std::vector<int32_t> qsum(rows * groups, 0);  // each row's activation sum per group
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t k = 0; k < L.in; ++k) qsum[m * groups + k / W.group] += q[m * L.in + k];
  using Block = void (*)(const uint8_t*, const uint16_t*, int64_t, int64_t,
                         const uint8_t* const*, const int32_t* const*, float*);
  static constexpr Block avx2[4] = {block_avx2<1>, block_avx2<2>, block_avx2<3>, block_avx2<4>};
  static constexpr Block vnni512[4] = {block_vnni<1>, block_vnni<2>, block_vnni<3>,
                                       block_vnni<4>};
  const Block* kernel = use_vnni() ? vnni512 : avx2;
  parallel_for(L.blocks, [&](int64_t b0, int64_t b1) {
    alignas(64) float acc[4 * kBlock];
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* wb = W.weight + b * (L.in / 8) * 64;
      const uint16_t* scales = W.scale + b * groups * kBlock;
      const int64_t n0 = b * kBlock, width = std::min(kBlock, L.out - n0);
      for (int64_t m0 = 0; m0 < rows; m0 += 4) {
        const int tile = static_cast<int>(std::min<int64_t>(4, rows - m0));
        const uint8_t* xs[4];
        const int32_t* sums[4];
        for (int r = 0; r < tile; ++r) {
          xs[r] = q + (m0 + r) * L.in;
          sums[r] = &qsum[(m0 + r) * groups];
        }
        kernel[tile - 1](wb, scales, groups, pairs, xs, sums, acc);
        for (int r = 0; r < tile; ++r) {
          const RowScale s = rs[m0 + r];
          float* out = y + (m0 + r) * L.out + n0;
          for (int64_t j = 0; j < width; ++j)  // xs (acc - z Z) + bias, rounded alike everywhere
            out[j] = std::fma(std::fma(-static_cast<float>(s.zero), W.zero_term[n0 + j],
                                       acc[r * kBlock + j]),
                              s.scale, L.bias[n0 + j]);
        }
      }
    }
  });
}

}  // namespace audiofast
