// The MLP's activation in one pass: out = act(gate) * up, for x = [gate | up] (the fused gate_up output,
// [tokens, 2 * inter], last dim contiguous) into a new [tokens, inter]. act(g) in float32 and rounded to x's dtype,
// then the product rounded, where torch's `F.silu(gate) * up` rounds. Both activations are g / (1 + exp(-z)):
// silu with z = g; Gemma's tanh GELU, 0.5 g (1 + tanh(y)) with y = sqrt(2 / pi) (g + 0.044715 g^3), is exactly
// that with z = 2y (1 + tanh(y) = 2 / (1 + exp(-2y))), so no tanh is needed. exp is a polynomial (relative error
// ~1e-7, like torch's vectorised one), so float32 results agree with torch's to rounding.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cpu_math.h"

namespace {

// g / (1 + exp(-z)), exp(-z) = 2^y with y clamped to where 2^y is a normal float (past it the result is g or 0 to
// float precision anyway).
inline float gated(float g, float z) { return g / (1.f + exp2_bounded(std::min(std::max(-z * LOG2_E, -126.f), 127.f))); }

constexpr float GELU_2_BETA = 1.5957691216057308f;  // 2 sqrt(2 / pi)
constexpr float GELU_KAPPA = 0.044715f;

struct Silu {
  static float apply(float g) { return gated(g, g); }
#if FVEC_WIDTH
  static fvec apply(fvec g) {
    const fvec y = vmin(vmax(vmul(g, vset(-LOG2_E)), vset(-126.f)), vset(127.f));
    return vdiv(g, vadd(vset(1.f), vexp2_bounded(y)));
  }
#endif
};

struct GeluTanh {
  static float apply(float g) { return gated(g, GELU_2_BETA * (g + GELU_KAPPA * g * g * g)); }
#if FVEC_WIDTH
  static fvec apply(fvec g) {
    const fvec z = vmul(vset(GELU_2_BETA), vadd(g, vmul(vset(GELU_KAPPA), vmul(g, vmul(g, g)))));
    const fvec y = vmin(vmax(vmul(z, vset(-LOG2_E)), vset(-126.f)), vset(127.f));
    return vdiv(g, vadd(vset(1.f), vexp2_bounded(y)));
  }
#endif
};

template <typename T, typename Act>
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
#if FVEC_WIDTH
      if constexpr (has_fvec_io<T>) {  // act rounded to T, then the product rounded (vstore_as), as the reference
        for (; i + FVEC_WIDTH <= inter; i += FVEC_WIDTH)
          vstore_as(o + i, vmul(vround<T>(Act::apply(vload_as(gate + i))), vload_as(up + i)));
      }
#endif
      for (; i < inter; ++i)
        o[i] = static_cast<T>(round_to<T>(Act::apply(static_cast<float>(gate[i]))) * static_cast<float>(up[i]));
    }
  });
}

template <typename Act>
torch::Tensor activate_and_mul(const torch::Tensor& x, const char* name) {
  auto out = torch::empty({x.size(0), x.size(1) / 2}, x.options());
  switch (x.scalar_type()) {
    case at::kFloat: activate<float, Act>(out, x); break;
    case at::kBFloat16: activate<c10::BFloat16, Act>(out, x); break;
    case at::kHalf: activate<c10::Half, Act>(out, x); break;
    default: TORCH_CHECK(false, name, " (CPU) supports float32, bfloat16 and float16, got ", x.scalar_type());
  }
  return out;
}

}  // namespace

// Shapes and dtypes are checked by the Python caller (kernels.cpu_kernels.silu_and_mul, gelu_tanh_and_mul).
torch::Tensor silu_and_mul(torch::Tensor x) { return activate_and_mul<Silu>(x, "silu_and_mul"); }
torch::Tensor gelu_tanh_and_mul(torch::Tensor x) { return activate_and_mul<GeluTanh>(x, "gelu_tanh_and_mul"); }
