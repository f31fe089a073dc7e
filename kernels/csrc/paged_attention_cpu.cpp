// CPU paged attention: reads K/V blocks in place through the block tables, never gathering a copy.
//
// One routine serves decode and prefill: sequence s owns query rows query_start_loc[s]..[s+1], and new token i
// of a sequence with q_len new tokens sits at position context_len - q_len + i, attending causally to 0..that.
// Decode is the case q_len == 1 everywhere.
//
// A prompt (PROMPT_MIN_QUERY or more new rows: a whole prompt, or a long suffix after a prefix hit) goes through
// prompt_attention (prompt_attention_cpu.cpp: blocked matmuls, 2.5-3x faster than flash attention in bfloat16); the other sequences here.
//
// Work item = (sequence, KV head, tile of up to TILE_Q query tokens). An item owns the group's query heads
// for its tokens (GQA: the rows sharing one KV head), so each K/V block is read once per item and converted
// to float32 once into a small local buffer, then reused by every row. Softmax is online (running max and
// sum per row), accumulated in float32. Items are sorted by cost (rows x context) and pulled from an atomic
// counter by torch's intra-op threads, so long prefills do not leave a thread idle at the end.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <utility>
#include <type_traits>
#include <vector>

#include "cpu_math.h"

namespace {

constexpr int64_t TILE_Q = 16;
constexpr int64_t PROMPT_MIN_QUERY = 32;  // new rows from which a sequence attends through prompt_attention
constexpr int64_t PREFETCH_BLOCKS = 2;  // how far ahead a block's rows are fetched (1: 10-20% slower at 1,024 tokens)

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) {
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}
inline float to_float(c10::Half x) { return static_cast<float>(x); }

template <typename T>
inline void load_row(const T* __restrict src, float* __restrict dst, int64_t n, float scale) {
  int64_t d = 0;
#if FVEC_WIDTH
  if constexpr (std::is_same_v<T, c10::BFloat16>) {  // a register at a time
    const fvec s = vset(scale);
    for (; d + FVEC_WIDTH <= n; d += FVEC_WIDTH)
      vstore(dst + d, vmul(vload_bf16(reinterpret_cast<const uint16_t*>(src + d)), s));
  }
#endif
  for (; d < n; ++d) dst[d] = to_float(src[d]) * scale;
}

inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

// scores[t] = q . k[t] for the first n rows of k (row t at k + t * row_stride): FVEC_WIDTH rows at once, one
// accumulator each (independent FMA chains), their lanes summed together by vsum_lanes.
template <int64_t HEAD_DIM>
inline void block_scores(const float* __restrict q, const float* __restrict k, int64_t row_stride, int64_t n,
                         int64_t head_dim, float* __restrict scores) {
#if FVEC_WIDTH
  if constexpr (HEAD_DIM > 0 && HEAD_DIM % FVEC_WIDTH == 0) {
    for (int64_t c = 0; c < n; c += FVEC_WIDTH) {
      const int64_t m = std::min<int64_t>(FVEC_WIDTH, n - c);
      fvec partial[FVEC_WIDTH];
      for (int64_t t = 0; t < FVEC_WIDTH; ++t) {
        fvec acc = vzero();
        if (t < m) {  // rows past n may lie outside the context: never read them
          const float* kt = k + (c + t) * row_stride;
          for (int64_t d = 0; d < HEAD_DIM; d += FVEC_WIDTH) acc = vfmadd(vload(q + d), vload(kt + d), acc);
        }
        partial[t] = acc;
      }
      alignas(64) float sums[FVEC_WIDTH];
      vstore(sums, vsum_lanes(partial));
      std::copy_n(sums, m, scores + c);
    }
    return;
  }
#endif
  for (int64_t t = 0; t < n; ++t) scores[t] = dot(q, k + t * row_stride, head_dim);
}

