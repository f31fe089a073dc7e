// Small numeric helpers shared by the CPU kernels' sources, and one float32 SIMD register type.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <c10/util/BFloat16.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

// 2^f for f in [0, 1): degree-6 least-squares coefficients, highest first (error 3e-9).
constexpr float EXP2_FRACTION[] = {2.1877504771450245e-4f, 1.2387821474991664e-3f, 9.684580453165878e-3f,
                                   5.548042632518072e-2f,  2.4023050204515808e-1f, 6.931469286930156e-1f,
                                   1.0000000025868891f};
constexpr float LOG2_E = 1.4426950408889634f;

// x rounded to T's precision, as a float (the identity for float): where torch's op-by-op reference rounds.
template <typename T>
inline float round_to(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return static_cast<float>(static_cast<T>(x));
}

// 2^y for y in [-126, 127] as 2^floor(y) * p(fraction), scalar: plain arithmetic where std::exp is a libm call.
inline float exp2_bounded(float y) {
  const float n = std::floor(y), f = y - n;
  float p = EXP2_FRACTION[0];
  for (int i = 1; i < 7; ++i) p = p * f + EXP2_FRACTION[i];
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return p * two_n;
}

// fvec: one register of float32 lanes of the widest ISA the build enables (kernels.cpu_kernels.isa_flags picks
// them from the CPU's flags): AVX-512 16 lanes, AVX2 8. FVEC_WIDTH is 0 without either; callers then keep to
// their scalar loops. Only the handful of operations the kernels use, each one instruction or close to it.
#if defined(__AVX512F__)
#define FVEC_WIDTH 16
using fvec = __m512;
inline fvec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, fvec x) { _mm512_storeu_ps(p, x); }
inline fvec vset(float x) { return _mm512_set1_ps(x); }
inline fvec vzero() { return _mm512_setzero_ps(); }
inline fvec vadd(fvec a, fvec b) { return _mm512_add_ps(a, b); }
inline fvec vsub(fvec a, fvec b) { return _mm512_sub_ps(a, b); }
inline fvec vmul(fvec a, fvec b) { return _mm512_mul_ps(a, b); }
inline fvec vdiv(fvec a, fvec b) { return _mm512_div_ps(a, b); }
inline fvec vmax(fvec a, fvec b) { return _mm512_max_ps(a, b); }
inline fvec vmin(fvec a, fvec b) { return _mm512_min_ps(a, b); }
inline fvec vfmadd(fvec a, fvec b, fvec c) { return _mm512_fmadd_ps(a, b, c); }
inline fvec vfloor(fvec x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
inline fvec vscale2(fvec p, fvec n) { return _mm512_scalef_ps(p, n); }  // p * 2^n, n whole
inline float vreduce_add(fvec x) { return _mm512_reduce_add_ps(x); }
inline float vreduce_max(fvec x) { return _mm512_reduce_max_ps(x); }
// 16 bfloat16 (their raw bits) widened to float32: a bfloat16 is a float32's high half.
inline fvec vload_bf16(const uint16_t* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
// Each lane rounded to bfloat16 as c10::BFloat16 rounds (to nearest even; NaN becomes 0x7FC0): the float32 whose
// high half is the rounded bfloat16 and whose low half is zero.
inline fvec vround_bf16(fvec x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_and_si512(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))),
                                           _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u)));
  return _mm512_castsi512_ps(
      _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), rounded, _mm512_set1_epi32(0x7FC00000)));
}
inline void vstore_bf16(uint16_t* p, fvec x) {
  const __m512i high = _mm512_srli_epi32(_mm512_castps_si512(vround_bf16(x)), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(high));
}
// r[i] = the sum of v[i]'s 16 lanes, for 16 registers at once: a transpose-and-add tree of 45 instructions,
// where 16 separate horizontal reductions take about three times as many.
inline fvec vsum_lanes(const fvec* v) {
  __m512 w[8], x[4];
  for (int i = 0; i < 8; ++i)
    w[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(w[2 * i]), b = _mm512_castps_pd(w[2 * i + 1]);
    x[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  const __m512 y0 = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 y1 = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(y0, y1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(y0, y1, _MM_SHUFFLE(3, 1, 3, 1)));
}
#elif defined(__AVX2__)
#define FVEC_WIDTH 8
using fvec = __m256;
inline fvec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, fvec x) { _mm256_storeu_ps(p, x); }
inline fvec vset(float x) { return _mm256_set1_ps(x); }
inline fvec vzero() { return _mm256_setzero_ps(); }
inline fvec vadd(fvec a, fvec b) { return _mm256_add_ps(a, b); }
inline fvec vsub(fvec a, fvec b) { return _mm256_sub_ps(a, b); }
inline fvec vmul(fvec a, fvec b) { return _mm256_mul_ps(a, b); }
inline fvec vdiv(fvec a, fvec b) { return _mm256_div_ps(a, b); }
inline fvec vmax(fvec a, fvec b) { return _mm256_max_ps(a, b); }
inline fvec vmin(fvec a, fvec b) { return _mm256_min_ps(a, b); }
inline fvec vfmadd(fvec a, fvec b, fvec c) { return _mm256_fmadd_ps(a, b, c); }
inline fvec vfloor(fvec x) { return _mm256_floor_ps(x); }
inline fvec vscale2(fvec p, fvec n) {  // p * 2^n for whole n in [-126, 127]: n + 127 is 2^n's exponent field
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}
inline float vreduce_add(fvec x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline float vreduce_max(fvec x) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
// r[i] = the sum of v[i]'s 8 lanes, for 8 registers at once: two rounds of pairwise adds within each 128-bit
// half, then the halves added across.
inline fvec vsum_lanes(const fvec* v) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
inline fvec vload_bf16(const uint16_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
inline fvec vround_bf16(fvec x) {  // as the AVX-512 one
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_and_si256(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))),
                                           _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u)));
  return _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)),
                          _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}
