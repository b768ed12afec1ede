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
// reads the same K/V rows. Flash-style: key tiles of kKeys tokens, scores for all rows as a
// register-tiled product against the tile's K transposed (D x kKeys, transposed once per
// call for all items), then per row an online-softmax update of its running max, sum and
// output.
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <utility>
#include <vector>

#include "common.h"
#include "panel_tile.h"
#include "prefill_attention.h"
#include "quant_exports.h"

namespace tokenwire {
namespace {

constexpr int64_t kKeys = kPanel;  // key tile: one panel of scores per row
constexpr int64_t kChunk = 16;    // query tokens per work item
constexpr int kRowTile = 6;       // rows per score tile: 12 accumulators in registers

struct Item {
  int64_t seq, kv_head, first, count;  // query tokens [first, first + count) of seq
};

// Per-thread buffers of one work item (rows padded to a multiple of kRowTile).
struct Scratch {
  std::vector<float> q, out, scores, max, sum;
  std::vector<char> started;  // a row has met a visible key (its max and sum are set)
  std::vector<const float*> v_rows;

  void resize(int64_t rows, int64_t head_dim) {
    const int64_t padded = (rows + kRowTile - 1) / kRowTile * kRowTile;
    q.assign(padded * head_dim, 0.f);
    out.assign(rows * head_dim, 0.f);
    scores.resize(padded * kKeys);
    max.assign(rows, 0.f);
    sum.assign(rows, 0.f);
    started.assign(rows, 0);
    v_rows.resize(kKeys);
  }
};

// One row's online-softmax step over `valid` keys of a tile: rescale its output by
// exp(old max - new max), then add sum_j exp(score_j - new max) * V[j].
template <int D>
void update_row(float* out, float& max, float& sum, float* scores, int64_t valid,
                bool first_tile, const float* const* v_rows) {
  constexpr int C = D / 8;
  const float tile_max = *std::max_element(scores, scores + valid);
  const float new_max = first_tile ? tile_max : std::max(max, tile_max);
  // The first tile holds key 0, which every row sees: nothing earlier to rescale.
  const float alpha = first_tile ? 0.f : std::exp(max - new_max);
  float tile_sum = 0.f;
  for (int64_t j = 0; j < valid; ++j) {
    scores[j] = std::exp(scores[j] - new_max);
    tile_sum += scores[j];
  }
  max = new_max;
  sum = sum * alpha + tile_sum;
  float8 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = load8(out + 8 * c) * alpha;
  for (int64_t j = 0; j < valid; ++j)
    for (int c = 0; c < C; ++c) acc[c] += scores[j] * load8(v_rows[j] + 8 * c);
  for (int c = 0; c < C; ++c) store8(out + 8 * c, acc[c]);
}

struct Args {
  const float *q, *k_cache, *v_cache;
  float* out;
  const int32_t *tables, *starts, *lens;
  int64_t table_stride, block_size, num_heads, num_kv_heads, group, head_dim;
  float scale;
  int64_t window;  // 0: none
  float* k_tiles = nullptr;  // see transpose_keys
  std::vector<int64_t> tile_base;  // where each sequence's key tiles start in k_tiles
  std::vector<int64_t> first_tile;  // each sequence's first tile its queries see

  // The first position the query at position `pos` sees.
  int64_t first_visible(int64_t pos) const {
    return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
  }

