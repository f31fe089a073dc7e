// Weight-only int4 and int8 matmuls on CPUs with AMX, AVX-512 BF16 and VNNI: y = x @ W.T, x bfloat16 [M, K], for the
// tiled layouts that kernels.tiled_weights packs at load (its docstring has them index by index).
//
// Why: at decode batch sizes a matmul reads each weight once, so int4 codes (a quarter of bfloat16's bytes) should
// win; torch's CPU int4 kernel does at one token, but it has no AMX path, so at 64 tokens it ran 4x slower than
// oneDNN's bfloat16 AMX matmul over 4x the bytes (BENCHMARKS.md, issue 14). Vector instructions are dear on these
// machines (a 512-bit FMA issues about once per 2.8 cycles), so both kernels spend as few as they can per weight:
//
// - a tile is 16 outputs (the lanes) x 32 inputs. int4: four 64-byte blocks; in block b, lane n's dword holds
//   inputs 8b..8b+3 in its bytes' low nibbles and 8b+4..8b+7 in the high ones, so one AND (one shift + AND) gives
//   64 unsigned 8-bit codes laid out for `vpdpbusd`. int8: eight 64-byte blocks, lane n's dword j holding inputs
//   4j..4j+3, each code stored plus 128 (unsigned, for `vpdpbusd` too).
// - GEMV (a few tokens): the tokens' inputs are rounded to int8, each 32 with its own scale sx = absmax / 127 (as
//   llama.cpp's Q8 blocks), and multiplied by the codes with `vpdpbusd`, 64 products an instruction. int4, codes
//   c and group scale s, offset o: sum_k w x = sx * (s * sum_k c q + o * sum_k q). int8: sum_k c q is the dot
//   of c + 128 less 128 * sum_k q; then sx, then the row's scale.
// - GEMM (more tokens): each thread takes 32 outputs at a time, decodes their whole K into AMX B tiles of bfloat16
//   weights (int4: w = c * s + o rounded to bfloat16, as the reference de-quantizes; int8: the codes), and runs
//   them against 32 tokens per inner step, eight such pairs of output tiles per pass over the tokens.
// Sums are float32; results round once to bfloat16.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu_math.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__AVX512VNNI__)
#define TILED_WEIGHTS 1
#include <sys/syscall.h>
#include <unistd.h>
#else
#define TILED_WEIGHTS 0
#endif

namespace {

constexpr int64_t TILE_N = 16, TILE_K = 32;  // outputs x inputs of one tile
// GEMV: how far ahead of its loads a thread asks for its codes (measured: 7.4-8 ms a token instead of 10.3 at one
// token, BENCHMARKS.md; the hardware prefetcher alone falls behind).
constexpr int64_t PREFETCH_AHEAD = 4096;
// The most tokens a GEMV takes (its accumulators fill the registers; AMX wins from 9).
constexpr int64_t GEMV_MAX_TOKENS = 8;

#if TILED_WEIGHTS
// The process's permission to use AMX tile data (Linux asks for it once; a VM that does not enable AMX says no).
bool amx_permitted() {
  static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
  return ok;
}

// What a format gives both kernels: `codes_of(tile, j)`, the unsigned 8-bit codes of inputs 4j..4j+3 for each lane
// (what `vpdpbusd` multiplies by the tokens' int8 codes, and what the GEMM decodes), read with the next lines
// prefetched; `block(t, kt)`, the tile's scales; `fold`, a block's integer dot product into the float32 sums
// (GEMV); `value`, codes (as float32) into weights (GEMM); `finish`, a row's last step (both).

// int4: where tiles and the per-(tile, group) scale and offset rows (16 bfloat16 each) live.
struct Int4Tiles {
  const uint8_t* codes;  // [N / 16][K / 32][4 blocks][16 lanes][4 bytes], 256 bytes a tile
  const uint16_t* scales_offsets;  // bfloat16 bits [N / 16][K / G][2][16]
  int64_t k_tiles, groups, tiles_per_group;