// For R rows r at once: acc[r] = acc[r] * correction[r] + sum over t < n of p[r][t] * v[t] (p[r] at
// p + r * p_stride, row t of v at v + t * row_stride). Each V row is loaded once for all R rows (a GQA group
// shares its KV head), and with the head size fixed the R accumulator rows stay in registers for the block:
// R * HEAD_DIM / FVEC_WIDTH independent FMA chains instead of a load and store of the accumulator per token.
template <int64_t HEAD_DIM, int64_t R>
inline void accumulate_rows(float* __restrict acc, const float* __restrict correction, const float* __restrict p,
                            int64_t p_stride, const float* __restrict v, int64_t row_stride, int64_t n,
                            int64_t head_dim) {
#if FVEC_WIDTH
  if constexpr (HEAD_DIM > 0 && HEAD_DIM % FVEC_WIDTH == 0) {
    constexpr int64_t V = HEAD_DIM / FVEC_WIDTH;
    fvec a[R][V];
    for (int64_t r = 0; r < R; ++r) {
      const fvec c = vset(correction[r]);
      for (int64_t i = 0; i < V; ++i) a[r][i] = vmul(vload(acc + r * HEAD_DIM + FVEC_WIDTH * i), c);
    }
    for (int64_t t = 0; t < n; ++t) {
      const float* vt = v + t * row_stride;
      fvec vv[V];
      for (int64_t i = 0; i < V; ++i) vv[i] = vload(vt + FVEC_WIDTH * i);
      for (int64_t r = 0; r < R; ++r) {
        const fvec pt = vset(p[r * p_stride + t]);
        for (int64_t i = 0; i < V; ++i) a[r][i] = vfmadd(pt, vv[i], a[r][i]);
      }
    }
    for (int64_t r = 0; r < R; ++r)
      for (int64_t i = 0; i < V; ++i) vstore(acc + r * HEAD_DIM + FVEC_WIDTH * i, a[r][i]);
    return;
  }
#endif
  for (int64_t r = 0; r < R; ++r) {
    float* ar = acc + r * head_dim;
    const float* pr = p + r * p_stride;
#pragma omp simd
    for (int64_t d = 0; d < head_dim; ++d) ar[d] *= correction[r];
    for (int64_t t = 0; t < n; ++t) {
      const float pt = pr[t];
      const float* vt = v + t * row_stride;
#pragma omp simd
      for (int64_t d = 0; d < head_dim; ++d) ar[d] += pt * vt[d];
    }
  }
}

// How many rows accumulate_rows takes at once: as many (up to 4) as keep their accumulators and one V row in
// the ISA's vector registers (AVX-512: 32, AVX2: 16), so none spill to memory.
constexpr int64_t rows_at_once(int64_t head_dim) {
#if FVEC_WIDTH
  if (head_dim > 0 && head_dim % FVEC_WIDTH == 0) {
    const int64_t per_row = head_dim / FVEC_WIDTH, registers = FVEC_WIDTH == 16 ? 32 : 16;
    return std::max<int64_t>(1, std::min<int64_t>(4, (registers - per_row) / per_row));
  }
#endif
  return 4;
}

// accumulate_rows for `count` (any) rows, R at a time, the rest by fewer.
template <int64_t HEAD_DIM, int64_t R = rows_at_once(HEAD_DIM)>
inline void accumulate_values(float* acc, const float* correction, const float* p, int64_t p_stride,
                              const float* v, int64_t row_stride, int64_t n, int64_t head_dim, int64_t count) {
  int64_t r = 0;
  for (; r + R <= count; r += R)
    accumulate_rows<HEAD_DIM, R>(acc + r * head_dim, correction + r, p + r * p_stride, p_stride, v, row_stride, n,
                                 head_dim);
  if constexpr (R > 1) {
    if (r < count)
      accumulate_values<HEAD_DIM, R - 1>(acc + r * head_dim, correction + r, p + r * p_stride, p_stride, v,
                                         row_stride, n, head_dim, count - r);
  }
}

struct Item {
  int64_t seq, kv_head, q_begin, q_end;  // q_* are token rows of the flattened query
  int64_t first_pos;                     // position of row q_begin in its sequence
  double cost;
};

// Per-thread buffers, sized once for the largest item: float32 queries, accumulators, one K/V block, and per
// row its probabilities over that block and the correction of its running sum.
struct Scratch {
  std::vector<float> q, acc, k, v, probs, correction, row_max, row_sum;
  Scratch(int64_t rows, int64_t block_size, int64_t head_dim)
      : q(rows * head_dim), acc(rows * head_dim), k(block_size * head_dim), v(block_size * head_dim),
        probs(rows * block_size), correction(rows), row_max(rows), row_sum(rows) {}
};