  // Key tile t of KV head h of sequence b, transposed: [head_dim][kKeys].
  float* key_tile(int64_t b, int64_t h, int64_t t) const {
    return k_tiles + ((tile_base[b] + t - first_tile[b]) * num_kv_heads + h) * head_dim * kKeys;
  }

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
  const int64_t padded_rows = static_cast<int64_t>(s.q.size()) / D;
  const int64_t last_pos = first_pos + it.count - 1;
  for (int64_t t0 = a.first_visible(first_pos) / kKeys * kKeys; t0 <= last_pos; t0 += kKeys) {
    const int64_t keys = std::min(kKeys, last_pos + 1 - t0);
    for (int64_t j = 0; j < keys; ++j)
      s.v_rows[j] = a.v_cache + (a.row_offset(it.seq, t0 + j) + it.kv_head) * D;
    const float* kt = a.key_tile(it.seq, it.kv_head, t0 / kKeys);
    for (int64_t r = 0; r < padded_rows; r += kRowTile)  // scores[r][t] = q[r] . K[t]
      tile<kRowTile>(s.q.data() + r * D, D, kt, nullptr, s.scores.data() + r * kKeys, kKeys,
                     kKeys);
    for (int64_t r = 0; r < rows; ++r) {  // the tile's keys row r sees: [from, valid)
      const int64_t pos = first_pos + r / a.group;
      const int64_t valid = std::min(keys, pos - t0 + 1);  // causal
      const int64_t from = std::max<int64_t>(0, a.first_visible(pos) - t0);
      if (valid > from) {
        update_row<D>(s.out.data() + r * D, s.max[r], s.sum[r],
                      s.scores.data() + r * kKeys + from, valid - from, !s.started[r],
                      s.v_rows.data() + from);
        s.started[r] = 1;
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = a.out + a.head_offset(it, r) * D;
    const float inv = 1.f / s.sum[r];
    for (int d = 0; d < D; ++d) dst[d] = s.out[r * D + d] * inv;
  }
}

// Every sequence's K, transposed a key tile at a time for the score tiles (zeros past the
// context), once per call: every query chunk of a sequence reads the same tiles, and
// transposing them per chunk took a fifth of the kernel's time at 128-2048 tokens.
//    k_tiles: | seq 0: tile 0 [Hkv][D][kKeys] | tile 1 ... | seq 1: tile 0 ... |
at::Tensor transpose_keys(Args& a, int64_t batch) {
  std::vector<std::pair<int64_t, int64_t>> tiles;  // (sequence, tile)
  a.tile_base.assign(batch + 1, 0);
  a.first_tile.assign(batch, 0);
  std::vector<int64_t> lowest(batch, 0);  // the first position any query of b sees
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t q_len = a.starts[b + 1] - a.starts[b];
    lowest[b] = a.first_visible(a.lens[b] - q_len);
    a.first_tile[b] = lowest[b] / kKeys;
    const int64_t end = q_len > 0 ? (a.lens[b] + kKeys - 1) / kKeys : a.first_tile[b];
    for (int64_t t = a.first_tile[b]; t < end; ++t) tiles.emplace_back(b, t);
    a.tile_base[b + 1] = a.tile_base[b] + (end - a.first_tile[b]);
  }
  // Every element is written below: no need to zero it first.
  const int64_t tile_floats = a.num_kv_heads * a.head_dim * kKeys;
  at::Tensor buffer = at::empty({a.tile_base[batch] * tile_floats}, at::kFloat);
  a.k_tiles = buffer.data_ptr<float>();
  const int64_t row = a.num_kv_heads * a.head_dim;
  const int64_t num_tiles = static_cast<int64_t>(tiles.size());
  parallel_chunks((num_tiles + 7) / 8, [&](int64_t chunk) {  // 8 tiles a chunk
    for (int64_t i = chunk * 8; i < std::min(num_tiles, chunk * 8 + 8); ++i) {
      const auto [b, t] = tiles[i];
      float* dst = a.key_tile(b, 0, t);  // all heads of the tile: [Hkv][D][kKeys]
      for (int64_t j = 0; j < kKeys; ++j) {
        const int64_t pos = t * kKeys + j;
        const bool inside = pos >= lowest[b] && pos < a.lens[b];
        const float* src = inside ? a.k_cache + a.row_offset(b, pos) * a.head_dim : nullptr;
        for (int64_t hd = 0; hd < row; ++hd) dst[hd * kKeys + j] = inside ? src[hd] : 0.f;
      }
    }
  });
  return buffer;
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

void paged_prefill_attention(at::Tensor out, at::Tensor q, at::Tensor k_cache,
                             at::Tensor v_cache, at::Tensor block_tables,
                             at::Tensor query_start_loc, at::Tensor seq_lens, double scale,
                             int64_t window) {
  check_args(out, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens);
  TORCH_CHECK(window >= 0, "window must be >= 0 (0: none), not ", window);
  const int64_t num_kv_heads = k_cache.size(2);
  Args args{q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(),
            out.data_ptr<float>(), block_tables.data_ptr<int32_t>(),
            query_start_loc.data_ptr<int32_t>(), seq_lens.data_ptr<int32_t>(),
            block_tables.stride(0), k_cache.size(1), q.size(1), num_kv_heads,
            q.size(1) / num_kv_heads, q.size(2), static_cast<float>(scale), window};
  const at::Tensor k_tiles = transpose_keys(args, seq_lens.numel());  // held until the end
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
