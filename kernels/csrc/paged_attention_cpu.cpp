// CPU paged attention: reads K/V blocks in place through the block tables, never gathering a copy.
//
// One routine serves decode and prefill: sequence s owns query rows query_start_loc[s]..[s+1], and new token i
// of a sequence with q_len new tokens sits at position context_len - q_len + i, attending causally to 0..that.
// Decode is the case q_len == 1 everywhere. With a sliding window (window > 0) a token at position p sees only
// positions p - window < k <= p (transformers' sliding_window_overlay; kernels/reference.py): an item starts at the
// block holding its first row's first visible key, never reading the blocks before, and each row's scores start
// at its own first visible key. window == 0 (full attention) adds one predictable branch per row and block.
// softcap > 0 caps each scaled score (cap * tanh(score / cap), Gemma 2); 0, no cap, is one predictable branch
// per row and block too.
//
// A prompt (PROMPT_MIN_QUERY or more new rows: a whole prompt, or a long suffix after a prefix hit) goes through
// prompt_attention (prompt_attention_cpu.cpp: blocked matmuls, 2.5-3x faster than flash attention in bfloat16); the
// other sequences here. Where bfloat16 runs on AMX tiles, every sequence is attended here (attend_rows_tiles).
//
// Work item = (sequence, tile of up to TILE_Q query tokens, KV heads). An item owns the query heads of its KV
// heads for its tokens (GQA: the rows sharing one KV head), so each K/V block is read once per item (copied into a
// small local buffer unless other sequences share it, widened to float32 where the math does not take its dtype:
// see BlockRead) and reused by every row. With enough
// sequences an item takes every KV head: a block's rows then lie one after another in memory and are read in one
// sweep (the SmolLM2 decode step at batch 32 and 1,024 tokens: 1.26x faster in bfloat16, 1.07x in float32, than
// one head's 1/kv_heads-wide strips at a time); with few, each head is its own item, so the threads still share a
// short batch. Softmax is online (running max and sum per row), accumulated in float32. Items are sorted by cost
// (rows x context) and pulled from an atomic counter by torch's intra-op threads, so long prefills do not leave a
// thread idle at the end. Where the OS grants AMX, bfloat16 items run on tiles instead: those of up to 16 rows per
// KV head (decode) in attend_item_tiles, the others (prompts, however long) in attend_rows_tiles.
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
#include <optional>
#include <utility>
#include <type_traits>
#include <vector>

#include "cpu_math.h"

bool tiled_weights_available();  // weight_only_cpu.cpp: AMX tile data granted by the OS

