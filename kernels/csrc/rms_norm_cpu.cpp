// RMSNorm in one pass over each row, as HF Llama computes it: y = w * to_dtype(x * rsqrt(mean(x^2) + eps)),
// the mean and the scaling in float32, then the cast to x's dtype, then the weight (in x's dtype: rounded
// where torch's op-by-op reference rounds), a register at a time in float32 and bfloat16. Only the order of the
// sum of squares differs from torch's (a vectorised sum), so results agree to rounding, not bit for bit (the HF
// oracle tests decide).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>

#include "cpu_math.h"

namespace {

template <typename T>
void normalise(torch::Tensor out, const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const int64_t rows = x.size(0), n = x.size(1), stride = x.stride(0);
  const T* src = x.data_ptr<T>();
  const T* w = weight.data_ptr<T>();
  T* dst = out.data_ptr<T>();
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* row = src + r * stride;
      T* o = dst + r * n;
      int64_t d = 0;
      float sum = 0.f;
#if FVEC_WIDTH
      if constexpr (has_fvec_io<T>) {  // a register at a time; the bfloat16 rounding too (vround)
        fvec squares = vzero();
        for (; d + FVEC_WIDTH <= n; d += FVEC_WIDTH) {
          const fvec v = vload_as(row + d);
          squares = vfmadd(v, v, squares);
        }
        sum = vreduce_add(squares);
      }
#endif
      for (int64_t t = d; t < n; ++t) sum += static_cast<float>(row[t]) * static_cast<float>(row[t]);
      const float scale = 1.f / std::sqrt(sum / static_cast<float>(n) + static_cast<float>(eps));
      d = 0;
#if FVEC_WIDTH
      if constexpr (has_fvec_io<T>) {
        const fvec s = vset(scale);
        for (; d + FVEC_WIDTH <= n; d += FVEC_WIDTH)
          vstore_as(o + d, vmul(vload_as(w + d), vround<T>(vmul(vload_as(row + d), s))));
      }
#endif
      for (; d < n; ++d) {
        const T normed = static_cast<T>(static_cast<float>(row[d]) * scale);
        o[d] = static_cast<T>(static_cast<float>(w[d]) * static_cast<float>(normed));
      }
    }
  });
}

}  // namespace

// x [rows, n] (last dim contiguous), weight [n] in x's dtype; returns a new contiguous [rows, n].
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  auto out = torch::empty({x.size(0), x.size(1)}, x.options());
  switch (x.scalar_type()) {
    case at::kFloat: normalise<float>(out, x, weight, eps); break;
    case at::kBFloat16: normalise<c10::BFloat16>(out, x, weight, eps); break;
    case at::kHalf: normalise<c10::Half>(out, x, weight, eps); break;
    default: TORCH_CHECK(false, "rms_norm (CPU) supports float32, bfloat16 and float16, got ", x.scalar_type());
  }
  return out;
}
