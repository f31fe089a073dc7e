// The MLP's activation in one pass: out = silu(gate) * up, for x = [gate | up] (the fused gate_up output,
// [tokens, 2 * inter], last dim contiguous) into a new [tokens, inter]. silu(g) = g / (1 + exp(-g)) in float32
// and rounded to x's dtype, then the product rounded, where torch's `F.silu(gate) * up` rounds; exp is a
// polynomial (relative error ~1e-7, like torch's vectorised one), so float32 results agree to rounding.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cpu_math.h"

namespace {

// exp(-g) = 2^y, y clamped to where 2^y is a normal float (past it silu is g or 0 to float precision anyway).
inline float silu(float g) { return g / (1.f + exp2_bounded(std::min(std::max(-g * LOG2_E, -126.f), 127.f))); }

#if FVEC_WIDTH
inline fvec vsilu(fvec g) {
  const fvec y = vmin(vmax(vmul(g, vset(-LOG2_E)), vset(-126.f)), vset(127.f));
  return vdiv(g, vadd(vset(1.f), vexp2_bounded(y)));
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
#if FVEC_WIDTH
      if constexpr (has_fvec_io<T>) {  // silu rounded to T, then the product rounded (vstore_as), as the reference
        for (; i + FVEC_WIDTH <= inter; i += FVEC_WIDTH)
          vstore_as(o + i, vmul(vround<T>(vsilu(vload_as(gate + i))), vload_as(up + i)));
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