// HEAD_DIM > 0 fixes head_dim at compile time (fully unrolled vector loops, ~1.5x faster); 0 reads it at run time.
template <typename T, int64_t HEAD_DIM>
void attend_item(const Item& it, Scratch& buf, const T* q, int64_t q_s0, int64_t q_s1, const T* k, const T* v,
                 int64_t c_s0, int64_t c_s1, int64_t c_s2, const int32_t* tables, int64_t t_s0,
                 int64_t block_size, int64_t group, int64_t runtime_head_dim, float scale, T* out, int64_t o_s0,
                 int64_t o_s1) {
  const int64_t head_dim = HEAD_DIM > 0 ? HEAD_DIM : runtime_head_dim;
  const int64_t tokens = it.q_end - it.q_begin;
  const int64_t rows = tokens * group;
  // Row r = (token r / group, head kv_head * group + r % group).
  float* qf = buf.q.data();
  float* acc = buf.acc.data();
  float* kf = buf.k.data();
  float* vf = buf.v.data();
  float* probs = buf.probs.data();
  float* correction = buf.correction.data();
  std::fill_n(acc, rows * head_dim, 0.f);
  std::fill_n(buf.row_max.data(), rows, -std::numeric_limits<float>::infinity());
  std::fill_n(buf.row_sum.data(), rows, 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t head = it.kv_head * group + r % group;
    load_row(q + (it.q_begin + r / group) * q_s0 + head * q_s1, qf + r * head_dim, head_dim, scale);
  }
  // The last row sees the most context: position first_pos + tokens - 1.
  const int64_t visible = it.first_pos + tokens;
  const int32_t* table = tables + it.seq * t_s0;
  for (int64_t start = 0; start < visible; start += block_size) {
    const int64_t n = std::min(block_size, visible - start);
    const int64_t base = static_cast<int64_t>(table[start / block_size]) * c_s0 + it.kv_head * c_s2;
    // Blocks lie at random addresses, so the hardware cannot fetch ahead across them: fetch the rows of the
    // block PREFETCH_BLOCKS ahead into L2 (converted dtypes: one row per row converted here, spreading the
    // requests over the work; float32, read in place, asks for them all at the block's start).
    const int64_t ahead_start = start + PREFETCH_BLOCKS * block_size;
    const int64_t ahead_rows = std::max<int64_t>(0, std::min(block_size, visible - ahead_start));
    const int64_t ahead = ahead_rows ? static_cast<int64_t>(table[ahead_start / block_size]) * c_s0 + it.kv_head * c_s2 : 0;
    auto prefetch_row = [&](int64_t t) {
      for (int64_t byte = 0; byte < head_dim * static_cast<int64_t>(sizeof(T)); byte += 64) {
        __builtin_prefetch(reinterpret_cast<const char*>(k + ahead + t * c_s1) + byte, 0, 2);
        __builtin_prefetch(reinterpret_cast<const char*>(v + ahead + t * c_s1) + byte, 0, 2);
      }
    };
    // float32 blocks are read where they lie; other dtypes are converted once into the scratch block.
    const float* kb = kf;
    const float* vb = vf;
    int64_t row_stride = head_dim;
    if constexpr (std::is_same_v<T, float>) {
      kb = k + base;
      vb = v + base;
      row_stride = c_s1;
      for (int64_t t = 0; t < ahead_rows; ++t) prefetch_row(t);
    } else {
      for (int64_t t = 0; t < n; ++t) {
        load_row(k + base + t * c_s1, kf + t * head_dim, head_dim, 1.f);
        load_row(v + base + t * c_s1, vf + t * head_dim, head_dim, 1.f);
        if (t < ahead_rows) prefetch_row(t);
      }
      for (int64_t t = n; t < ahead_rows; ++t) prefetch_row(t);
    }
    // Scores and the online-softmax update row by row; then the values, all rows together. A row's
    // probabilities past what it may see (causal) are 0, and a row that sees none of the block keeps its
    // accumulator (correction 1).
    int64_t used = 0;
    for (int64_t r = 0; r < rows; ++r) {
      // Causal: row r's token sits at first_pos + r / group and sees up to that position.
      const int64_t limit = std::max<int64_t>(0, std::min(n, it.first_pos + r / group + 1 - start));
      float* pr = probs + r * block_size;
      std::fill(pr + limit, pr + n, 0.f);
      if (limit == 0) {
        correction[r] = 1.f;
        continue;
      }
      used = std::max(used, limit);
      block_scores<HEAD_DIM>(qf + r * head_dim, kb, row_stride, limit, head_dim, pr);
      const float old_max = buf.row_max[r];
      float new_max;
      const float sum = exponentiate(pr, limit, old_max, &new_max);
      correction[r] = exp_nonpositive(old_max - new_max);  // ~0 on the first block
      buf.row_max[r] = new_max;
      buf.row_sum[r] = buf.row_sum[r] * correction[r] + sum;
    }
    accumulate_values<HEAD_DIM>(acc, correction, probs, block_size, vb, row_stride, used, head_dim, rows);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t head = it.kv_head * group + r % group;
    T* o = out + (it.q_begin + r / group) * o_s0 + head * o_s1;
    const float inv = buf.row_sum[r] > 0.f ? 1.f / buf.row_sum[r] : 0.f;  // empty context: zeros, not NaN
    const float* ar = acc + r * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) o[d] = static_cast<T>(ar[d] * inv);
  }
}

