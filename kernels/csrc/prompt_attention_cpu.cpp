// A prompt's attention through matmuls: one sequence's new rows (a whole prompt, or the suffix after a prefix-cache
// hit or an earlier chunk) attending causally to its context in the paged cache.
//
// The row-by-row kernel (paged_attention_cpu.cpp) computes a prompt's scores one dot product at a time, and torch's
// CPU flash attention reached only ~100 GFLOP/s at these shapes (9 query heads over 3 KV heads, head_dim 64, a few
// hundred tokens). Here the sequence's K and V are gathered once, each KV head's keys contiguous; then per tile of
// QUERY_TILE tokens, with the query heads of one KV head stacked as rows: S = Q·Kᵀ over only the keys the tile can
// see (a causal tile skips the keys after its last row), one pass of scale, causal mask and softmax in float32
// rounded to the dtype, and O = P·V. Both products are oneDNN matmuls (bfloat16 in bfloat16, float32 in float32),
// as HF's eager attention computes them: scores and probabilities rounded to the dtype before the next product.
//
// On a CPU without bfloat16 arithmetic (AVX2 only), a bfloat16 sequence's products run on its values widened to
// float32 (exact), each product rounded back to bfloat16: what a bfloat16 matmul summing in float32 computes, ~20x
// faster there than torch's own bfloat16 matmuls (BENCHMARKS.md, issue 12).
//
// On a CPU with AMX, bfloat16 prompts of FLASH_MIN_QUERY or more new tokens take torch's flash attention instead:
// its tiles multiply on AMX, 1.2-1.6x faster than the matmuls here from 64 to 1,024 new tokens (at 40 it is 1.2x
// slower; BENCHMARKS.md, issue 12). Without AMX it is the slower one. Only the prompts that paged_attention_cpu.cpp's
// own tile routines do not take come here on such a CPU: a sliding window, a soft cap, another head size.
//
// With a sliding window (window > 0: a token at position p sees keys p - window < k <= p, kernels/reference.py)
// only the blocks from the one holding the first row's first visible key are gathered, and each tile's product
// starts at the first key its first row sees. With a soft cap (softcap > 0, Gemma 2) each scaled score is capped
// (cap * tanh(score / cap)) before the softmax, and the flash path, which cannot cap, is not taken.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "cpu_math.h"

namespace {

constexpr int64_t QUERY_TILE = 64;
constexpr int64_t FLASH_MIN_QUERY = 64;

// One row of scores s[0..n) in place: softmax(scale * s) (capped first where softcap > 0) over the first
// `visible`, zeros after, rounded to T.
template <typename T>
void softmax_row(T* s, int64_t n, int64_t visible, float scale, float softcap, float* buf) {
  int64_t t = 0;
#if FVEC_WIDTH
  if constexpr (has_fvec_io<T>) {
    for (; t + FVEC_WIDTH <= visible; t += FVEC_WIDTH) vstore(buf + t, vmul(vload_as(s + t), vset(scale)));
  }
#endif
  for (; t < visible; ++t) buf[t] = static_cast<float>(s[t]) * scale;
  if (softcap > 0.f) soft_cap(buf, visible, softcap);
  float max;
  const float inv = 1.f / exponentiate(buf, visible, -std::numeric_limits<float>::infinity(), &max);
  t = 0;
#if FVEC_WIDTH
  if constexpr (has_fvec_io<T>) {
    for (; t + FVEC_WIDTH <= visible; t += FVEC_WIDTH) vstore_as(s + t, vmul(vload(buf + t), vset(inv)));
  }
#endif
  for (; t < visible; ++t) s[t] = static_cast<T>(buf[t] * inv);
  for (t = visible; t < n; ++t) s[t] = static_cast<T>(0.f);
}

// scores [kv_heads, tile * group, keys]: row i of each head is token i / group of the tile, whose position is
// `first_pos + i / group`, over the keys from position `key_start` on; it sees keys up to that position, and
// with a window only its last `window` of them.
template <typename T>
void softmax_tile(torch::Tensor scores, int64_t group, int64_t first_pos, int64_t key_start, int64_t window,
                  float scale, float softcap) {
  const int64_t heads = scores.size(0), rows = scores.size(1), keys = scores.size(2);
  T* data = scores.data_ptr<T>();
  at::parallel_for(0, heads * rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> buf(keys);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t position = first_pos + (r % rows) / group;
      const int64_t visible = std::min(keys, position + 1 - key_start);
      const int64_t first = window ? std::max<int64_t>(0, position + 1 - window - key_start) : 0;
      T* row = data + r * keys;
      std::fill(row, row + first, static_cast<T>(0.f));
      softmax_row<T>(row + first, keys - first, visible - first, scale, softcap, buf.data());
    }
  });
}

// Whether oneDNN multiplies bfloat16 here (AVX-512 or newer); asked once, of the same check torch makes.
bool bf16_arithmetic() {
  static const bool native = c10::Dispatcher::singleton()
      .findSchemaOrThrow("mkldnn::_is_mkldnn_bf16_supported", "").typed<bool()>().call();
  return native;
}

}  // namespace

bool tiled_weights_available();  // weight_only_cpu.cpp: AMX built in, and granted by the OS

