// Paged prefill/extend attention for fp32 on the CPU: the same contract as the Triton
// kernel in kernels/paged_prefill_attention.py, read straight from the paged cache.
//
//    q rows:  | decode rows (left alone) | seq 0: q_len_0 rows | seq 1: q_len_1 rows | ...
//    seq b's context: | cached prefix (seq_len - q_len) | new tokens (q_len) |
//    query i of seq b sits at position seq_len - q_len + i and sees positions <= its own,
//    and with a sliding window only the last `window` of them (older ones are never read).
//
// Why: torch's fused SDPA needs each sequence's K/V gathered out of the cache and repeated
// for every query head of a group, one call per sequence and layer: 1.3-1.9x slower than
// this on a bench prefill step and a chat turn over a long history, 1.1x on one 2048-token
// prompt (`python -m loadtest.attention_bench`).
//
// A work item is one KV head of one sequence and up to kChunk of its query tokens; its
// rows are (token, query head of the group) pairs, token-major, so every row of the item
// reads the same K/V rows. Flash-style: key tiles of kKeys tokens (64 with AVX-512), scores
// for all rows as a register-tiled product against the tile's K transposed (D x kKeys,
// transposed once per call for all items), per row an online-softmax step of its running
// max and sum that turns its scores into weights, then the rows' outputs as a second
// register-tiled product, weights times the tile's V rows. Both products keep several rows'
// sums in registers so each K or V load serves them all: against one row at a time, with
// 16-key tiles, a 3,000-token prompt spent 2.3x as long here (Intel Xeon, 2 threads).
//
// With AVX-512 BF16 the caller may ask for bf16 products (bf16=True) on the far tiles: a
// row's queries, the tile's keys, its softmax weights and values rounded to bf16, sums in
// fp32. One VDPBF16PS does two multiply-adds per lane, twice an FMA's. The first tile and
// the item's own tile(s) stay fp32: this model's largest scores sit there (the first
// tokens, which attention "sinks" on, and the nearest ones), and bf16's 8-bit mantissa on
// them is what put the default model's logprobs up to 6.4e-2 from fp32's with every tile
// in bf16; with those tiles in fp32, at most 3.1e-2 over 700-2,900-token prompts (fp32
// products: 1.3e-2), within the 5e-2 the logprob tests hold (docs/benchmarks.md).
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <utility>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "common.h"
#include "prefill_attention.h"
#include "quant_exports.h"