  const uint8_t* tile(int64_t t, int64_t kt) const { return codes + (t * k_tiles + kt) * 256; }
  const uint16_t* scales(int64_t t, int64_t kt) const {
    return scales_offsets + (t * groups + kt / tiles_per_group) * 32;
  }
  __m512i codes_of(const uint8_t* tile, int j) const {  // block j / 2's low (even j) or high nibbles
    const uint8_t* line = tile + 64 * (j / 2);
    if (j % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(line + PREFETCH_AHEAD), _MM_HINT_T0);
    const __m512i v = _mm512_loadu_si512(line);
    return _mm512_and_si512(j % 2 ? _mm512_srli_epi16(v, 4) : v, _mm512_set1_epi8(0x0F));
  }
  struct Block { __m512 s, o; };
  Block block(int64_t t, int64_t kt) const { return {vload_bf16(scales(t, kt)), vload_bf16(scales(t, kt) + 16)}; }
  // sum_k w x = sx * (s * sum_k c q + o * sum_k q)
  static __m512 fold(const Block& b, __m512 acc, __m512 dot, float sx, float qsum) {
    acc = _mm512_fmadd_ps(dot, _mm512_mul_ps(b.s, _mm512_set1_ps(sx)), acc);
    return _mm512_fmadd_ps(b.o, _mm512_set1_ps(sx * qsum), acc);
  }
  static __m512 value(const Block& b, __m512 codes) { return _mm512_fmadd_ps(codes, b.s, b.o); }  // c * s + o
  __m512 finish(int64_t, __m512 acc) const { return acc; }
};

struct Int8Tiles {
  const uint8_t* codes;  // code + 128, [N / 16][K / 32][8 dwords][16 lanes][4 bytes], 512 bytes a tile
  const c10::BFloat16* scales;  // one per output row
  int64_t k_tiles;

  const uint8_t* tile(int64_t t, int64_t kt) const { return codes + (t * k_tiles + kt) * 512; }
  __m512i codes_of(const uint8_t* tile, int j) const {
    _mm_prefetch(reinterpret_cast<const char*>(tile + 64 * j + PREFETCH_AHEAD), _MM_HINT_T0);
    return _mm512_loadu_si512(tile + 64 * j);
  }
  struct Block {};
  Block block(int64_t, int64_t) const { return {}; }
  // the codes went in as c + 128: sum_k c q = dot - 128 * sum_k q
  static __m512 fold(const Block&, __m512 acc, __m512 dot, float sx, float qsum) {
    return _mm512_add_ps(acc, _mm512_fmadd_ps(dot, _mm512_set1_ps(sx), _mm512_set1_ps(-128.f * sx * qsum)));
  }
  static __m512 value(const Block&, __m512 codes) { return _mm512_sub_ps(codes, _mm512_set1_ps(128.f)); }
  __m512 finish(int64_t t, __m512 acc) const {
    return _mm512_mul_ps(acc, vload_bf16(reinterpret_cast<const uint16_t*>(scales + t * TILE_N)));
  }
};

// bfloat16(lo) in each lane's low half, bfloat16(hi) in its high half (round to nearest even).
inline __m512i pack_pairs(__m512 lo, __m512 hi) {
  static const __m512i interleave = [] {
    alignas(64) int16_t idx[32];
    for (int n = 0; n < 16; ++n) idx[2 * n] = static_cast<int16_t>(n), idx[2 * n + 1] = static_cast<int16_t>(16 + n);
    return _mm512_load_si512(idx);
  }();
  return _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

inline void store_bf16(c10::BFloat16* out, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), (__m256i)_mm512_cvtneps_pbh(v));
}

// The GEMV's view of the tokens: each block of 32 inputs rounded to int8 with its own scale, absmax / 127, and the
// sum of its codes.
struct Tokens {
  int64_t K;
  std::vector<int8_t> q;  // [M][K]
  std::vector<float> scale, qsum;  // [M][K / 32]

  Tokens(const c10::BFloat16* x, int64_t M, int64_t k) : K(k), q(M * K), scale(M * K / TILE_K), qsum(M * K / TILE_K) {
    const __m512 sign = _mm512_set1_ps(-0.f);
    for (int64_t b = 0; b < M * K / TILE_K; ++b) {  // a block: two registers of 16 inputs
      const uint16_t* v = reinterpret_cast<const uint16_t*>(x + b * TILE_K);
      const __m512 lo = vload_bf16(v), hi = vload_bf16(v + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, lo), _mm512_andnot_ps(sign, hi)));
      const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
      // rounded to nearest even, as std::nearbyint: the default rounding mode
      const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inv)), qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inv));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(&q[b * TILE_K]), _mm512_cvtsepi32_epi8(qlo));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(&q[b * TILE_K + 16]), _mm512_cvtsepi32_epi8(qhi));
      scale[b] = amax / 127.f;
      qsum[b] = static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi)));
    }
  }
  int32_t q4(int64_t m, int64_t k) const {  // the four int8 codes of inputs k..k+3, as one dword to broadcast
    int32_t v;
    std::memcpy(&v, &q[m * K + k], 4);
    return v;
  }
};