namespace {

constexpr int64_t TILE_Q = 16;
constexpr int64_t PROMPT_MIN_QUERY = 32;  // new rows from which a sequence attends through prompt_attention
constexpr int64_t WHOLE_HEADS_PER_THREAD = 4;  // (sequence, tile) pairs per thread from which items take every KV head
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
// accumulator each, their lanes summed together by vsum_lanes. The head's chunks are the outer loop and the rows
// the inner, so the FVEC_WIDTH multiply-adds of a chunk are independent (one row after another would wait on
// the FMA latency at every chunk: 5x slower); a last group of fewer rows (past n may lie outside the context)
// takes the row-by-row loop, in the same order, so every score rounds alike.
template <int64_t HEAD_DIM>
inline void block_scores(const float* __restrict q, const float* __restrict k, int64_t row_stride, int64_t n,
                         int64_t head_dim, float* __restrict scores) {
#if FVEC_WIDTH
  if constexpr (HEAD_DIM > 0 && HEAD_DIM % FVEC_WIDTH == 0) {
    int64_t c = 0;
    for (; c + FVEC_WIDTH <= n; c += FVEC_WIDTH) {
      fvec acc[FVEC_WIDTH];
      for (int64_t t = 0; t < FVEC_WIDTH; ++t) acc[t] = vzero();
      for (int64_t d = 0; d < HEAD_DIM; d += FVEC_WIDTH) {
        const fvec qd = vload(q + d);
        for (int64_t t = 0; t < FVEC_WIDTH; ++t) acc[t] = vfmadd(qd, vload(k + (c + t) * row_stride + d), acc[t]);
      }
      vstore(scores + c, vsum_lanes(acc));
    }
    if (c < n) {
      fvec acc[FVEC_WIDTH];
      for (int64_t t = 0; t < FVEC_WIDTH; ++t) {
        acc[t] = vzero();
        if (c + t < n)
          for (int64_t d = 0; d < HEAD_DIM; d += FVEC_WIDTH)
            acc[t] = vfmadd(vload(q + d), vload(k + (c + t) * row_stride + d), acc[t]);
      }
      alignas(64) float sums[FVEC_WIDTH];
      vstore(sums, vsum_lanes(acc));
      std::copy_n(sums, n - c, scores + c);
    }
    return;
  }
#endif
  for (int64_t t = 0; t < n; ++t) scores[t] = dot(q, k + t * row_stride, head_dim);
}

#if defined(__AVX512BF16__)
// block_scores for bfloat16 queries and keys (row t at k + t * row_stride), times `scale`: VDPBF16PS multiplies
// pairs of bfloat16 exactly into float32 lanes, so keys are never widened (half the instructions of widening them).
constexpr bool BF16_DOT = true;
template <int64_t HEAD_DIM>
inline void block_scores_bf16(const c10::BFloat16* __restrict q, const c10::BFloat16* __restrict k,
                              int64_t row_stride, int64_t n, float scale, float* __restrict scores) {
  static_assert(HEAD_DIM % 32 == 0, "a bfloat16 dot takes 32 dims a register");
  auto pairs = [](const c10::BFloat16* p) { return (__m512bh)_mm512_loadu_si512(p); };
  for (int64_t c = 0; c < n; c += FVEC_WIDTH) {
    const int64_t m = std::min<int64_t>(FVEC_WIDTH, n - c);
    fvec acc[FVEC_WIDTH];
    for (int64_t t = 0; t < FVEC_WIDTH; ++t) acc[t] = vzero();
    if (m == FVEC_WIDTH) {  // chunks outer, rows inner: independent multiply-adds, as in block_scores
      for (int64_t d = 0; d < HEAD_DIM; d += 32) {
        const __m512bh qd = pairs(q + d);
        for (int64_t t = 0; t < FVEC_WIDTH; ++t) acc[t] = _mm512_dpbf16_ps(acc[t], qd, pairs(k + (c + t) * row_stride + d));
      }
    } else {  // rows past n may lie outside the context: never read them
      for (int64_t t = 0; t < m; ++t)
        for (int64_t d = 0; d < HEAD_DIM; d += 32) acc[t] = _mm512_dpbf16_ps(acc[t], pairs(q + d), pairs(k + (c + t) * row_stride + d));
    }
    _mm512_mask_storeu_ps(scores + c, static_cast<__mmask16>((1u << m) - 1), vmul(vsum_lanes(acc), vset(scale)));
  }
}
#else
constexpr bool BF16_DOT = false;
#endif

// For R rows r at once: acc[r] = acc[r] * correction[r] + sum over t < n of p[r][t] * v[t] (p[r] at
// p + r * p_stride, row t of v at v + t * row_stride). Each V row is loaded once for all R rows (a GQA group
// shares its KV head), and with the head size fixed the R accumulator rows stay in registers for the block:
// R * HEAD_DIM / FVEC_WIDTH independent FMA chains instead of a load and store of the accumulator per token.
template <int64_t HEAD_DIM, int64_t R, typename V>
inline void accumulate_rows(float* __restrict acc, const float* __restrict correction, const float* __restrict p,
                            int64_t p_stride, const V* __restrict v, int64_t row_stride, int64_t n,
                            int64_t head_dim) {
#if FVEC_WIDTH
  if constexpr (HEAD_DIM > 0 && HEAD_DIM % FVEC_WIDTH == 0 && has_fvec_io<V>) {
    constexpr int64_t W = HEAD_DIM / FVEC_WIDTH;
    fvec a[R][W];
    for (int64_t r = 0; r < R; ++r) {
      const fvec c = vset(correction[r]);
      for (int64_t i = 0; i < W; ++i) a[r][i] = vmul(vload(acc + r * HEAD_DIM + FVEC_WIDTH * i), c);
    }
    for (int64_t t = 0; t < n; ++t) {
      const V* vt = v + t * row_stride;
      fvec vv[W];
      for (int64_t i = 0; i < W; ++i) vv[i] = vload_as(vt + FVEC_WIDTH * i);
      for (int64_t r = 0; r < R; ++r) {
        const fvec pt = vset(p[r * p_stride + t]);
        for (int64_t i = 0; i < W; ++i) a[r][i] = vfmadd(pt, vv[i], a[r][i]);
      }
    }
    for (int64_t r = 0; r < R; ++r)
      for (int64_t i = 0; i < W; ++i) vstore(acc + r * HEAD_DIM + FVEC_WIDTH * i, a[r][i]);
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
      const V* vt = v + t * row_stride;
#pragma omp simd
      for (int64_t d = 0; d < head_dim; ++d) ar[d] += pt * to_float(vt[d]);
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
template <int64_t HEAD_DIM, int64_t R = rows_at_once(HEAD_DIM), typename V>
inline void accumulate_values(float* acc, const float* correction, const float* p, int64_t p_stride,
                              const V* v, int64_t row_stride, int64_t n, int64_t head_dim, int64_t count) {
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
  int64_t seq, kv_begin, kv_end, q_begin, q_end;  // kv_* a range of KV heads; q_* token rows of the flattened query
  int64_t first_pos;                     // position of row q_begin in its sequence
  double cost;
};

// How attend_item reads a K/V block of T: copied a block at a time into the scratch, as bfloat16 where bfloat16 dots
// take it, else as float32 (float32 as it is, others widened). A copy is a run of independent loads the CPU keeps
// many of in flight; reading in place from the math's loops keeps few, even with prefetches (batch 32 at 1,024
// tokens, 30 layers: bfloat16 1.1-1.2x slower in place; float32 85 ms copied, 106 in place). A block several
// sequences of the batch share is the exception: after its first reader it sits in cache, where the copy is pure
// cost, so it is read in place wherever the math takes T as it is stored (batch 32 of one shared 1,024-token
// context: 1.5x faster in bfloat16, 1.45x in float32).
enum class BlockRead { bf16, float32 };
template <typename T, int64_t HEAD_DIM>
constexpr BlockRead block_read() {
  if constexpr (BF16_DOT && std::is_same_v<T, c10::BFloat16> && HEAD_DIM > 0 && HEAD_DIM % 32 == 0)
    return BlockRead::bf16;
  else return BlockRead::float32;
}
template <typename T, int64_t HEAD_DIM>
constexpr bool shared_in_place() {
  return std::is_same_v<T, float> || block_read<T, HEAD_DIM>() == BlockRead::bf16;
}

// One head's row of T into a scratch buffer: where the head size is fixed at compile time a copy of fixed size, which
// the compiler inlines as a few vector moves (std::copy_n of a run-time size calls memmove for each 128-byte row:
// 15% of the bfloat16 decode attention at batch 32 and 128 tokens of context).
template <int64_t HEAD_DIM, typename T>
inline void copy_head(const T* __restrict src, T* __restrict dst, int64_t head_dim) {
  if constexpr (HEAD_DIM > 0) std::memcpy(dst, src, HEAD_DIM * sizeof(T));
  else std::copy_n(src, head_dim, dst);
}

// Per-thread buffers, sized once for the largest item: its queries (float32, or bfloat16 as they came where the
// block is copied as bfloat16), accumulators, one K/V block of the item's heads, and per row its probabilities over
// that block and the correction of its running sum.
struct Scratch {
  std::vector<float> q, acc, k, v, probs, correction, row_max, row_sum;
  std::vector<c10::BFloat16> q_bf16, k_bf16, v_bf16;
  Scratch(int64_t rows, int64_t block_size, int64_t kv_heads, int64_t head_dim, BlockRead read)
      : q(read == BlockRead::bf16 ? 0 : rows * head_dim), acc(rows * head_dim),
        k(read == BlockRead::float32 ? block_size * kv_heads * head_dim : 0), v(k.size()), probs(rows * block_size),
        correction(rows), row_max(rows), row_sum(rows), q_bf16(read == BlockRead::bf16 ? rows * head_dim : 0),
        k_bf16(read == BlockRead::bf16 ? block_size * kv_heads * head_dim : 0), v_bf16(k_bf16.size()) {}
};

// HEAD_DIM > 0 fixes head_dim at compile time (fully unrolled vector loops, ~1.5x faster); 0 reads it at run time.
template <typename T, int64_t HEAD_DIM>
void attend_item(const Item& it, Scratch& buf, const T* q, int64_t q_s0, int64_t q_s1, const T* k, const T* v,
                 int64_t c_s0, int64_t c_s1, int64_t c_s2, const int32_t* tables, int64_t t_s0,
                 const uint8_t* shared_blocks,
                 int64_t block_size, int64_t group, int64_t runtime_head_dim, float scale, int64_t window,
                 float softcap, T* out, int64_t o_s0, int64_t o_s1) {
  const int64_t head_dim = HEAD_DIM > 0 ? HEAD_DIM : runtime_head_dim;
  constexpr BlockRead read = block_read<T, HEAD_DIM>();
  const int64_t tokens = it.q_end - it.q_begin;
  const int64_t heads = it.kv_end - it.kv_begin;
  const int64_t head_rows = tokens * group;  // rows per KV head
  const int64_t rows = heads * head_rows;
  // Row r = (KV head kv_begin + r / head_rows, token (r % head_rows) / group, query head of that KV head's group
  // r % group): each KV head's rows lie together.
  auto head_of = [&](int64_t r) { return (it.kv_begin + r / head_rows) * group + r % group; };
  auto token_of = [&](int64_t r) { return (r % head_rows) / group; };
  float* acc = buf.acc.data();
  float* probs = buf.probs.data();
  float* correction = buf.correction.data();
  std::fill_n(acc, rows * head_dim, 0.f);
  std::fill_n(buf.row_max.data(), rows, -std::numeric_limits<float>::infinity());
  std::fill_n(buf.row_sum.data(), rows, 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = q + (it.q_begin + token_of(r)) * q_s0 + head_of(r) * q_s1;
    if constexpr (read == BlockRead::bf16) copy_head<HEAD_DIM>(row, buf.q_bf16.data() + r * head_dim, head_dim);
    else load_row(row, buf.q.data() + r * head_dim, head_dim, scale);
  }
  // One block of every head of the item: per KV head, scores and the online-softmax update row by row, then the
  // values, all its rows together. Row t of head h's keys is at kb + t * row_stride + h * head_stride. A row's
  // probabilities outside what it may see (after it: causal; before its window) are 0, and a row that sees none
  // of the block keeps its accumulator (correction 1).
  auto attend_block = [&](int64_t start, int64_t n, const auto* kb, const auto* vb, int64_t row_stride,
                          int64_t head_stride) {
    for (int64_t h = 0; h < heads; ++h) {
      const auto* kh = kb + h * head_stride;
      int64_t used = 0;
      for (int64_t r = h * head_rows; r < (h + 1) * head_rows; ++r) {
        // Causal: row r's token sits at first_pos + token_of(r) and sees up to that position (block rows
        // lower..limit, lower past 0 only where the window begins inside or after this block).
        const int64_t position = it.first_pos + token_of(r);
        const int64_t limit = std::max<int64_t>(0, std::min(n, position + 1 - start));
        const int64_t lower = window ? std::min(limit, std::max<int64_t>(0, position + 1 - window - start)) : 0;
        float* pr = probs + r * block_size;
        std::fill(pr, pr + lower, 0.f);
        std::fill(pr + limit, pr + n, 0.f);
        if (limit == lower) {
          correction[r] = 1.f;
          continue;
        }
        used = std::max(used, limit);
        if constexpr (read == BlockRead::bf16) {
#if defined(__AVX512BF16__)
          block_scores_bf16<HEAD_DIM>(buf.q_bf16.data() + r * head_dim, kh + lower * row_stride, row_stride,
                                      limit - lower, scale, pr + lower);
#endif
        } else {
          block_scores<HEAD_DIM>(buf.q.data() + r * head_dim, kh + lower * row_stride, row_stride, limit - lower,
                                 head_dim, pr + lower);
        }
        if (softcap > 0.f) soft_cap(pr + lower, limit - lower, softcap);
        const float old_max = buf.row_max[r];
        float new_max;
        const float sum = exponentiate(pr + lower, limit - lower, old_max, &new_max);
        correction[r] = exp_nonpositive(old_max - new_max);  // ~0 on the first block
        buf.row_max[r] = new_max;
        buf.row_sum[r] = buf.row_sum[r] * correction[r] + sum;
      }
      const int64_t first = h * head_rows;
      accumulate_values<HEAD_DIM>(acc + first * head_dim, correction + first, probs + first * block_size,
                                  block_size, vb + h * head_stride, row_stride, used, head_dim, head_rows);
    }
  };
  // The last row sees the most context: position first_pos + tokens - 1; the first row's window the earliest.
  const int64_t visible = it.first_pos + tokens;
  const int64_t first_block = window ? std::max<int64_t>(0, it.first_pos + 1 - window) / block_size : 0;
  const int32_t* table = tables + it.seq * t_s0;
  for (int64_t start = first_block * block_size; start < visible; start += block_size) {
    const int64_t n = std::min(block_size, visible - start);
    const int32_t block = table[start / block_size];
    const int64_t base = static_cast<int64_t>(block) * c_s0 + it.kv_begin * c_s2;
    // Blocks lie at random addresses, so the hardware cannot fetch ahead across them: fetch the rows of the
    // block PREFETCH_BLOCKS ahead into L2 (read in place: all at the block's start; copied: one row per row copied
    // here, spreading the requests over the work).
    const int64_t ahead_start = start + PREFETCH_BLOCKS * block_size;
    const int64_t ahead_rows = std::max<int64_t>(0, std::min(block_size, visible - ahead_start));
    const int64_t ahead = ahead_rows ? static_cast<int64_t>(table[ahead_start / block_size]) * c_s0 + it.kv_begin * c_s2 : 0;
    auto prefetch_row = [&](int64_t t) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t at = ahead + t * c_s1 + h * c_s2;
        for (int64_t byte = 0; byte < head_dim * static_cast<int64_t>(sizeof(T)); byte += 64) {
          __builtin_prefetch(reinterpret_cast<const char*>(k + at) + byte, 0, 2);
          __builtin_prefetch(reinterpret_cast<const char*>(v + at) + byte, 0, 2);
        }
      }
    };
    if constexpr (shared_in_place<T, HEAD_DIM>()) {
      if (shared_blocks[block]) {
        for (int64_t t = 0; t < ahead_rows; ++t) prefetch_row(t);
        attend_block(start, n, k + base, v + base, c_s1, c_s2);
        continue;
      }
    }
    // Into the scratch, row t's heads side by side as in the cache.
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t at = base + t * c_s1 + h * c_s2, to = (t * heads + h) * head_dim;
        if constexpr (read == BlockRead::bf16) {
          copy_head<HEAD_DIM>(k + at, buf.k_bf16.data() + to, head_dim);
          copy_head<HEAD_DIM>(v + at, buf.v_bf16.data() + to, head_dim);
        } else {  // float32 rows as they are (times 1 is exact), others widened
          load_row(k + at, buf.k.data() + to, head_dim, 1.f);
          load_row(v + at, buf.v.data() + to, head_dim, 1.f);
        }
      }
      if (t < ahead_rows) prefetch_row(t);
    }
    for (int64_t t = n; t < ahead_rows; ++t) prefetch_row(t);
    if constexpr (read == BlockRead::bf16)
      attend_block(start, n, static_cast<const T*>(buf.k_bf16.data()), static_cast<const T*>(buf.v_bf16.data()),
                   heads * head_dim, head_dim);
    else
      attend_block(start, n, static_cast<const float*>(buf.k.data()), static_cast<const float*>(buf.v.data()),
                   heads * head_dim, head_dim);
  }
  for (int64_t r = 0; r < rows; ++r) {
    T* o = out + (it.q_begin + token_of(r)) * o_s0 + head_of(r) * o_s1;
    const float inv = buf.row_sum[r] > 0.f ? 1.f / buf.row_sum[r] : 0.f;  // empty context: zeros, not NaN
    const float* ar = acc + r * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) o[d] = static_cast<T>(ar[d] * inv);
  }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