namespace tokenwire {
namespace {

// SIMD width of the tiles below, as -march=native allows: with AVX-512, 32 registers of 16
// floats; else (AVX2) 16 of 8. A tile keeps kAccRegs of them as accumulators and leaves the
// rest for its operands.
#ifdef __AVX512F__
constexpr int kVec = 16, kAccRegs = 24;
#else
constexpr int kVec = 8, kAccRegs = 12;
#endif
typedef float vecf __attribute__((vector_size(kVec * sizeof(float))));

inline vecf loadv(const float* p) {
  vecf v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

inline void storev(float* p, vecf v) { __builtin_memcpy(p, &v, sizeof v); }

constexpr int kKeyVecs = 4;                          // vectors per row of a key tile
constexpr int64_t kKeys = kKeyVecs * kVec;           // key tile: 64 keys (AVX2: 32)
constexpr int kScoreRows = kAccRegs / kKeyVecs;      // rows per score tile: 6 (AVX2: 3)
template <int D>
constexpr int kOutRows = std::max(1, kAccRegs / (D / kVec));  // rows per output tile
constexpr int64_t kRowPad = 12;  // an item's rows padded to this: every tile height divides it
constexpr int64_t kChunk = 16;   // query tokens per work item
constexpr float kNoMax = -1e30f;  // a row's max before it meets a key (finite: -ffast-math)

struct Item {
  int64_t seq, kv_head, first, count;  // query tokens [first, first + count) of seq
};

// Per-thread buffers of one work item (rows padded to kRowPad; padding rows see no key).
struct Scratch {
  std::vector<float> q, out, scores, max, sum, alpha;
  std::vector<const float*> v_rows;
  std::vector<uint16_t> q16, p16;  // bf16 products: the queries and the tile's weights

  void resize(int64_t rows, int64_t head_dim) {
    const int64_t padded = (rows + kRowPad - 1) / kRowPad * kRowPad;
    q.assign(padded * head_dim, 0.f);
    out.assign(padded * head_dim, 0.f);
    scores.resize(padded * kKeys);
    max.assign(padded, kNoMax);
    sum.assign(padded, 0.f);
    alpha.resize(padded);
    v_rows.resize(kKeys);
  }
};

// scores[r][j] = q[r] . K[j] for R rows against a key tile's K transposed ([D][kKeys]):
// each step of the sum one broadcast per row and kKeyVecs loads of K.
template <int R, int D>
inline void score_rows(const float* q, const float* kt, float* scores) {
  vecf acc[R][kKeyVecs] = {};
  for (int d = 0; d < D; ++d) {
    vecf k[kKeyVecs];
    for (int c = 0; c < kKeyVecs; ++c) k[c] = loadv(kt + d * kKeys + c * kVec);
    for (int r = 0; r < R; ++r) {
      const vecf x = vecf{} + q[r * D + d];
      for (int c = 0; c < kKeyVecs; ++c) acc[r][c] += x * k[c];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kKeyVecs; ++c) storev(scores + r * kKeys + c * kVec, acc[r][c]);
}

#ifdef __AVX512F__
// e^x for x <= 0 in 16 lanes: 2^n * 2^f with n = round(x log2(e)), |f| <= 1/2, 2^f from its
// Taylor series to degree 6 (relative error < 2e-7, fp32's own rounding), n put in by one
// VSCALEFPS (which also takes the -1e30 of a row before its first key to 0). Why not the
// portable loop below, which GCC vectorizes with glibc's expf: that one keeps its accuracy
// over the whole float range, with range checks and more steps, and the softmax was about an
// eighth of the kernel's time; with this one a layer call took 1.06-1.17x less
// (AMD EPYC Zen 4, docs/benchmarks.md).
inline __m512 exp_ps(__m512 x) {
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.693147181f));  // ln 2^f
  __m512 p = _mm512_set1_ps(1.f / 720);
  for (const float c : {1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f})
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, n);
}
#endif

// The tile's scores s of the keys [from, valid) a row sees turned into weights
// exp(score - new max), the others into 0; returns the new max (of `max` and those scores)
// and adds the weights to `total`.
#ifdef __AVX512F__
inline float exp_weights(float* s, int64_t from, int64_t valid, float max, float& total) {
  static_assert(kKeys == 64 && kVec == 16, "one bit of a 64-bit mask per key");
  const uint64_t seen = (valid >= 64 ? ~uint64_t(0) : (uint64_t(1) << valid) - 1) &
                        ~((uint64_t(1) << from) - 1);
  __m512 m = _mm512_set1_ps(max);
  for (int c = 0; c < kKeyVecs; ++c)
    m = _mm512_mask_max_ps(m, __mmask16(seen >> (kVec * c)), m, _mm512_loadu_ps(s + kVec * c));
  const float new_max = _mm512_reduce_max_ps(m);
  const __m512 shift = _mm512_set1_ps(new_max);
  __m512 sum = _mm512_setzero_ps();
  for (int c = 0; c < kKeyVecs; ++c) {
    const __m512 e = _mm512_maskz_mov_ps(
        __mmask16(seen >> (kVec * c)), exp_ps(_mm512_sub_ps(_mm512_loadu_ps(s + kVec * c), shift)));
    _mm512_storeu_ps(s + kVec * c, e);
    sum = _mm512_add_ps(sum, e);
  }
  total += _mm512_reduce_add_ps(sum);
  return new_max;
}
#else
inline float exp_weights(float* s, int64_t from, int64_t valid, float max, float& total) {
  const float new_max = std::max(max, *std::max_element(s + from, s + valid));
  for (int64_t j = 0; j < kKeys; ++j) {
    const float e = std::exp(s[j] - new_max);
    s[j] = j >= from && j < valid ? e : 0.f;
    total += s[j];
  }
  return new_max;
}
#endif

#ifdef __AVX512BF16__
// fp32 -> bf16, rounded to nearest even (as VCVTNE2PS2BF16 does).
inline uint16_t to_bf16(float x) {
  uint32_t u;
  __builtin_memcpy(&u, &x, sizeof u);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

inline __m512bh pair_of(const uint16_t* p) {  // elements p[0], p[1] broadcast to every lane
  int32_t bits;
  __builtin_memcpy(&bits, p, sizeof bits);
  return (__m512bh)_mm512_set1_epi32(bits);
}

inline __m512bh load_bf16(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }

// Where element hd (head * D + d) of key j sits in a bf16 key tile, [Hkv][D/2][kKeys][2]:
// element d of key j beside element d+1, so one VDPBF16PS adds two products to each sum.
inline int64_t key_index_bf16(int64_t hd, int64_t j) { return hd / 2 * 2 * kKeys + j * 2 + hd % 2; }

// Where element d of key j sits in a KV head's bf16 value tile, [kKeys/2][D][2]: element d
// of key j beside that of key j+1.
inline int64_t value_index_bf16(int64_t d, int64_t j, int64_t head_dim) {
  return j / 2 * 2 * head_dim + d * 2 + j % 2;
}

// score_rows in bf16 pairs of query and key elements.
template <int R, int D>
inline void score_rows_bf16(const uint16_t* q, const uint16_t* kt, float* scores) {
  __m512 acc[R][kKeyVecs];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kKeyVecs; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int d = 0; d < D; d += 2) {
    __m512bh k[kKeyVecs];
    for (int c = 0; c < kKeyVecs; ++c) k[c] = load_bf16(kt + d * kKeys + c * 2 * kVec);
    for (int r = 0; r < R; ++r) {
      const __m512bh x = pair_of(q + r * D + d);
      for (int c = 0; c < kKeyVecs; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], x, k[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kKeyVecs; ++c) _mm512_storeu_ps(scores + r * kKeys + c * kVec, acc[r][c]);
}

// add_values in bf16 pairs of keys (a whole tile: kKeys keys, weight 0 past the seen ones).
template <int R, int D>
inline void add_values_bf16(float* out, const uint16_t* p, const float* alpha,
                            const uint16_t* vt) {
  constexpr int C = D / kVec;
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      acc[r][c] = _mm512_mul_ps(_mm512_loadu_ps(out + r * D + c * kVec), _mm512_set1_ps(alpha[r]));
  for (int64_t j = 0; j < kKeys; j += 2) {
    __m512bh v[C];
    for (int c = 0; c < C; ++c) v[c] = load_bf16(vt + j * D + c * 2 * kVec);
    for (int r = 0; r < R; ++r) {
      const __m512bh x = pair_of(p + r * kKeys + j);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], x, v[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + r * D + c * kVec, acc[r][c]);
}
#endif

// One row's online-softmax step over the tile's keys [from, valid) that it sees: its scores
// become the weights exp(score - new max), zero for the keys it does not see, its running
// max and sum move on, and it returns the factor its output so far is rescaled by.
inline float weigh_row(float* s, int64_t from, int64_t valid, float& max, float& sum) {
  if (valid <= from) {
    std::fill(s, s + kKeys, 0.f);
    return 1.f;
  }
  float tile_sum = 0.f;
  const float new_max = exp_weights(s, from, valid, max, tile_sum);
  const float alpha = std::exp(max - new_max);  // 0 on the row's first keys (kNoMax)
  max = new_max;
  sum = sum * alpha + tile_sum;
  return alpha;
}

// out[r] = out[r] * alpha[r] + sum_j p[r][j] V[j] for R rows over the tile's `keys` keys:
// each key one load of its V row and one broadcast per row.
template <int R, int D>
inline void add_values(float* out, const float* p, const float* alpha, int64_t keys,
                       const float* const* v_rows) {
  constexpr int C = D / kVec;
  vecf acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = loadv(out + r * D + c * kVec) * alpha[r];
  for (int64_t j = 0; j < keys; ++j) {
    vecf v[C];
    for (int c = 0; c < C; ++c) v[c] = loadv(v_rows[j] + c * kVec);
    for (int r = 0; r < R; ++r) {
      const vecf pr = vecf{} + p[r * kKeys + j];
      for (int c = 0; c < C; ++c) acc[r][c] += pr * v[c];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) storev(out + r * D + c * kVec, acc[r][c]);
}

struct Args {
  const float *q, *k_cache, *v_cache;
  float* out;
  const int32_t *tables, *starts, *lens;
  int64_t table_stride, block_size, num_heads, num_kv_heads, group, head_dim;
  float scale;
  int64_t window;  // 0: none
  bool bf16;       // the far tiles' products in bf16
  float* k_tiles = nullptr;  // see transpose_keys
  uint16_t *k_tiles_bf16 = nullptr, *v_tiles_bf16 = nullptr;  // bf16 only: see transpose_keys
  std::vector<int64_t> tile_base;  // where each sequence's key tiles start in k_tiles
  std::vector<int64_t> first_tile;  // each sequence's first tile its queries see

  // Whether key tile t is multiplied in bf16 for the query chunk whose first position is
  // `first_pos`: with bf16 on, every tile but the first and those reaching the chunk.
  bool far_bf16(int64_t t, int64_t first_pos) const {
    return bf16 && t >= 1 && (t + 1) * kKeys <= first_pos;
  }

  // The first position the query at position `pos` sees.
  int64_t first_visible(int64_t pos) const {
    return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
  }

  // Where tile t of KV head h of sequence b starts in each tile buffer, in elements.
  int64_t tile_offset(int64_t b, int64_t h, int64_t t) const {
    return ((tile_base[b] + t - first_tile[b]) * num_kv_heads + h) * head_dim * kKeys;
  }

  // Key tile t of KV head h of sequence b, transposed: [head_dim][kKeys].
  float* key_tile(int64_t b, int64_t h, int64_t t) const { return k_tiles + tile_offset(b, h, t); }

  // Offset of context token t's K/V row (all KV heads) of sequence b in the cache.
  int64_t row_offset(int64_t b, int64_t t) const {
    const int64_t block = tables[b * table_stride + t / block_size];
    return (block * block_size + t % block_size) * num_kv_heads;
  }

  // Offset of an item's row r in q and out: query token first + r / group of its
  // sequence, query head r % group of its KV head's group.
  int64_t head_offset(const Item& it, int64_t r) const {
    const int64_t token = starts[it.seq] + it.first + r / group;
    return token * num_heads + it.kv_head * group + r % group;
  }
};

template <int D>
void attend_item(const Args& a, const Item& it, Scratch& s) {
  const int64_t rows = it.count * a.group;
  const int64_t q_len = a.starts[it.seq + 1] - a.starts[it.seq];
  const int64_t first_pos = a.lens[it.seq] - q_len + it.first;  // of the item's first token
  s.resize(rows, D);
  for (int64_t r = 0; r < rows; ++r) {  // the item's queries, scaled, as contiguous rows
    const float* src = a.q + a.head_offset(it, r) * D;
    for (int d = 0; d < D; ++d) s.q[r * D + d] = src[d] * a.scale;
  }
#ifdef __AVX512BF16__
  if (a.far_bf16(1, first_pos)) {  // the item sees a far tile
    s.q16.resize(s.q.size());
    for (size_t i = 0; i < s.q.size(); ++i) s.q16[i] = to_bf16(s.q[i]);
  }
#endif
  const int64_t padded_rows = static_cast<int64_t>(s.max.size());
  const int64_t last_pos = first_pos + it.count - 1, lowest = a.first_visible(first_pos);
  for (int64_t t0 = lowest / kKeys * kKeys; t0 <= last_pos; t0 += kKeys) {
    const int64_t keys = std::min(kKeys, last_pos + 1 - t0);
    const bool far_bf16 = a.far_bf16(t0 / kKeys, first_pos);
    const int64_t offset = a.tile_offset(it.seq, it.kv_head, t0 / kKeys);
    if (far_bf16) {
#ifdef __AVX512BF16__
      for (int64_t r = 0; r < padded_rows; r += kScoreRows)
        score_rows_bf16<kScoreRows, D>(s.q16.data() + r * D, a.k_tiles_bf16 + offset,
                                       s.scores.data() + r * kKeys);
#endif
    } else {
      for (int64_t r = 0; r < padded_rows; r += kScoreRows)
        score_rows<kScoreRows, D>(s.q.data() + r * D, a.k_tiles + offset,
                                  s.scores.data() + r * kKeys);
    }
    for (int64_t r = 0; r < padded_rows; ++r) {  // the tile's keys row r sees: [from, valid)
      const int64_t pos = first_pos + r / a.group;
      const int64_t valid = r < rows ? std::min(keys, pos - t0 + 1) : 0;  // causal
      const int64_t from = std::max<int64_t>(0, a.first_visible(pos) - t0);
      s.alpha[r] = weigh_row(s.scores.data() + r * kKeys, from, valid, s.max[r], s.sum[r]);
    }
    if (far_bf16) {
#ifdef __AVX512BF16__
      s.p16.resize(s.scores.size());
      for (size_t i = 0; i < s.scores.size(); i += 2 * kVec)  // the weights, rounded
        _mm512_storeu_si512(s.p16.data() + i,
                            (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(&s.scores[i + kVec]),
                                                         _mm512_loadu_ps(&s.scores[i])));
      for (int64_t r = 0; r < padded_rows; r += kOutRows<D>)
        add_values_bf16<kOutRows<D>, D>(s.out.data() + r * D, s.p16.data() + r * kKeys,
                                        s.alpha.data() + r, a.v_tiles_bf16 + offset);
#endif
      continue;
    }
    // Keys before the item's window are multiplied by weight 0 but never read: their
    // blocks may be freed and hold anything, NaN included.
    static const float zeros[D] = {};
    for (int64_t j = 0; j < keys; ++j)
      s.v_rows[j] = t0 + j < lowest ? zeros
                                    : a.v_cache + (a.row_offset(it.seq, t0 + j) + it.kv_head) * D;
    for (int64_t r = 0; r < padded_rows; r += kOutRows<D>)
      add_values<kOutRows<D>, D>(s.out.data() + r * D, s.scores.data() + r * kKeys,
                                 s.alpha.data() + r, keys, s.v_rows.data());
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = a.out + a.head_offset(it, r) * D;
    const float inv = 1.f / s.sum[r];
    for (int d = 0; d < D; ++d) dst[d] = s.out[r * D + d] * inv;
  }
}

#ifdef __AVX512BF16__
// Key j of a tile (all KV heads; nullptr: outside the context, zeros) into its bf16 tiles,
// which start at `base`.
void pack_bf16(const Args& a, int64_t base, int64_t j, const float* k_row) {
  const int64_t D = a.head_dim;
  const float* v_row = k_row ? a.v_cache + (k_row - a.k_cache) : nullptr;  // same offset
  for (int64_t hd = 0; hd < a.num_kv_heads * D; ++hd)
    a.k_tiles_bf16[base + key_index_bf16(hd, j)] = to_bf16(k_row ? k_row[hd] : 0.f);
  for (int64_t h = 0; h < a.num_kv_heads; ++h) {
    uint16_t* dst = a.v_tiles_bf16 + base + h * D * kKeys;
    for (int64_t d = 0; d < D; ++d)
      dst[value_index_bf16(d, j, D)] = to_bf16(v_row ? v_row[h * D + d] : 0.f);
  }
}
#endif

// Every sequence's K, transposed a key tile at a time for the score tiles (zeros past the
// context), once per call: every query chunk of a sequence reads the same tiles, and
// transposing them per chunk took a fifth of the kernel's time at 128-2048 tokens.
//    k_tiles: | seq 0: tile 0 [Hkv][D][kKeys] | tile 1 ... | seq 1: tile 0 ... |
// With bf16 products, the keys and values of each tile also in bf16 pairs (key_index_bf16,
// value_index_bf16), in two more buffers of the same tile order. Returns the buffers, to be
// held until the kernel ends.
std::vector<at::Tensor> transpose_keys(Args& a, int64_t batch) {
  std::vector<std::pair<int64_t, int64_t>> tiles;  // (sequence, tile)
  a.tile_base.assign(batch + 1, 0);
  a.first_tile.assign(batch, 0);
  std::vector<int64_t> lowest(batch, 0);  // the first position any query of b sees
  // The first positions of b's first and last query chunks: a tile is needed in fp32 if
  // it is not far for the first chunk, in bf16 if it is far for the last.
  std::vector<int64_t> first_chunk(batch, 0), last_chunk(batch, 0);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t q_len = a.starts[b + 1] - a.starts[b];
    first_chunk[b] = a.lens[b] - q_len;
    last_chunk[b] = first_chunk[b] + std::max<int64_t>(0, q_len - 1) / kChunk * kChunk;
    lowest[b] = a.first_visible(a.lens[b] - q_len);
    a.first_tile[b] = lowest[b] / kKeys;
    const int64_t end = q_len > 0 ? (a.lens[b] + kKeys - 1) / kKeys : a.first_tile[b];
    for (int64_t t = a.first_tile[b]; t < end; ++t) tiles.emplace_back(b, t);
    a.tile_base[b + 1] = a.tile_base[b] + (end - a.first_tile[b]);
  }
  // Every element of a tile that is read is written below: no need to zero them first.
  const int64_t tile_floats = a.num_kv_heads * a.head_dim * kKeys;
  std::vector<at::Tensor> buffers{at::empty({a.tile_base[batch] * tile_floats}, at::kFloat)};
  a.k_tiles = buffers[0].data_ptr<float>();
  if (a.bf16) {
    for (int i = 0; i < 2; ++i)
      buffers.push_back(at::empty({a.tile_base[batch] * tile_floats}, at::kBFloat16));
    a.k_tiles_bf16 = static_cast<uint16_t*>(buffers[1].data_ptr());
    a.v_tiles_bf16 = static_cast<uint16_t*>(buffers[2].data_ptr());
  }
  const int64_t row = a.num_kv_heads * a.head_dim;
  const int64_t num_tiles = static_cast<int64_t>(tiles.size());
  parallel_chunks((num_tiles + 7) / 8, [&](int64_t chunk) {  // 8 tiles a chunk
    for (int64_t i = chunk * 8; i < std::min(num_tiles, chunk * 8 + 8); ++i) {
      const auto [b, t] = tiles[i];
      [[maybe_unused]] const bool fp32 = !a.far_bf16(t, first_chunk[b]),
                                  bf16 = a.far_bf16(t, last_chunk[b]);
      float* dst = a.key_tile(b, 0, t);  // all heads of the tile: [Hkv][D][kKeys]
      for (int64_t j = 0; j < kKeys; ++j) {
        const int64_t pos = t * kKeys + j;
        const bool inside = pos >= lowest[b] && pos < a.lens[b];
        const float* src = inside ? a.k_cache + a.row_offset(b, pos) * a.head_dim : nullptr;
        for (int64_t hd = 0; fp32 && hd < row; ++hd) dst[hd * kKeys + j] = inside ? src[hd] : 0.f;
#ifdef __AVX512BF16__
        if (bf16) pack_bf16(a, a.tile_offset(b, 0, t), j, src);
#endif
      }
    }
  });
  return buffers;
}

void check_args(const at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache,
                const at::Tensor& v_cache, const at::Tensor& block_tables,
                const at::Tensor& query_start_loc, const at::Tensor& seq_lens) {
  for (auto* t : {&out, &q, &k_cache, &v_cache}) check_fp32_contiguous(*t, "q/out/cache");
  TORCH_CHECK(q.dim() == 3 && out.sizes() == q.sizes(), "q and out must be [T, H, D]");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes(),
              "caches must be [num_blocks, block_size, Hkv, D] and alike");
  TORCH_CHECK(k_cache.size(3) == q.size(2) && q.size(1) % k_cache.size(2) == 0,
              "head_dim or head counts do not match the cache");
  TORCH_CHECK(q.size(2) == 64 || q.size(2) == 128 || q.size(2) == 256,
              "head_dim must be 64, 128 or 256, not ", q.size(2));
  for (auto* t : {&block_tables, &query_start_loc, &seq_lens})
    TORCH_CHECK(t->scalar_type() == at::kInt,
                "block_tables, query_start_loc and seq_lens must be int32");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.stride(1) == 1 && seq_lens.is_contiguous() &&
              query_start_loc.is_contiguous(),
              "block_tables rows, seq_lens and query_start_loc must be contiguous");
  const int64_t batch = seq_lens.numel();
  TORCH_CHECK(query_start_loc.numel() == batch + 1 && block_tables.size(0) >= batch,
              "query_start_loc must have batch + 1 entries and block_tables a row per sequence");
  const int32_t* starts = query_start_loc.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int64_t block_size = k_cache.size(1), width = block_tables.size(1);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t q_len = starts[b + 1] - starts[b];
    TORCH_CHECK(starts[b] >= 0 && q_len >= 0 && starts[b + 1] <= q.size(0),
                "query rows of sequence ", b, " are outside q");
    TORCH_CHECK(q_len <= lens[b] && lens[b] <= width * block_size, "seq_len ", lens[b],
                " of sequence ", b, " is shorter than its queries or does not fit the block table");
    for (int64_t j = 0; q_len > 0 && j * block_size < lens[b]; ++j) {
      const int32_t id = tables[b * block_tables.stride(0) + j];
      TORCH_CHECK(id >= 0 && id < k_cache.size(0), "block id ", id, " of sequence ", b,
                  " is outside the cache (", k_cache.size(0), " blocks)");
    }
  }
}

}  // namespace