// Work items, costliest first, for the sequences of fewer than PROMPT_MIN_QUERY new rows. Checks here, for every
// sequence, what would otherwise read out of bounds: a context needing more blocks than the table has columns
// (raised as ValueError in Python), before anything is written.
std::vector<Item> plan(const torch::Tensor& context_lens, const torch::Tensor& query_start_loc, int64_t kv_heads,
                       int64_t group, int64_t block_size, int64_t table_width) {
  const auto* ctx = context_lens.data_ptr<int32_t>();
  const auto* starts = query_start_loc.data_ptr<int32_t>();
  std::vector<Item> items;
  for (int64_t s = 0; s < context_lens.size(0); ++s) {
    const int64_t q_len = starts[s + 1] - starts[s], context = ctx[s];
    TORCH_CHECK_VALUE((context + block_size - 1) / block_size <= table_width, "block_tables has ", table_width,
                      " columns but a context of ", context, " tokens needs ", (context + block_size - 1) / block_size,
                      " blocks");
    if (q_len >= PROMPT_MIN_QUERY) continue;
    for (int64_t q0 = 0; q0 < q_len; q0 += TILE_Q) {
      const int64_t q1 = std::min(q_len, q0 + TILE_Q);
      const int64_t first_pos = context - q_len + q0;
      const double cost = static_cast<double>((q1 - q0) * group) * static_cast<double>(first_pos + q1 - q0 + 1);
      for (int64_t h = 0; h < kv_heads; ++h)
        items.push_back({s, h, starts[s] + q0, starts[s] + q1, first_pos, cost});
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });
  return items;
}

}  // namespace

void prompt_attention(torch::Tensor out, torch::Tensor query, torch::Tensor key_cache, torch::Tensor value_cache,
                      torch::Tensor table, int64_t start, int64_t end, int64_t context,
                      double scale);  // prompt_attention_cpu.cpp

// query [tokens, heads, head_dim] (last dim contiguous), caches [blocks, block_size, kv_heads, head_dim]
// (last dim contiguous), block_tables [seqs, width] int32, context_lens [seqs] int32, query_start_loc
// [seqs + 1] int32, out like query (contiguous). Shapes and value ranges are checked by the Python caller.
void paged_attention(torch::Tensor out, torch::Tensor query, torch::Tensor key_cache, torch::Tensor value_cache,
                     torch::Tensor block_tables, torch::Tensor context_lens, torch::Tensor query_start_loc,
                     double scale) {
  const int64_t heads = query.size(1), head_dim = query.size(2);
  const int64_t block_size = key_cache.size(1), kv_heads = key_cache.size(2), group = heads / kv_heads;
  const std::vector<Item> items = plan(context_lens, query_start_loc, kv_heads, group, block_size,
                                       block_tables.size(1));
  const auto* starts = query_start_loc.data_ptr<int32_t>();
  const auto* contexts = context_lens.data_ptr<int32_t>();
  std::vector<std::pair<double, int64_t>> prompts;  // (cost, sequence), costliest first
  for (int64_t s = 0; s < context_lens.size(0); ++s) {
    const int64_t q_len = starts[s + 1] - starts[s];
    if (q_len >= PROMPT_MIN_QUERY) prompts.emplace_back(static_cast<double>(q_len) * contexts[s], s);
  }
  std::sort(prompts.begin(), prompts.end(), std::greater<>());
  auto attend_prompt = [&](int64_t s) {
    prompt_attention(out, query, key_cache, value_cache, block_tables[s], starts[s], starts[s + 1], contexts[s], scale);
  };
  if (prompts.size() == 1) {
    attend_prompt(prompts[0].second);  // its matmuls use every thread
  } else if (!prompts.empty()) {
    // A prompt's matmuls are too small to keep two threads busy (one thread is as fast), so each thread takes
    // whole prompts, costliest first; inside the parallel region their matmuls run on the calling thread. The
    // caller's thread-local state (inference mode) goes with them, as at::parallel_for does not carry it.
    std::atomic<size_t> next_prompt{0};
    const at::ThreadLocalState caller;
    at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), prompts.size()), 1, [&](int64_t, int64_t) {
      const at::ThreadLocalStateGuard same_state(caller);
      for (size_t i = next_prompt++; i < prompts.size(); i = next_prompt++) attend_prompt(prompts[i].second);
    });
  }
  if (items.empty()) return;
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), static_cast<int64_t>(items.size()));
  auto run = [&](auto zero) {
    using scalar_t = decltype(zero);
    const auto* q = query.data_ptr<scalar_t>();
    const auto* k = key_cache.data_ptr<scalar_t>();
    const auto* v = value_cache.data_ptr<scalar_t>();
    auto* o = out.data_ptr<scalar_t>();
    const auto* tables = block_tables.data_ptr<int32_t>();
    auto attend = [&](auto fixed_head_dim) {
      at::parallel_for(0, workers, 1, [&](int64_t begin, int64_t end) {
        Scratch buf(TILE_Q * group, block_size, head_dim);
        for (int64_t w = begin; w < end; ++w) {
          for (int64_t i = next++; i < static_cast<int64_t>(items.size()); i = next++) {
            attend_item<scalar_t, decltype(fixed_head_dim)::value>(
                items[i], buf, q, query.stride(0), query.stride(1), k, v, key_cache.stride(0), key_cache.stride(1),
                key_cache.stride(2), tables, block_tables.stride(0), block_size, group, head_dim,
                static_cast<float>(scale), o, out.stride(0), out.stride(1));
          }
        }
      });
    };
    if (head_dim == 64) return attend(std::integral_constant<int64_t, 64>{});
    if (head_dim == 128) return attend(std::integral_constant<int64_t, 128>{});
    return attend(std::integral_constant<int64_t, 0>{});
  };
  switch (query.scalar_type()) {
    case at::kFloat: return run(float{});
    case at::kBFloat16: return run(c10::BFloat16{});
    case at::kHalf: return run(c10::Half{});
    default: TORCH_CHECK(false, "paged_attention (CPU) supports float32, bfloat16 and float16, got ",
                         query.scalar_type());
  }
}