// bfloat16 items on AMX tiles, where the OS grants tile data (tiled_weights_available) and an item's rows per KV
// head fit one tile (tokens x group <= 16: every decode item). The vector path above runs its math after each
// block's loads (30 layers, batch 32, 1,024 tokens, measured apart: copy 34 ms, math 22 ms, together ~58); here the
// math is a few tile instructions and a softmax down 16 lanes per unit of keys, K is read in place by the tile
// loads, and the unit PREFETCH_BLOCKS ahead is fetched (tile loads wait for memory in order): ~50 ms. Measured and
// not kept: no prefetch (~58); that prefetch spread over the unit's work (~56); every head's phase done for all
// heads before the next (56-62); one head at a time with per-row gathers and sums (~52). Items of more rows (prompts)
// take attend_rows_tiles: 32 suffixes of 40 tokens over 352 cached, 30 layers, 140 ms through prompt_attention's
// matmuls, 216-235 with this file's online softmax per unit, 113-118 in two passes. Whole prompts took torch's flash
// attention (SDPA) until its two passes lost their scalar packing of Q and of the output and took exp2_fma and the
// reuse of V: at 7 prompts of 290 tokens 1.7-1.9 ms a layer against 3.9-4.0 (BENCHMARKS.md, issue 41).
//
// Per unit of U keys (32, or 16 where blocks are 16 rows) and group of heads (attend_item_tiles): S^T = K . Q^T
// with K's rows as the A tile straight from the cache and Q^T packed once per item in pairs of dims (the B tile's
// VNNI layout); then O = P . V per head, P as bfloat16 the A tile and V re-packed in pairs of keys by two unpacks a
// register as the B tile. Unpacking works within 128-bit lanes, so the product's 16 columns are dims in a fixed
// permuted order (see tile_dim); the accumulators keep that order and the output undoes it. Keys of a last,
// partial block past the context are never used: their scores are masked, their V pairs packed as zeros (the
// cache there may hold anything, NaN included, and 0 * NaN is NaN).
constexpr bool AMX_ATTENTION = true;
constexpr int64_t TILE_ROWS = 16;