inline void vstore_bf16(uint16_t* p, fvec x) {
  // packus works within 128-bit halves: the 64-bit quarters 0 and 2 hold the eight results, in order.
  const __m256i high = _mm256_srli_epi32(_mm256_castps_si256(vround_bf16(x)), 16);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(high, high), 0xD8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
#else
#define FVEC_WIDTH 0
#endif

#if FVEC_WIDTH
// Loads and stores of a register of T as float32, for the dtypes with a vector path (float32, bfloat16; the
// callers keep scalar loops for the others): `vround<T>` is x rounded to T's precision (round_to, a register at a
// time), so a kernel rounds where torch's op-by-op reference does, lane for lane.
template <typename T>
constexpr bool has_fvec_io = std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>;

template <typename T>
inline fvec vload_as(const T* p) {
  if constexpr (std::is_same_v<T, float>) return vload(p);
  else return vload_bf16(reinterpret_cast<const uint16_t*>(p));
}

template <typename T>
inline void vstore_as(T* p, fvec x) {
  if constexpr (std::is_same_v<T, float>) vstore(p, x);
  else vstore_bf16(reinterpret_cast<uint16_t*>(p), x);
}

template <typename T>
inline fvec vround(fvec x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return vround_bf16(x);
}

// exp2_bounded, a register at a time (y already clamped to [-126, 127]); the same operations in the same order,
// so a lane equals the scalar result.
inline fvec vexp2_bounded(fvec y) {
  const fvec n = vfloor(y), f = vsub(y, n);
  fvec p = vset(EXP2_FRACTION[0]);
  for (int i = 1; i < 7; ++i) p = vadd(vmul(p, f), vset(EXP2_FRACTION[i]));
  return vscale2(p, n);
}
#endif

// exp(x) for x <= 0 (a score minus its running max): relative error ~1e-7 (float32 rounding); -inf gives 2^-126.
inline float exp_nonpositive(float x) { return exp2_bounded(std::max(x * LOG2_E, -126.f)); }

// Attention-logit soft-capping (Gemma 2): s = cap * tanh(s / cap) over p[0..n), in HF's order of operations.
// Callers test cap > 0 first, so a model without a cap pays one predictable branch per block of scores.
inline void soft_cap(float* __restrict p, int64_t n, float cap) {
  for (int64_t t = 0; t < n; ++t) p[t] = std::tanh(p[t] / cap) * cap;
}

// Over a row's scores p[0..n) (one block's, or a whole row), with `running_max` the row's max so far: the new max, and
// p[t] replaced by exp(p[t] - max); returns their sum. A register of scores at a time, the tail one by one
// (the scalar loops do not vectorise: floor and the exponent's bit cast stay scalar).
inline float exponentiate(float* __restrict p, int64_t n, float running_max, float* new_max) {
  float max = running_max, sum = 0.f;
  int64_t t = 0;
#if FVEC_WIDTH
  fvec m = vset(running_max);
  for (; t + FVEC_WIDTH <= n; t += FVEC_WIDTH) m = vmax(m, vload(p + t));
  max = vreduce_max(m);
#endif
  for (; t < n; ++t) max = std::max(max, p[t]);
  t = 0;
#if FVEC_WIDTH
  const fvec vm = vset(max);
  fvec s = vzero();
  for (; t + FVEC_WIDTH <= n; t += FVEC_WIDTH) {
    const fvec e = vexp2_bounded(vmax(vmul(vsub(vload(p + t), vm), vset(LOG2_E)), vset(-126.f)));
    vstore(p + t, e);
    s = vadd(s, e);
  }
  sum = vreduce_add(s);
#endif
  for (; t < n; ++t) {
    p[t] = exp_nonpositive(p[t] - max);
    sum += p[t];
  }
  *new_max = max;
  return sum;
}
