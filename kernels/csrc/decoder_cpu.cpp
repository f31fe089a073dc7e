// A Llama-family model's decoder layers for one step, in one call from Python.
//
// The same operations as inference.model's layers, in the same order and the same roundings, through the same
// kernels (the neighbouring files) and oneDNN's packed matmuls; what this file removes is the ~15 Python calls,
// argument checks and tensor wrappers a layer costs on the Python side (a batch-32 decode step 33 -> 30.5 ms in
// bfloat16, BENCHMARKS.md, issue 12). (oneDNN's "add" post-op, fusing the residual add into o_proj and down_proj, was
// tried: no faster at decode sizes, 10-30% slower at 2,048 tokens in bfloat16.)
//
// The caller (inference.model.LlamaForCausalLM.forward through kernels.cpu_kernels.decoder_layers) takes this
// path only where it holds exactly: one rank, no LoRA, float weights packed for oneDNN, without biases.
#include <torch/extension.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);             // rms_norm_cpu.cpp
void rotary_embedding(torch::Tensor x, torch::Tensor cos, torch::Tensor sin);          // rotary_cpu.cpp
torch::Tensor silu_and_mul(torch::Tensor x);                                            // silu_and_mul_cpu.cpp
void reshape_and_cache(torch::Tensor key, torch::Tensor value, torch::Tensor key_cache, torch::Tensor value_cache,
                       torch::Tensor slot_mapping);                                     // reshape_and_cache_cpu.cpp
void paged_attention(torch::Tensor out, torch::Tensor query, torch::Tensor key_cache, torch::Tensor value_cache,
                     torch::Tensor block_tables, torch::Tensor context_lens, torch::Tensor query_start_loc,
                     double scale, int64_t window);                                     // paged_attention_cpu.cpp

namespace {

// x @ W.T for a weight in oneDNN's packed layout (inference.linear.PackedFloatWeight). A bfloat16 model's weight
// packed widened to float32 (a CPU without bfloat16 arithmetic) multiplies x widened, the result rounded back.
torch::Tensor packed_linear(const torch::Tensor& x, const torch::Tensor& packed) {
  static const auto op = c10::Dispatcher::singleton()
      .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
      .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, std::string_view,
                        c10::List<std::optional<at::Scalar>>, std::optional<std::string_view>)>();
  // Both casts return their input unchanged unless the weight is widened.
  return op.call(x.to(packed.scalar_type()), packed, std::nullopt, "none", c10::List<std::optional<at::Scalar>>(),
                 std::nullopt).to(x.scalar_type());
}

// Metadata under which each of `rows` (query rows of the step) attends as a one-row query of its own: its
// sequence's block table, and a context ending at its own position, as the step's causal mask has it. Returns
// (block_tables, context_lens, query_start_loc) for paged_attention.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> one_row_queries(const torch::Tensor& rows,
                                                                       const torch::Tensor& block_tables,
                                                                       const torch::Tensor& context_lens,
                                                                       const torch::Tensor& query_start_loc) {
  const int64_t kept = rows.size(0), seqs = context_lens.size(0);
  const auto* starts = query_start_loc.data_ptr<int32_t>();
  const auto* contexts = context_lens.data_ptr<int32_t>();
  const auto* row = rows.data_ptr<int64_t>();
  torch::Tensor seq_of = torch::empty({kept}, rows.options());
  torch::Tensor lens = torch::empty({kept}, context_lens.options());
  for (int64_t i = 0; i < kept; ++i) {
    const int64_t s = std::upper_bound(starts, starts + seqs + 1, row[i]) - starts - 1;  // starts[s] <= row < [s+1]
    seq_of.data_ptr<int64_t>()[i] = s;
    lens.data_ptr<int32_t>()[i] = contexts[s] - (starts[s + 1] - 1 - static_cast<int32_t>(row[i]));
  }
  return {block_tables.index_select(0, seq_of), lens, torch::arange(kept + 1, query_start_loc.options())};
}

}  // namespace

// hidden [tokens, hidden] (the step's embeddings, contiguous); per layer, in `weights`, six tensors: input norm,
// packed qkv, packed o, post-attention norm, packed gate_up, packed down; then the final norm's weight last.
// cos/sin [tokens, rotary_dim / 2] (partial rotary turns the first rotary_dim dimensions of each head only); the
// caches and metadata as paged_attention and reshape_and_cache take them.
// Returns the final norm of the last layer's output, [tokens, hidden], or with `rows` (int64 row numbers, each in
// range) only at those rows, [rows, hidden]: the last layer then writes every token's K and V, and runs the rest
// (attention, o_proj, the MLP, the final norm) for those rows alone (a prefill samples one row of hundreds).
// windows: each layer's sliding window (0: full attention), or empty where every layer is full. Checked by the
// Python caller.
torch::Tensor decoder_layers(torch::Tensor hidden, std::vector<torch::Tensor> weights,
                             std::vector<torch::Tensor> key_caches, std::vector<torch::Tensor> value_caches,
                             torch::Tensor cos, torch::Tensor sin, torch::Tensor slot_mapping,
                             torch::Tensor block_tables, torch::Tensor context_lens, torch::Tensor query_start_loc,
                             int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double scale, double eps,
                             std::optional<torch::Tensor> rows, std::vector<int64_t> windows) {
  const int64_t layers = static_cast<int64_t>(key_caches.size());
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == 6 * layers + 1 &&
                  static_cast<int64_t>(value_caches.size()) == layers,
              "decoder_layers: expected 6 weights per layer and the final norm, and one cache pair per layer");
  const int64_t tokens = hidden.size(0);
  const int64_t q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
  torch::Tensor h = hidden;
  torch::Tensor x = rms_norm(h, weights[0], eps);
  for (int64_t i = 0; i < layers; ++i) {
    const torch::Tensor* w = weights.data() + 6 * i;
    const torch::Tensor qkv = packed_linear(x, w[1]);  // [tokens, q | k | v]
    const torch::Tensor qk = qkv.narrow(1, 0, q_size + kv_size).view({tokens, num_heads + num_kv_heads, head_dim});
    rotary_embedding(qk, cos, sin);
    reshape_and_cache(qk.narrow(1, num_heads, num_kv_heads),
                      qkv.narrow(1, q_size + kv_size, kv_size).view({tokens, num_kv_heads, head_dim}),
                      key_caches[i], value_caches[i], slot_mapping);
    torch::Tensor q = qk.narrow(1, 0, num_heads), tables = block_tables, lens = context_lens, starts = query_start_loc;
    if (rows && i == layers - 1) {  // from here on, the kept rows only
      if (rows->size(0) == 0) return torch::empty({0, hidden.size(1)}, hidden.options());
      q = q.index_select(0, *rows);
      h = h.index_select(0, *rows);
      std::tie(tables, lens, starts) = one_row_queries(*rows, block_tables, context_lens, query_start_loc);
    }
    torch::Tensor attn = torch::empty({q.size(0), num_heads, head_dim}, hidden.options());
    paged_attention(attn, q, key_caches[i], value_caches[i], tables, lens, starts, scale,
                    windows.empty() ? 0 : windows[i]);
    h = h + packed_linear(attn.view({q.size(0), q_size}), w[2]);
    x = rms_norm(h, w[3], eps);
    h = h + packed_linear(silu_and_mul(packed_linear(x, w[4])), w[5]);
    x = rms_norm(h, w[6], eps);  // the next layer's input norm, or after the last layer the final norm
  }
  return x;
}