// Rows of an item are taken `per_head` (tokens x group) for each of `heads` KV heads at once: as many heads as
// fit 16 columns of S^T (SmolLM2's decode: all 3 heads, 9 rows).
struct HeadGroup {
  int64_t per_head, heads;
  int64_t rows() const { return per_head * heads; }
};

struct AttentionTiles {  // AMX palette 1; tile numbers as used in attend_item_tiles
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  AttentionTiles(HeadGroup g, int64_t unit) {
    auto set = [&](int tile, int64_t r, int64_t bytes) { rows[tile] = r; colsb[tile] = bytes; };
    set(0, TILE_ROWS, 64);                                                // A: 16 keys x 32 dims of one head
    set(1, TILE_ROWS, g.rows() * 4);                                      // B: Q^T, 16 pairs of dims x rows
    for (int tile : {2, 3}) set(tile, TILE_ROWS, g.rows() * 4);          // C: S^T, 16 keys x rows
    set(4, g.per_head, unit * 2);                                         // A: P of one head, rows x U keys
    set(5, unit / 2, 64);                                                 // B: V, U/2 pairs of keys x 16 dims
    for (int tile : {6, 7}) set(tile, g.per_head, 64);                   // C: O of one head, rows x 16 dims
  }
};

// The dim that column `col` of PV output tile `tile` holds: tile 2c packs the low halves of 128-bit lanes of dims
// 32c..32c+31 (dims 8L..8L+3 of lane L), tile 2c+1 the high halves.
inline int64_t tile_dim(int64_t tile, int64_t col) { return 32 * (tile / 2) + 8 * (col / 4) + 4 * (tile % 2) + col % 4; }

// 2^f for f in [-0.5, 0.5]: degree-5 coefficients fitted for relative error, highest first (cpu_math.h's
// EXP2_FRACTION is the [0, 1) fit that the scalar and AVX2 paths share).
constexpr float EXP2_CENTRED[] = {1.327646555637295e-3f, 9.675541367741063e-3f, 5.550713294140059e-2f,
                                  2.402211972356164e-1f, 6.931469670516625e-1f, 1.000000071654601f};

// exp((x - max) * scale) for a register of scores x, as 2^y with y = x * a + b (a = scale * log2 e, b = -max * a)
// clamped to [-126, 0]: 2^round(y) times a degree-5 polynomial on [-0.5, 0.5] (relative error 7.5e-8), in FMAs.
// Half the instructions of vexp2_bounded's Horner steps on [0, 1), and the softmax's exponentials were ~40% of a
// prompt's attention on tiles.
inline __m512 exp2_fma(__m512 x, __m512 a, __m512 b) {
  const __m512 y = _mm512_max_ps(_mm512_fmadd_ps(x, a, b), _mm512_set1_ps(-126.f));
  const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), f = _mm512_sub_ps(y, n);
  __m512 p = _mm512_set1_ps(EXP2_CENTRED[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_CENTRED[i]));
  return _mm512_scalef_ps(p, n);
}

// One row's output: HEAD_DIM float32 sums in the PV accumulators' column order (tile_dim), times `inv`, rounded to
// bfloat16 and stored in dim order, 32 dims (tiles 2c and 2c + 1 side by side) per permute.
template <int64_t HEAD_DIM>
inline void store_output_row(c10::BFloat16* o, const float* sums, float inv) {
  static const __m512i in_order = [] {  // idx[d]: where dim 32c + d sits among tiles 2c and 2c + 1's 32 values
    alignas(64) int16_t idx[32];
    for (int64_t tile = 0; tile < 2; ++tile)
      for (int64_t col = 0; col < 16; ++col) idx[tile_dim(tile, col)] = static_cast<int16_t>(16 * tile + col);
    return _mm512_load_si512(idx);
  }();
  const fvec scale = vset(inv);
  for (int64_t c = 0; c < HEAD_DIM / 32; ++c) {
    const float* pair = sums + 32 * c;
    const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(vmul(vload(pair + 16), scale), vmul(vload(pair), scale));
    _mm512_storeu_si512(o + 32 * c, _mm512_permutexvar_epi16(in_order, both));
  }
}

// 16 registers of 16 floats transposed in place (row i lane j <-> row j lane i).
inline void transpose16(__m512* r) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i)  // per 128-bit block, r[4i + c] = column c of rows 4i..4i+3
    for (int j = 0; j < 2; ++j) {
      const __m512d a = _mm512_castps_pd(t[4 * i + j]), b = _mm512_castps_pd(t[4 * i + j + 2]);
      r[4 * i + 2 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
      r[4 * i + 2 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + j + 4], 0x88);
      t[8 * i + j + 4] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + j + 4], 0xDD);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xDD);
  }
}

// A unit's V rows (row t at vh + t * row_stride) as the B tiles of O = P . V: keys t and t + 1 side by side in each
// dim's column, DIM_TILES tiles of 16 dims (in tile_dim's order); keys from n on (past the context) are zeros.
template <int64_t HEAD_DIM>
inline void pack_values(const c10::BFloat16* vh, int64_t row_stride, int64_t n, int64_t unit, c10::BFloat16* out) {
  for (int64_t pair = 0; pair < unit / 2; ++pair)
    for (int64_t c = 0; c < HEAD_DIM / 32; ++c) {
      const __m512i zero = _mm512_setzero_si512();
      const __m512i a = 2 * pair < n ? _mm512_loadu_si512(vh + 2 * pair * row_stride + 32 * c) : zero;
      const __m512i b = 2 * pair + 1 < n ? _mm512_loadu_si512(vh + (2 * pair + 1) * row_stride + 32 * c) : zero;
      _mm512_storeu_si512(out + ((2 * c) * TILE_ROWS + pair) * 32, _mm512_unpacklo_epi16(a, b));
      _mm512_storeu_si512(out + ((2 * c + 1) * TILE_ROWS + pair) * 32, _mm512_unpackhi_epi16(a, b));
    }
}

// Per-thread buffers of attend_item_tiles, sized for the largest item.
struct TileScratch {
  std::vector<c10::BFloat16> qt, p, v;  // Q^T per (head, 32 dims) as B tiles; P rows; V pairs as B tiles
  std::vector<float> s, o, acc, correction;  // S^T of a unit; its O per lane; running sums and corrections per lane
  TileScratch(int64_t heads, int64_t head_dim)
      : qt(heads * (head_dim / 32) * TILE_ROWS * 32), p(TILE_ROWS * 32), v((head_dim / 16) * TILE_ROWS * 32),
        s(32 * TILE_ROWS), o(TILE_ROWS * head_dim), acc(TILE_ROWS * head_dim), correction(TILE_ROWS) {}
};

