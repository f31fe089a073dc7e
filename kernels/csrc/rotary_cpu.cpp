// Rotary position embedding in place, for the q and k heads of one layer together.
//
// x is [tokens, heads, head_dim] (last dim contiguous, any other strides: the q|k columns of the fused qkv
// output), cos and sin are [tokens, rotary_dim / 2] (contiguous) in x's dtype, rotary_dim <= head_dim. In the
// rotate-half layout over the first rotary_dim dimensions, with a = x[..., d] and b = x[..., d + rotary_dim / 2]:
// a' = a * cos - b * sin,  b' = b * cos + a * sin; dimensions from rotary_dim on are left alone (partial rotary).
// Every product and sum is rounded to x's dtype exactly where torch's op-by-op reference rounds it (the
// extension is built with -ffp-contract=off, so no product is fused into an FMA), which makes the result
// bit-equal to kernels.reference.rotary_embedding_ in float32, bfloat16 and float16: one pass over q and k
// instead of the reference's seven.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>

#include "cpu_math.h"

namespace {

template <typename T>
void rotate(torch::Tensor x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t tokens = x.size(0), heads = x.size(1), half = cos.size(1);
  const int64_t s0 = x.stride(0), s1 = x.stride(1);
  T* data = x.data_ptr<T>();
  const T* c = cos.data_ptr<T>();
  const T* s = sin.data_ptr<T>();
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* ct = c + t * half;
      const T* st = s + t * half;
      for (int64_t h = 0; h < heads; ++h) {
        T* row = data + t * s0 + h * s1;
        int64_t d = 0;
#if FVEC_WIDTH
        if constexpr (has_fvec_io<T>) {  // the same roundings a register at a time (vround), so still bit-equal
          for (; d + FVEC_WIDTH <= half; d += FVEC_WIDTH) {
            const fvec a = vload_as(row + d), b = vload_as(row + d + half);
            const fvec cd = vload_as(ct + d), sd = vload_as(st + d);
            const fvec a_cos = vround<T>(vmul(a, cd)), b_sin = vround<T>(vmul(b, sd));
            const fvec b_cos = vround<T>(vmul(b, cd)), a_sin = vround<T>(vmul(a, sd));
            vstore_as(row + d, vsub(a_cos, b_sin));
            vstore_as(row + d + half, vadd(b_cos, a_sin));
          }
        }
#endif
        for (; d < half; ++d) {
          const float a = static_cast<float>(row[d]), b = static_cast<float>(row[d + half]);
          const float cd = static_cast<float>(ct[d]), sd = static_cast<float>(st[d]);
          const float a_cos = round_to<T>(a * cd), b_sin = round_to<T>(b * sd);
          const float b_cos = round_to<T>(b * cd), a_sin = round_to<T>(a * sd);
          row[d] = static_cast<T>(a_cos - b_sin);
          row[d + half] = static_cast<T>(b_cos + a_sin);
        }
      }
    }
  });
}

}  // namespace

// Shapes, dtypes and strides are checked by the Python caller (kernels.cpu_kernels.rotary_embedding_).
void rotary_embedding(torch::Tensor x, torch::Tensor cos, torch::Tensor sin) {
  switch (x.scalar_type()) {
    case at::kFloat: return rotate<float>(x, cos, sin);
    case at::kBFloat16: return rotate<c10::BFloat16>(x, cos, sin);
    case at::kHalf: return rotate<c10::Half>(x, cos, sin);
    default: TORCH_CHECK(false, "rotary_embedding (CPU) supports float32, bfloat16 and float16, got ", x.scalar_type());
  }
}