// GEMV of output tiles [t0, t1): per block of 32 inputs, each lane's unsigned codes times the tokens' int8 codes
// with `vpdpbusd` (64 products an instruction), the block's integer sums turned into float32 by the format's fold.
template <int M, typename Tiles>
void gemv(const Tiles& w, const Tokens& x, int64_t t0, int64_t t1, c10::BFloat16* y, int64_t N) {
  for (int64_t t = t0; t < t1; ++t) {
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t kt = 0; kt < w.k_tiles; ++kt) {
      const uint8_t* tile = w.tile(t, kt);
      __m512i dot[M][2];
      for (int m = 0; m < M; ++m) dot[m][0] = dot[m][1] = _mm512_setzero_si512();
      for (int j = 0; j < 8; ++j) {
        const __m512i codes = w.codes_of(tile, j);
        for (int m = 0; m < M; ++m)
          dot[m][j & 1] = _mm512_dpbusd_epi32(dot[m][j & 1], codes, _mm512_set1_epi32(x.q4(m, kt * TILE_K + 4 * j)));
      }
      const auto block = w.block(t, kt);
      for (int m = 0; m < M; ++m) {
        const int64_t b = m * (x.K / TILE_K) + kt;
        acc[m] = Tiles::fold(block, acc[m], _mm512_cvtepi32_ps(_mm512_add_epi32(dot[m][0], dot[m][1])), x.scale[b],
                             x.qsum[b]);
      }
    }
    for (int m = 0; m < M; ++m) store_bf16(y + m * N + t * TILE_N, w.finish(t, acc[m]));
  }
}

// Tile (t, kt)'s weights as one AMX B tile (16 rows of 16 bfloat16 pairs, 1 KB) in `out`: lane n of codes_of(j)
// holds inputs 4j..4j+3, i.e. the pairs of B rows 2j and 2j + 1.
template <typename Tiles>
void decode_tile(const Tiles& w, int64_t t, int64_t kt, uint32_t* out) {
  const auto block = w.block(t, kt);
  const __m512i byte = _mm512_set1_epi32(0xFF);
  const auto weight = [&](__m512i codes, int i) {  // byte i of each lane, as a weight
    return Tiles::value(block, _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(codes, 8 * i), byte)));
  };
  for (int j = 0; j < 8; ++j) {
    const __m512i codes = w.codes_of(w.tile(t, kt), j);
    _mm512_storeu_si512(out + 32 * j, pack_pairs(weight(codes, 0), weight(codes, 1)));
    _mm512_storeu_si512(out + 32 * j + 16, pack_pairs(weight(codes, 2), weight(codes, 3)));
  }
}