// Scores are transposed, S^T[key][row], one column per row of every head of the group: per head and 32 dims, the
// A tile is that head's keys straight from the cache and the B tile that head's Q^T with the other heads' columns
// zero, so one accumulator sums each row's own head only. The softmax then runs down the 16 lanes at once (a lane
// per row: no gathers, no horizontal sums), keys a row may not see masked out, and P^T is transposed back in
// registers to the A tile of O = P . V per head.
template <int64_t HEAD_DIM>
void attend_item_tiles(const Item& it, TileScratch& buf, HeadGroup group_shape, const c10::BFloat16* q, int64_t q_s0,
                       int64_t q_s1, const c10::BFloat16* k, const c10::BFloat16* v, int64_t c_s0, int64_t c_s1,
                       int64_t c_s2, const int32_t* tables, int64_t t_s0, int64_t block_size, int64_t unit,
                       int64_t group, float scale, c10::BFloat16* out, int64_t o_s0, int64_t o_s1) {
  static_assert(HEAD_DIM % 32 == 0, "pairs of 16-dim tiles");
  constexpr int64_t CHUNKS = HEAD_DIM / 32, DIM_TILES = HEAD_DIM / 16, QT_TILE = TILE_ROWS * 32;
  const int64_t tokens = it.q_end - it.q_begin, heads = it.kv_end - it.kv_begin, per_head = group_shape.per_head;
  const int64_t halves = unit / TILE_ROWS;
  // Row r of a head = (token r / group, query head r % group of its group), as in attend_item; lane = the row's
  // place in its head group, g * per_head + r.
  auto query_row = [&](int64_t h, int64_t r) {
    return q + (it.q_begin + r / group) * q_s0 + ((it.kv_begin + h) * group + r % group) * q_s1;
  };
  const int64_t visible = it.first_pos + tokens;
  const int32_t* table = tables + it.seq * t_s0;
  const int64_t key_stride = c_s1 * 2;  // bytes between a head's consecutive keys
  auto offset = [&](int64_t at) {  // of the unit starting at token `at`, first head of the item
    return static_cast<int64_t>(table[at / block_size]) * c_s0 + (at % block_size) * c_s1 + it.kv_begin * c_s2;
  };
  for (int64_t first = 0; first < heads; first += group_shape.heads) {
    const int64_t in_group = std::min(group_shape.heads, heads - first), lanes = in_group * per_head;
    // Q^T tile (head g, 32 dims c): row (d % 32) / 2, column g * per_head + r, element d % 2; zero elsewhere.
    std::fill_n(buf.qt.data(), in_group * CHUNKS * QT_TILE, c10::BFloat16(0.f));
    for (int64_t g = 0; g < in_group; ++g)
      for (int64_t r = 0; r < per_head; ++r) {
        const c10::BFloat16* row = query_row(first + g, r);
        c10::BFloat16* tiles = buf.qt.data() + g * CHUNKS * QT_TILE + 2 * (g * per_head + r);
        for (int64_t d = 0; d < HEAD_DIM; ++d) tiles[(d / 32) * QT_TILE + ((d % 32) / 2) * 32 + d % 2] = row[d];
      }
    std::fill_n(buf.acc.data(), lanes * HEAD_DIM, 0.f);
    // Running max per lane starts very low but finite, so a lane that has seen nothing yet corrects by exp(0) = 1.
    fvec row_max = vset(-1e30f), row_sum = vzero();
    // Per lane, the position of its token: it sees keys up to there (lanes past `lanes` see nothing).
    alignas(64) int32_t positions[16];
    for (int64_t lane = 0; lane < 16; ++lane)
      positions[lane] = lane < lanes ? static_cast<int32_t>(it.first_pos + (lane % per_head) / group) : -1;
    const __m512i lane_pos = _mm512_load_si512(positions);
    for (int64_t start = 0; start < visible; start += unit) {
      const int64_t n = std::min(unit, visible - start), base = offset(start) + first * c_s2;
      // The unit PREFETCH_BLOCKS ahead, every row of the group's heads, is fetched now.
      const int64_t ahead_start = start + PREFETCH_BLOCKS * unit;
      if (ahead_start < visible) {
        const int64_t ahead = offset(ahead_start) + first * c_s2, rows_ahead = std::min(unit, visible - ahead_start);
        for (int64_t t = 0; t < rows_ahead; ++t)
          for (int64_t g = 0; g < in_group; ++g)
            for (int64_t byte = 0; byte < HEAD_DIM * 2; byte += 64) {
              _mm_prefetch(reinterpret_cast<const char*>(k + ahead + t * c_s1 + g * c_s2) + byte, _MM_HINT_T0);
              _mm_prefetch(reinterpret_cast<const char*>(v + ahead + t * c_s1 + g * c_s2) + byte, _MM_HINT_T0);
            }
      }
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t g = 0; g < in_group; ++g)  // S^T: the unit's first 16 keys into tile 2, its next 16 into 3
        for (int64_t c = 0; c < CHUNKS; ++c) {
          const c10::BFloat16* kg = k + base + g * c_s2 + 32 * c;
          _tile_loadd(1, buf.qt.data() + (g * CHUNKS + c) * QT_TILE, 64);
          _tile_loadd(0, kg, key_stride);
          _tile_dpbf16ps(2, 0, 1);
          if (halves == 2) {
            _tile_loadd(0, kg + TILE_ROWS * c_s1, key_stride);
            _tile_dpbf16ps(3, 0, 1);
          }
        }
      _tile_stored(2, buf.s.data(), 64);
      if (halves == 2) _tile_stored(3, buf.s.data() + TILE_ROWS * TILE_ROWS, 64);
      // Online softmax down the lanes: key t counts for a lane where its position start + t <= the lane's.
      __m512 p[32];
      __mmask16 sees[32];
      fvec new_max = row_max;
      for (int64_t t = 0; t < unit; ++t) {
        sees[t] = t < n ? _mm512_cmpge_epi32_mask(lane_pos, _mm512_set1_epi32(static_cast<int32_t>(start + t))) : 0;
        p[t] = vmul(vload(buf.s.data() + t * TILE_ROWS), vset(scale));
        new_max = _mm512_mask_max_ps(new_max, sees[t], new_max, p[t]);
      }
      const fvec log2e = vset(LOG2_E), shift = vmul(new_max, vset(-LOG2_E));
      // (the correction as a difference: exactly 1 while the max holds, the first units' sentinel max included)
      const fvec correction = vexp2_bounded(vmax(vmul(vsub(row_max, new_max), log2e), vset(-126.f)));
      fvec sum = vzero();
      for (int64_t t = 0; t < unit; ++t) {
        p[t] = _mm512_maskz_mov_ps(sees[t], exp2_fma(p[t], log2e, shift));
        sum = vadd(sum, p[t]);
      }
      row_max = new_max;
      row_sum = vfmadd(row_sum, correction, sum);
      vstore(buf.correction.data(), correction);
      for (int64_t half = 0; half < halves; ++half) transpose16(p + half * TILE_ROWS);  // p[16 half + lane][key]
      for (int64_t lane = 0; lane < lanes; ++lane) {  // P as bfloat16, a row of the A tile per lane
        if (halves == 2)
          _mm512_storeu_si512(buf.p.data() + lane * 32, (__m512i)_mm512_cvtne2ps_pbh(p[TILE_ROWS + lane], p[lane]));
        else
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(buf.p.data() + lane * 32), (__m256i)_mm512_cvtneps_pbh(p[lane]));
      }
      for (int64_t g = 0; g < in_group; ++g) {
        pack_values<HEAD_DIM>(v + base + g * c_s2, c_s1, n, unit, buf.v.data());
        _tile_loadd(4, buf.p.data() + g * per_head * 32, 64);
        for (int64_t t = 0; t < DIM_TILES; t += 2) {  // O = P . V of head g, two accumulators in turn
          _tile_zero(6);
          _tile_zero(7);
          _tile_loadd(5, buf.v.data() + t * TILE_ROWS * 32, 64);
          _tile_dpbf16ps(6, 4, 5);
          _tile_loadd(5, buf.v.data() + (t + 1) * TILE_ROWS * 32, 64);
          _tile_dpbf16ps(7, 4, 5);
          _tile_stored(6, buf.o.data() + g * per_head * HEAD_DIM + t * 16, HEAD_DIM * 4);
          _tile_stored(7, buf.o.data() + g * per_head * HEAD_DIM + (t + 1) * 16, HEAD_DIM * 4);
        }
      }
      for (int64_t lane = 0; lane < lanes; ++lane) {
        float* acc = buf.acc.data() + lane * HEAD_DIM;
        const float* o = buf.o.data() + lane * HEAD_DIM;
        const fvec corr = vset(buf.correction[lane]);
        for (int64_t d = 0; d < HEAD_DIM; d += 16) vstore(acc + d, vfmadd(vload(acc + d), corr, vload(o + d)));
      }
    }
    alignas(64) float sums[16];
    vstore(sums, row_sum);
    for (int64_t lane = 0; lane < lanes; ++lane) {
      const int64_t g = lane / per_head, r = lane % per_head;
      const float inv = sums[lane] > 0.f ? 1.f / sums[lane] : 0.f;  // empty context: zeros, not NaN
      store_output_row<HEAD_DIM>(
          out + (it.q_begin + r / group) * o_s0 + ((it.kv_begin + first + g) * group + r % group) * o_s1,
          buf.acc.data() + lane * HEAD_DIM, inv);
    }
  }
}