bool prefill_attention_has_bf16() {
#ifdef __AVX512BF16__
  return true;
#else
  return false;
#endif
}

void paged_prefill_attention(at::Tensor out, at::Tensor q, at::Tensor k_cache,
                             at::Tensor v_cache, at::Tensor block_tables,
                             at::Tensor query_start_loc, at::Tensor seq_lens, double scale,
                             int64_t window, bool bf16) {
  check_args(out, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens);
  TORCH_CHECK(window >= 0, "window must be >= 0 (0: none), not ", window);
  TORCH_CHECK(!bf16 || prefill_attention_has_bf16(),
              "bf16 prefill attention needs AVX-512 BF16, which this build lacks");
  const int64_t num_kv_heads = k_cache.size(2);
  Args args{q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(),
            out.data_ptr<float>(), block_tables.data_ptr<int32_t>(),
            query_start_loc.data_ptr<int32_t>(), seq_lens.data_ptr<int32_t>(),
            block_tables.stride(0), k_cache.size(1), q.size(1), num_kv_heads,
            q.size(1) / num_kv_heads, q.size(2), static_cast<float>(scale), window, bf16};
  const std::vector<at::Tensor> tiles = transpose_keys(args, seq_lens.numel());  // held
  // Causal items differ in work by up to the context length over kChunk (the last chunk of
  // a long prompt reads all of it), so threads take the next item as they finish, not a
  // fixed share. Items of one KV head run in a row (its K/V stay in cache), later chunks
  // (more work) first, so the last items left are the short ones.
  std::vector<Item> items;
  for (int64_t b = 0; b < seq_lens.numel(); ++b) {
    const int64_t q_len = args.starts[b + 1] - args.starts[b];
    for (int64_t h = 0; h < num_kv_heads; ++h)
      for (int64_t first = (q_len - 1) / kChunk * kChunk; first >= 0; first -= kChunk)
        items.push_back({b, h, first, std::min(kChunk, q_len - first)});
  }
  const int64_t count = static_cast<int64_t>(items.size());
  std::atomic<int64_t> next{0};
  parallel_chunks(at::get_num_threads(), [&](int64_t) {
    Scratch scratch;
    for (int64_t i = next++; i < count; i = next++) {
      if (q.size(2) == 64)
        attend_item<64>(args, items[i], scratch);
      else if (q.size(2) == 128)
        attend_item<128>(args, items[i], scratch);
      else  // Gemma 3
        attend_item<256>(args, items[i], scratch);
    }
  });
}

}  // namespace tokenwire
