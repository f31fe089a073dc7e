// The MLP's activation in one pass: out = silu(gate) * up, for x = [gate | up] (the fused gate_up output,
// [tokens, 2 * inter], last dim contiguous) into a new [tokens, inter]. silu(g) = g / (1 + exp(-g)) in float32
// and rounded to x's dtype, then the product rounded, where torch's `F.silu(gate) * up` rounds; exp is a
// polynomial (relative error ~1e-7, like torch's vectorised one), so float32 results agree to rounding.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cpu_math.h"

namespace {

constexpr const float* P = EXP2_FRACTION;

inline float silu(float g) {
  const float y = std::min(std::max(-g * 1.4426950408889634f, -126.f), 127.f);  // exp(-g) = 2^y
  const float n = std::floor(y), f = y - n;
  float p = P[0];
  for (int i = 1; i < 7; ++i) p = p * f + P[i];
  return g / (1.f + std::ldexp(p, static_cast<int>(n)));
}

#ifdef __AVX512F__
inline __m512 silu16(__m512 g) {
  const __m512 y = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(g, _mm512_set1_ps(-1.4426950408889634f)),
                                               _mm512_set1_ps(-126.f)), _mm512_set1_ps(127.f));
  const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(y, n);
  __m512 p = _mm512_set1_ps(P[0]);
  for (int i = 1; i < 7; ++i) p = _mm512_add_ps(_mm512_mul_ps(p, f), _mm512_set1_ps(P[i]));
  return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), _mm512_scalef_ps(p, n)));
}
#endif

template <typename T>
void activate(torch::Tensor out, const torch::Tensor& x) {
  const int64_t tokens = x.size(0), inter = x.size(1) / 2, stride = x.stride(0);
  const T* src = x.data_ptr<T>();
  T* dst = out.data_ptr<T>();
  at::parallel_for(0, tokens, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* gate = src + t * stride;
      const T* up = gate + inter;
      T* o = dst + t * inter;
      int64_t i = 0;
#ifdef __AVX512F__
      if constexpr (std::is_same_v<T, float>) {
        for (; i + 16 <= inter; i += 16)
          _mm512_storeu_ps(o + i, _mm512_mul_ps(silu16(_mm512_loadu_ps(gate + i)), _mm512_loadu_ps(up + i)));
      } else {
        alignas(64) float g[16], s[16];
        for (; i + 16 <= inter; i += 16) {
          for (int k = 0; k < 16; ++k) g[k] = static_cast<float>(gate[i + k]);
          _mm512_store_ps(s, silu16(_mm512_load_ps(g)));
          for (int k = 0; k < 16; ++k)
            o[i + k] = static_cast<T>(round_to<T>(s[k]) * static_cast<float>(up[i + k]));
        }
      }
#endif
      for (; i < inter; ++i)
        o[i] = static_cast<T>(round_to<T>(silu(static_cast<float>(gate[i]))) * static_cast<float>(up[i]));
    }
  });
}

}  // namespace

// Shapes and dtypes are checked by the Python caller (kernels.cpu_kernels.silu_and_mul).
torch::Tensor silu_and_mul(torch::Tensor x) {
  auto out = torch::empty({x.size(0), x.size(1) / 2}, x.options());
  switch (x.scalar_type()) {
    case at::kFloat: activate<float>(out, x); break;
    case at::kBFloat16: activate<c10::BFloat16>(out, x); break;
    case at::kHalf: activate<c10::Half>(out, x); break;
    default: TORCH_CHECK(false, "silu_and_mul (CPU) supports float32, bfloat16 and float16, got ", x.scalar_type());
  }
  return out;
}