// Items of more than 16 rows per KV head (short prompts: a suffix after a prefix-cache hit) on tiles, in two passes
// per head and tile of 16 rows instead of an online softmax: scores for every key the rows see (S^T, a unit of keys
// after another with nothing between them), one softmax down the lanes over all of them, then O = P . V with the
// values of every unit summed in the accumulator tiles. V is packed per KV head for all the item's row tiles, and
// kept for the thread's next item when that is of the same sequence and heads and sees no more keys: items run
// costliest first, so a long prompt's items come to each thread in that order, and each had packed every unit it
// sees (O(context) per 16 tokens, 17% of a 4,096-token prompt's attention).
struct RowScratch {
  std::vector<c10::BFloat16> qt, p, v;  // Q^T of a row tile; P rows over every key; V per head and unit, packed
  std::vector<float> s, o;              // S^T over every key; O of the row tile
  int64_t v_seq = -1, v_heads = -1, v_visible = 0;  // whose V `v` holds: sequence, first KV head, keys packed
};

template <int64_t HEAD_DIM>
void attend_rows_tiles(const Item& it, RowScratch& buf, const c10::BFloat16* q, int64_t q_s0, int64_t q_s1,
                       const c10::BFloat16* k, const c10::BFloat16* v, int64_t c_s0, int64_t c_s1, int64_t c_s2,
                       const int32_t* tables, int64_t t_s0, int64_t block_size, int64_t unit, int64_t group,
                       float scale, c10::BFloat16* out, int64_t o_s0, int64_t o_s1) {
  constexpr int64_t CHUNKS = HEAD_DIM / 32, QT_TILE = TILE_ROWS * 32, V_UNIT = (HEAD_DIM / 16) * TILE_ROWS * 32;
  const int64_t tokens = it.q_end - it.q_begin, rows = tokens * group, halves = unit / TILE_ROWS;
  const int64_t visible = it.first_pos + tokens, units = (visible + unit - 1) / unit, keys = units * unit;
  const int32_t* table = tables + it.seq * t_s0;
  auto offset = [&](int64_t at, int64_t h) {  // of the unit starting at token `at`, KV head h
    return static_cast<int64_t>(table[at / block_size]) * c_s0 + (at % block_size) * c_s1 + h * c_s2;
  };
  buf.qt.resize(CHUNKS * QT_TILE);
  buf.p.resize(TILE_ROWS * keys);
  buf.s.resize(keys * TILE_ROWS);
  buf.o.resize(TILE_ROWS * HEAD_DIM);
  // Packed keys past `visible` are the context's own (finite) values, which this item's probabilities zero.
  if (buf.v_seq != it.seq || buf.v_heads != it.kv_begin || buf.v_visible < visible) {
    buf.v.resize((it.kv_end - it.kv_begin) * units * V_UNIT);
    for (int64_t h = it.kv_begin; h < it.kv_end; ++h)
      for (int64_t u = 0; u < units; ++u)
        pack_values<HEAD_DIM>(v + offset(u * unit, h), c_s1, std::min(unit, visible - u * unit), unit,
                              buf.v.data() + ((h - it.kv_begin) * units + u) * V_UNIT);
    buf.v_seq = it.seq, buf.v_heads = it.kv_begin, buf.v_visible = visible;
  }
  const int64_t v_units = (buf.v_visible + unit - 1) / unit;  // per head in `v`
  for (int64_t h = it.kv_begin; h < it.kv_end; ++h) {
    const c10::BFloat16* vh = buf.v.data() + (h - it.kv_begin) * v_units * V_UNIT;
    for (int64_t first = 0; first < rows; first += TILE_ROWS) {
      const int64_t count = std::min(TILE_ROWS, rows - first);
      // Q^T: row (d % 32) / 2, column (lane) i, element d % 2 (per 32 dims, the rows' pairs of dims transposed
      // as 16 x 16 dwords); lanes past `count` zeros and masked out.
      alignas(64) int32_t positions[16];
      const c10::BFloat16* rows_q[TILE_ROWS];
      for (int64_t i = 0; i < TILE_ROWS; ++i) {
        const int64_t r = first + i;
        positions[i] = i < count ? static_cast<int32_t>(it.first_pos + r / group) : -1;
        rows_q[i] = i < count ? q + (it.q_begin + r / group) * q_s0 + (h * group + r % group) * q_s1 : nullptr;
      }
      for (int64_t c = 0; c < CHUNKS; ++c) {
        __m512 pairs[TILE_ROWS];
        for (int64_t i = 0; i < TILE_ROWS; ++i)
          pairs[i] = rows_q[i] ? _mm512_loadu_ps(rows_q[i] + 32 * c) : _mm512_setzero_ps();
        transpose16(pairs);
        for (int64_t pair = 0; pair < TILE_ROWS; ++pair)
          _mm512_storeu_ps(buf.qt.data() + c * QT_TILE + pair * 32, pairs[pair]);
      }
      const __m512i lane_pos = _mm512_load_si512(positions);
      const int64_t seen = it.first_pos + (first + count - 1) / group + 1;  // keys the tile's last row sees
      const int64_t seen_units = (seen + unit - 1) / unit;
      for (int64_t u = 0; u < seen_units; ++u) {  // pass 1: S^T for every unit the tile sees
        const c10::BFloat16* kh = k + offset(u * unit, h);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t c = 0; c < CHUNKS; ++c) {
          _tile_loadd(1, buf.qt.data() + c * QT_TILE, 64);
          _tile_loadd(0, kh + 32 * c, c_s1 * 2);
          _tile_dpbf16ps(2, 0, 1);
          if (halves == 2) {
            _tile_loadd(0, kh + TILE_ROWS * c_s1 + 32 * c, c_s1 * 2);
            _tile_dpbf16ps(3, 0, 1);
          }
        }
        _tile_stored(2, buf.s.data() + u * unit * TILE_ROWS, 64);
        if (halves == 2) _tile_stored(3, buf.s.data() + (u * unit + TILE_ROWS) * TILE_ROWS, 64);
      }
      // Pass 2: the softmax down the lanes over every key (key t counts where t <= the lane's position).
      const int64_t seen_keys = seen_units * unit;
      auto sees = [&](int64_t t) { return _mm512_cmpge_epi32_mask(lane_pos, _mm512_set1_epi32(static_cast<int32_t>(t))); };
      fvec max = vset(-1e30f), sum = vzero();  // of the unscaled scores (scale > 0)
      for (int64_t t = 0; t < seen; ++t) max = _mm512_mask_max_ps(max, sees(t), max, vload(buf.s.data() + t * TILE_ROWS));
      const fvec a = vset(scale * LOG2_E), b = vmul(max, vset(-scale * LOG2_E));
      for (int64_t t0 = 0; t0 < seen_keys; t0 += TILE_ROWS) {
        __m512 p[TILE_ROWS];
        for (int64_t j = 0; j < TILE_ROWS; ++j) {
          const int64_t t = t0 + j;
          p[j] = _mm512_maskz_mov_ps(t < seen ? sees(t) : 0, exp2_fma(vload(buf.s.data() + t * TILE_ROWS), a, b));
          sum = vadd(sum, p[j]);
        }
        transpose16(p);  // p[lane][key t0 + j]
        for (int64_t i = 0; i < TILE_ROWS; ++i)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(buf.p.data() + i * keys + t0), (__m256i)_mm512_cvtneps_pbh(p[i]));
      }
      // Pass 3: O = P . V over every unit seen, two dim tiles a time accumulating across units.
      for (int64_t t = 0; t < 2 * CHUNKS; t += 2) {
        _tile_zero(6);
        _tile_zero(7);
        for (int64_t u = 0; u < seen_units; ++u) {
          _tile_loadd(4, buf.p.data() + u * unit, keys * 2);
          _tile_loadd(5, vh + u * V_UNIT + t * TILE_ROWS * 32, 64);
          _tile_dpbf16ps(6, 4, 5);
          _tile_loadd(5, vh + u * V_UNIT + (t + 1) * TILE_ROWS * 32, 64);
          _tile_dpbf16ps(7, 4, 5);
        }
        _tile_stored(6, buf.o.data() + t * 16, HEAD_DIM * 4);
        _tile_stored(7, buf.o.data() + (t + 1) * 16, HEAD_DIM * 4);
      }
      alignas(64) float sums[16];
      vstore(sums, sum);
      for (int64_t i = 0; i < count; ++i) {
        const int64_t r = first + i;
        store_output_row<HEAD_DIM>(out + (it.q_begin + r / group) * o_s0 + (h * group + r % group) * o_s1,
                                   buf.o.data() + i * HEAD_DIM, sums[i] > 0.f ? 1.f / sums[i] : 0.f);
      }
    }
  }
}
#else
constexpr bool AMX_ATTENTION = false;
#endif