// query [tokens, heads, head_dim] (heads and dims contiguous), caches [blocks, block_size, kv_heads, head_dim]
// (contiguous), table: the sequence's block ids (int32, at least ceil(context / block_size) of them). Rows
// start..end of query are the sequence's new tokens, the last end - start of its `context`; their outputs go to
// the same rows of out (like query, contiguous); window: the sliding window in tokens, 0 for full attention;
// softcap: the attention-logit soft cap, 0 for none.
// Checked by the Python caller (kernels.cpu_kernels).
void prompt_attention(torch::Tensor out, torch::Tensor query, torch::Tensor key_cache, torch::Tensor value_cache,
                      torch::Tensor table, int64_t start, int64_t end, int64_t context, double scale,
                      int64_t window, double softcap) {
  const int64_t heads = query.size(1), head_dim = query.size(2);
  const int64_t block_size = key_cache.size(1), kv_heads = key_cache.size(2), group = heads / kv_heads;
  const int64_t q_len = end - start, offset = context - q_len;
  const int64_t blocks = (context + block_size - 1) / block_size;
  TORCH_CHECK_VALUE(blocks <= table.size(0), "block_tables has ", table.size(0), " columns but a context of ",
                    context, " tokens needs ", blocks, " blocks");
  if (q_len <= 0) return;
  // Keys from position `base` on (the start of the block holding the first row's first visible key) are gathered.
  const int64_t first_block = window ? std::max<int64_t>(0, offset + 1 - window) / block_size : 0;
  const int64_t base = first_block * block_size, gathered = context - base;
  const torch::Tensor ids = table.narrow(0, first_block, blocks - first_block).to(torch::kLong);
  // [kv_heads, gathered, head_dim]: one KV head's keys (values) contiguous.
  auto gather = [&](const torch::Tensor& cache) {
    return cache.index_select(0, ids).view({(blocks - first_block) * block_size, kv_heads, head_dim})
        .narrow(0, 0, gathered).permute({1, 0, 2}).contiguous();
  };
  const at::ScalarType dtype = query.scalar_type();
  const at::ScalarType math = dtype == at::kBFloat16 && !bf16_arithmetic() ? at::kFloat : dtype;  // the products'
  const torch::Tensor keys = gather(key_cache).to(math), values = gather(value_cache).to(math);
  if (dtype == at::kBFloat16 && q_len >= FLASH_MIN_QUERY && softcap == 0 && tiled_weights_available()) {
    // Token i (position offset + i) sees keys 0..offset + i: the causal mask aligned to the bottom right; with a
    // window, from offset + i - window + 1 on. Key j of the gathered ones is at position base + j. A whole prompt
    // without a window (offset 0) is SDPA's own causal case, which skips the tiles above the diagonal and builds
    // no mask: the same outputs, bit for bit, 15% faster at 290 tokens and 1.9x at 1,024.
    std::optional<torch::Tensor> visible;
    if (offset != 0 || window) {
      visible = torch::ones({q_len, gathered}, query.options().dtype(torch::kBool)).tril(offset - base);
      if (window) visible = visible->triu(offset - base - window + 1);
    }
    const torch::Tensor o = at::scaled_dot_product_attention(
        query.narrow(0, start, q_len).transpose(0, 1).unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0), visible,
        0.0, /*is_causal=*/!visible.has_value(), scale, /*enable_gqa=*/true);  // [1, heads, q_len, head_dim]
    out.narrow(0, start, q_len).copy_(o.squeeze(0).transpose(0, 1));
    return;
  }
  // [kv_heads, q_len * group, head_dim]: one KV head's query heads as rows, token by token.
  const torch::Tensor q = query.narrow(0, start, q_len).view({q_len, kv_heads, group, head_dim})
                              .permute({1, 0, 2, 3}).reshape({kv_heads, q_len * group, head_dim}).to(math);
  for (int64_t a = 0; a < q_len; a += QUERY_TILE) {
    // Keys from position `from` (the tile's first row's first visible one) up to `seen` (its last row's last).
    const int64_t b = std::min(q_len, a + QUERY_TILE), seen = offset + b;
    const int64_t from = window ? std::max<int64_t>(base, offset + a + 1 - window) : 0;
    torch::Tensor scores = at::bmm(q.narrow(1, a * group, (b - a) * group),
                                   keys.narrow(1, from - base, seen - from).transpose(1, 2)).to(dtype);
    const float s = static_cast<float>(scale), cap = static_cast<float>(softcap);
    switch (scores.scalar_type()) {
      case at::kFloat: softmax_tile<float>(scores, group, offset + a, from, window, s, cap); break;
      case at::kBFloat16: softmax_tile<c10::BFloat16>(scores, group, offset + a, from, window, s, cap); break;
      case at::kHalf: softmax_tile<c10::Half>(scores, group, offset + a, from, window, s, cap); break;
      default: TORCH_CHECK(false, "prompt_attention (CPU) supports float32, bfloat16 and float16, got ",
                           scores.scalar_type());
    }
    // [kv_heads, tile * group, head_dim]
    const torch::Tensor o = at::bmm(scores.to(math), values.narrow(1, from - base, seen - from));
    out.narrow(0, start + a, b - a).view({b - a, kv_heads, group, head_dim})
        .copy_(o.view({kv_heads, b - a, group, head_dim}).permute({1, 0, 2, 3}));
  }
}