void rotary_embedding(torch::Tensor x, torch::Tensor cos, torch::Tensor sin);  // rotary_cpu.cpp
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);      // rms_norm_cpu.cpp
torch::Tensor silu_and_mul(torch::Tensor x);                                      // silu_and_mul_cpu.cpp
void reshape_and_cache(torch::Tensor key, torch::Tensor value, torch::Tensor key_cache,
                       torch::Tensor value_cache, torch::Tensor slot_mapping);      // reshape_and_cache_cpu.cpp
bool tiled_weights_available();                                                     // weight_only_cpu.cpp
torch::Tensor tiled_int4_matmul(torch::Tensor x, torch::Tensor codes, torch::Tensor scales_offsets,
                                int64_t group_size);
torch::Tensor tiled_int8_matmul(torch::Tensor x, torch::Tensor codes, torch::Tensor scales);
torch::Tensor decoder_layers(torch::Tensor hidden, std::vector<torch::Tensor> weights,
                             std::vector<torch::Tensor> key_caches, std::vector<torch::Tensor> value_caches,
                             torch::Tensor cos, torch::Tensor sin, torch::Tensor slot_mapping,
                             torch::Tensor block_tables, torch::Tensor context_lens, torch::Tensor query_start_loc,
                             int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double scale,
                             double eps);  // decoder_cpu.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_attention", &paged_attention, "paged attention over a varlen batch (CPU)");
  m.attr("PROMPT_MIN_QUERY") = PROMPT_MIN_QUERY;
  m.def("rotary_embedding", &rotary_embedding, "rotary position embedding of q and k heads, in place (CPU)");
  m.def("rms_norm", &rms_norm, "RMSNorm of each row (CPU)");
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up of a fused [gate | up] (CPU)");
  m.def("reshape_and_cache", &reshape_and_cache, "new K/V rows into their cache slots (CPU)");
  m.def("tiled_weights_available", &tiled_weights_available, "whether AMX tiled weight-only matmuls run here");
  m.def("tiled_int4_matmul", &tiled_int4_matmul, "x @ W.T, W int4 in the tiled layout (CPU, AMX)");
  m.def("tiled_int8_matmul", &tiled_int8_matmul, "x @ W.T, W int8 in the tiled layout (CPU, AMX)");
  m.def("decoder_layers", &decoder_layers, "a Llama model's decoder layers for one step (CPU)");
}