// Work items, costliest first, for the sequences of fewer than PROMPT_MIN_QUERY new rows: one per (sequence, query
// tile) when there are at least WHOLE_HEADS_PER_THREAD such tiles per thread, else one per KV head of each. Checks
// here, for every sequence, what would otherwise read out of bounds: a context needing more blocks than the table
// has columns (raised as ValueError in Python), before anything is written.
std::vector<Item> plan(const torch::Tensor& context_lens, const torch::Tensor& query_start_loc, int64_t kv_heads,
                       int64_t group, int64_t block_size, int64_t table_width, int64_t threads, int64_t prompt_min,
                       int64_t window) {
  const auto* ctx = context_lens.data_ptr<int32_t>();
  const auto* starts = query_start_loc.data_ptr<int32_t>();
  int64_t tiles = 0;
  for (int64_t s = 0; s < context_lens.size(0); ++s) {
    const int64_t q_len = starts[s + 1] - starts[s];
    if (q_len < prompt_min) tiles += (q_len + TILE_Q - 1) / TILE_Q;
  }
  const int64_t heads_per_item = tiles >= WHOLE_HEADS_PER_THREAD * threads ? kv_heads : 1;
  std::vector<Item> items;
  for (int64_t s = 0; s < context_lens.size(0); ++s) {
    const int64_t q_len = starts[s + 1] - starts[s], context = ctx[s];
    TORCH_CHECK_VALUE((context + block_size - 1) / block_size <= table_width, "block_tables has ", table_width,
                      " columns but a context of ", context, " tokens needs ", (context + block_size - 1) / block_size,
                      " blocks");
    if (q_len >= prompt_min) continue;
    for (int64_t q0 = 0; q0 < q_len; q0 += TILE_Q) {
      const int64_t q1 = std::min(q_len, q0 + TILE_Q);
      const int64_t first_pos = context - q_len + q0;
      const int64_t keys = first_pos + q1 - q0;  // keys up to the tile's last row; a window spans fewer
      const double cost = static_cast<double>((q1 - q0) * group * heads_per_item) *
                          static_cast<double>((window ? std::min(keys, window + q1 - q0 - 1) : keys) + 1);
      for (int64_t h = 0; h < kv_heads; h += heads_per_item)
        items.push_back({s, h, h + heads_per_item, starts[s] + q0, starts[s] + q1, first_pos, cost});
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });
  return items;
}

// Per cache block, 1 where more than one sequence of the batch reads it (a shared prefix, or a parallel sampling's
// or beam's shared blocks), else 0. The block_tables columns past a context are not read.
std::vector<uint8_t> shared_blocks(const torch::Tensor& block_tables, const torch::Tensor& context_lens,
                                   int64_t block_size, int64_t num_blocks) {
  std::vector<uint8_t> readers(num_blocks, 0);
  const auto* tables = block_tables.data_ptr<int32_t>();
  const auto* ctx = context_lens.data_ptr<int32_t>();
  for (int64_t s = 0; s < context_lens.size(0); ++s)
    for (int64_t b = 0; b < (ctx[s] + block_size - 1) / block_size; ++b) {
      const int32_t block = tables[s * block_tables.stride(0) + b];
      if (block >= 0 && block < num_blocks) readers[block] = std::min(readers[block] + 1, 2);
    }
  for (uint8_t& r : readers) r = r > 1;
  return readers;
}

}  // namespace

void prompt_attention(torch::Tensor out, torch::Tensor query, torch::Tensor key_cache, torch::Tensor value_cache,
                      torch::Tensor table, int64_t start, int64_t end, int64_t context, double scale,
                      int64_t window, double softcap);  // prompt_attention_cpu.cpp