struct TileConfig {  // AMX palette 1: every tile used here is 16 rows of 64 bytes
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// GEMM of `x` (bfloat16 [Mpad][K], Mpad a multiple of 16, zero rows past M) into y [M][N]. Each thread takes its
// pairs of output tiles (32 outputs) GEMM_PAIRS at a time: decodes their weights for every input into AMX B tiles
// (L2-resident), then for each 32 tokens multiplies them by every pair, so a block of tokens is read from memory
// once per GEMM_PAIRS pairs, not once per pair (at 2,048 tokens that re-reading had made int4 prefill 2x slower
// than bfloat16's). Tiles 0-3 accumulate a 32 x 32 block of sums, 4-5 hold 16 tokens x 32 inputs each, 6-7 a
// pair's weights; each block of sums goes through a small float32 buffer to bfloat16 (the format's finish).
constexpr int64_t GEMM_PAIRS = 8;

template <typename Tiles>
void gemm(const Tiles& w, const c10::BFloat16* x, int64_t M, int64_t m_pad, int64_t K, int64_t N, c10::BFloat16* y) {
  const int64_t k_tiles = K / TILE_K, pairs = N / (2 * TILE_N), a_stride = K * 2;
  at::parallel_for(0, pairs, 1, [&](int64_t begin, int64_t end) {
    const TileConfig config;
    _tile_loadconfig(&config);
    std::vector<uint32_t> buffers(static_cast<size_t>(GEMM_PAIRS * k_tiles) * 512);  // [pair][kt][tile 0, 1]
    alignas(64) float c[32][32];
    for (int64_t first = begin; first < end; first += GEMM_PAIRS) {
      const int64_t last = std::min(end, first + GEMM_PAIRS);
      for (int64_t p = first; p < last; ++p)
        for (int64_t kt = 0; kt < k_tiles; ++kt) {
          uint32_t* b = buffers.data() + ((p - first) * k_tiles + kt) * 512;
          decode_tile(w, 2 * p, kt, b);
          decode_tile(w, 2 * p + 1, kt, b + 256);
        }
      for (int64_t m = 0; m < m_pad; m += 32) {
        const bool two = m + 16 < m_pad;
        for (int64_t p = first; p < last; ++p) {
          const uint32_t* b = buffers.data() + (p - first) * k_tiles * 512;
          _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
          for (int64_t kt = 0; kt < k_tiles; ++kt) {
            _tile_loadd(4, x + m * K + kt * TILE_K, a_stride);
            _tile_loadd(6, b + kt * 512, 64);
            _tile_loadd(7, b + kt * 512 + 256, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            if (two) {
              _tile_loadd(5, x + (m + 16) * K + kt * TILE_K, a_stride);
              _tile_dpbf16ps(2, 5, 6);
              _tile_dpbf16ps(3, 5, 7);
            }
          }
          _tile_stored(0, &c[0][0], 128);
          _tile_stored(1, &c[0][16], 128);
          if (two) {
            _tile_stored(2, &c[16][0], 128);
            _tile_stored(3, &c[16][16], 128);
          }
          for (int64_t r = 0; r < 32 && m + r < M; ++r)
            for (int h = 0; h < 2; ++h)
              store_bf16(y + (m + r) * N + (2 * p + h) * TILE_N, w.finish(2 * p + h, _mm512_load_ps(&c[r][16 * h])));
        }
      }
    }
    _tile_release();
  });
}

// fn<M> for M = 1..8, chosen at run time.
template <typename Fn>
void by_tokens(int64_t M, Fn&& fn) {
  switch (M) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 3: return fn(std::integral_constant<int, 3>{});
    case 4: return fn(std::integral_constant<int, 4>{});
    case 5: return fn(std::integral_constant<int, 5>{});
    case 6: return fn(std::integral_constant<int, 6>{});
    case 7: return fn(std::integral_constant<int, 7>{});
    default: return fn(std::integral_constant<int, 8>{});
  }
}

// y = x @ W.T (x contiguous): the GEMV for a few tokens, else the AMX GEMM.
template <typename Tiles>
torch::Tensor matmul(const torch::Tensor& x, const Tiles& w, int64_t N) {
  TORCH_CHECK(amx_permitted(), "this CPU or its VM does not enable AMX tile data");
  const int64_t M = x.size(0), K = x.size(1);
  auto y = torch::empty({M, N}, x.options());
  c10::BFloat16* out = y.data_ptr<c10::BFloat16>();
  if (M <= GEMV_MAX_TOKENS) {
    const Tokens tokens(x.data_ptr<c10::BFloat16>(), M, K);
    at::parallel_for(0, N / TILE_N, 2, [&](int64_t t0, int64_t t1) {
      by_tokens(M, [&](auto m) { gemv<decltype(m)::value>(w, tokens, t0, t1, out, N); });
    });
  } else {  // AMX reads the tokens 16 rows at a time: zero rows pad a batch that is not a multiple of 16
    const int64_t m_pad = (M + 15) / 16 * 16;
    torch::Tensor tokens = x;
    if (m_pad != M) {
      tokens = torch::zeros({m_pad, K}, x.options());
      tokens.narrow(0, 0, M).copy_(x);
    }
    gemm(w, tokens.data_ptr<c10::BFloat16>(), M, m_pad, K, N, out);
  }
  return y;
}
#endif

}  // namespace

// Shapes, dtypes and contiguity are checked by the Python callers (kernels.tiled_weights).
bool tiled_weights_available() {
#if TILED_WEIGHTS
  return amx_permitted();
#else
  return false;
#endif
}

torch::Tensor tiled_int4_matmul(torch::Tensor x, torch::Tensor codes, torch::Tensor scales_offsets, int64_t group_size) {
#if TILED_WEIGHTS
  const int64_t K = x.size(1);
  const Int4Tiles w{codes.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(scales_offsets.data_ptr<c10::BFloat16>()),
                    K / TILE_K, K / group_size, group_size / TILE_K};
  return matmul(x, w, codes.size(0) * TILE_N);
#else
  TORCH_CHECK(false, "the cpu kernels were built without AMX and AVX-512 BF16");
#endif
}

torch::Tensor tiled_int8_matmul(torch::Tensor x, torch::Tensor codes, torch::Tensor scales) {
#if TILED_WEIGHTS
  const Int8Tiles w{codes.data_ptr<uint8_t>(), scales.data_ptr<c10::BFloat16>(), x.size(1) / TILE_K};
  return matmul(x, w, codes.size(0) * TILE_N);
#else
  TORCH_CHECK(false, "the cpu kernels were built without AMX and AVX-512 BF16");
#endif
}