// query [tokens, heads, head_dim] (last dim contiguous), caches [blocks, block_size, kv_heads, head_dim]
// (last dim contiguous), block_tables [seqs, width] int32, context_lens [seqs] int32, query_start_loc
// [seqs + 1] int32, out like query (contiguous); window: the sliding window in tokens, 0 for full attention;
// softcap: the attention-logit soft cap, 0 for none. Shapes and value ranges are checked by the Python caller.
void paged_attention(torch::Tensor out, torch::Tensor query, torch::Tensor key_cache, torch::Tensor value_cache,
                     torch::Tensor block_tables, torch::Tensor context_lens, torch::Tensor query_start_loc,
                     double scale, int64_t window, double softcap) {
  const int64_t heads = query.size(1), head_dim = query.size(2);
  const int64_t block_size = key_cache.size(1), kv_heads = key_cache.size(2), group = heads / kv_heads;
  // bfloat16 items run on AMX tiles where the OS grants them (blocks of 16 rows or a multiple: their unit of keys),
  // and then take prompts too, however long. A sliding window or a soft cap keeps to attend_item and
  // prompt_attention (the tile routines mask causally only, and do not cap).
  const bool tiles = AMX_ATTENTION && query.scalar_type() == at::kBFloat16 && (head_dim == 64 || head_dim == 128) &&
                     block_size % 16 == 0 && window == 0 && softcap == 0 &&
                     tiled_weights_available();
  const int64_t prompt_min = tiles ? std::numeric_limits<int64_t>::max() : PROMPT_MIN_QUERY;
  const std::vector<Item> items = plan(context_lens, query_start_loc, kv_heads, group, block_size,
                                       block_tables.size(1), at::get_num_threads(), prompt_min, window);
  const auto* starts = query_start_loc.data_ptr<int32_t>();
  const auto* contexts = context_lens.data_ptr<int32_t>();
  std::vector<std::pair<double, int64_t>> prompts;  // (cost, sequence), costliest first
  for (int64_t s = 0; s < context_lens.size(0); ++s) {
    const int64_t q_len = starts[s + 1] - starts[s];
    if (q_len >= prompt_min) prompts.emplace_back(static_cast<double>(q_len) * contexts[s], s);
  }
  std::sort(prompts.begin(), prompts.end(), std::greater<>());
  auto attend_prompt = [&](int64_t s) {
    prompt_attention(out, query, key_cache, value_cache, block_tables[s], starts[s], starts[s + 1], contexts[s], scale,
                     window, softcap);
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
      constexpr int64_t HEAD_DIM = decltype(fixed_head_dim)::value;
      constexpr BlockRead read = block_read<scalar_t, HEAD_DIM>();
      constexpr bool tile_type = AMX_ATTENTION && std::is_same_v<scalar_t, c10::BFloat16> && HEAD_DIM > 0 &&
                                 HEAD_DIM % 32 == 0;
      // On tiles, items whose rows per KV head fit one tile go to attend_item_tiles, the others (short prompts) to
      // attend_rows_tiles; elsewhere every item to attend_item.
      const int64_t unit = block_size % 32 == 0 ? 32 : 16;
      const bool all_tiles = tile_type && tiles;
      // Only where a shared block is read in place are shared blocks told from private ones.
      const std::vector<uint8_t> shared = shared_in_place<scalar_t, HEAD_DIM>() && !all_tiles
          ? shared_blocks(block_tables, context_lens, block_size, key_cache.size(0)) : std::vector<uint8_t>();
      at::parallel_for(0, workers, 1, [&](int64_t begin, int64_t end) {
        const int64_t item_heads = items[0].kv_end - items[0].kv_begin;  // every item has as many
        Scratch buf(all_tiles ? 0 : TILE_Q * group * item_heads, block_size, item_heads, head_dim, read);
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
        TileScratch tile_buf(tiles ? item_heads : 0, HEAD_DIM > 0 ? HEAD_DIM : 32);
        RowScratch row_buf;
        HeadGroup configured{0, 0};  // the shape the thread's tiles are configured for (none yet)
#endif
        for (int64_t w = begin; w < end; ++w) {
          for (int64_t i = next++; i < static_cast<int64_t>(items.size()); i = next++) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
            if constexpr (tile_type) {
              if (all_tiles) {
                const int64_t per_head = (items[i].q_end - items[i].q_begin) * group;
                const HeadGroup shape = per_head <= TILE_ROWS
                    ? HeadGroup{per_head, std::min(item_heads, TILE_ROWS / per_head)} : HeadGroup{TILE_ROWS, 1};
                if (shape.per_head != configured.per_head || shape.heads != configured.heads) {
                  const AttentionTiles config(shape, unit);
                  _tile_loadconfig(&config);
                  configured = shape;
                }
                if (per_head > TILE_ROWS) {
                  attend_rows_tiles<HEAD_DIM>(items[i], row_buf, q, query.stride(0), query.stride(1), k, v,
                                              key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), tables,
                                              block_tables.stride(0), block_size, unit, group,
                                              static_cast<float>(scale), o, out.stride(0), out.stride(1));
                  continue;
                }
                attend_item_tiles<HEAD_DIM>(items[i], tile_buf, shape, q, query.stride(0), query.stride(1), k, v,
                                            key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), tables,
                                            block_tables.stride(0), block_size, unit, group,
                                            static_cast<float>(scale), o, out.stride(0), out.stride(1));
                continue;
              }
            }
#endif
            attend_item<scalar_t, HEAD_DIM>(
                items[i], buf, q, query.stride(0), query.stride(1), k, v, key_cache.stride(0), key_cache.stride(1),
                key_cache.stride(2), tables, block_tables.stride(0), shared.data(), block_size, group, head_dim,
                static_cast<float>(scale), window, static_cast<float>(softcap), o, out.stride(0), out.stride(1));
          }
        }
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
        if (configured.per_head) _tile_release();
#endif
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
torch::Tensor gelu_tanh_and_mul(torch::Tensor x);                                 // silu_and_mul_cpu.cpp
void reshape_and_cache(torch::Tensor key, torch::Tensor value, torch::Tensor key_cache,
                       torch::Tensor value_cache, torch::Tensor slot_mapping);      // reshape_and_cache_cpu.cpp
torch::Tensor tiled_int4_matmul(torch::Tensor x, torch::Tensor codes, torch::Tensor scales_offsets,
                                int64_t group_size);
torch::Tensor tiled_int8_matmul(torch::Tensor x, torch::Tensor codes, torch::Tensor scales);
torch::Tensor decoder_layers(torch::Tensor hidden, std::vector<torch::Tensor> weights,
                             std::vector<torch::Tensor> key_caches, std::vector<torch::Tensor> value_caches,
                             torch::Tensor cos, torch::Tensor sin, torch::Tensor slot_mapping,
                             torch::Tensor block_tables, torch::Tensor context_lens, torch::Tensor query_start_loc,
                             int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double scale,
                             double eps, std::optional<torch::Tensor> rows,
                             std::vector<int64_t> windows);  // decoder_cpu.cpp

// Every routine runs without the GIL: a step's C++ (one call for all decoder layers) takes most of its time, and
// holding the interpreter meanwhile stopped every other thread of a worker process (the web server's event loop
// in the embedded mode, the token publisher, Celery's) for the whole forward pass (issue 41).
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const auto nogil = py::call_guard<py::gil_scoped_release>();
  m.def("paged_attention", &paged_attention, "paged attention over a varlen batch (CPU)", nogil);
  m.attr("PROMPT_MIN_QUERY") = PROMPT_MIN_QUERY;
  m.def("rotary_embedding", &rotary_embedding, "rotary position embedding of q and k heads, in place (CPU)", nogil);
  m.def("rms_norm", &rms_norm, "RMSNorm of each row (CPU)", nogil);
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up of a fused [gate | up] (CPU)", nogil);
  m.def("gelu_tanh_and_mul", &gelu_tanh_and_mul, "gelu_tanh(gate) * up of a fused [gate | up] (CPU)", nogil);
  m.def("reshape_and_cache", &reshape_and_cache, "new K/V rows into their cache slots (CPU)", nogil);
  m.def("tiled_weights_available", &tiled_weights_available, "whether AMX tiled weight-only matmuls run here");
  m.def("tiled_int4_matmul", &tiled_int4_matmul, "x @ W.T, W int4 in the tiled layout (CPU, AMX)", nogil);
  m.def("tiled_int8_matmul", &tiled_int8_matmul, "x @ W.T, W int8 in the tiled layout (CPU, AMX)", nogil);
  m.def("decoder_layers", &decoder_layers, "a Llama model's decoder layers for one step (CPU)", nogil);
}
