// CPU kernels for fp32 decode steps: paged decode attention straight from the block
// table, the store of new K/V rows into the cache (alone, or with rope straight from the
// fused qkv projection), and the pointwise ops (RMSNorm with residual add, rotary,
// SiLU-and-mul) each in one pass (the projections' matmul is in
// linear.cpp, prefill attention in prefill_attention.cpp; this file holds the module's
// bindings). Built at first use by kernels/cpu/__init__.py with -march=native.
//
// Why: at decode's few rows per step, torch's versions of these are many small ops
// (gathers, 96 tiny GEMMs per layer, ~10 elementwise kernels per norm) whose
// dispatch and memory traffic cost more than the arithmetic (docs/benchmarks.md).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "common.h"
#include "linear.h"
#include "ops.h"
#include "prefill_attention.h"
#include "quant_exports.h"

using tokenwire::check_fp32_contiguous;
using tokenwire::float8;
using tokenwire::load8;

namespace {

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline float sum8(float8 v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

// The cache lines of one KV block (all its rows are contiguous), asked for ahead of use:
// blocks sit anywhere in the cache, so the hardware prefetcher loses the stream at each one.
// Part `part` of `parts` of the block's lines, so the requests spread over the work on the
// block before it instead of queueing at once.
inline void prefetch_part(const float* block, int64_t bytes, int64_t part, int64_t parts) {
  const int64_t lines = bytes / 64, first = lines * part / parts, last = lines * (part + 1) / parts;
  const char* p = reinterpret_cast<const char*>(block);
  for (int64_t line = first; line < last; ++line) __builtin_prefetch(p + 64 * line);
}

// Query heads [begin, end) of a sequence.
struct Heads {
  int64_t begin, end;
};

// The quant module's exports, once handed over (use_quant_exports): decode attention and
// the row-wise ops then run on its worker pool, whose threads start in a microsecond
// instead of OpenMP's 30-50 us wake-up (which would cost more than splitting a batch-1
// sequence's heads saves) and leave no OpenMP thread spinning beside the matmuls.
std::atomic<const tokenwire::QuantExports*> quant_exports{nullptr};

using tokenwire::parallel_chunks;

// tokenwire::for_row_chunks on parallel_chunks' threads.
template <class F>
void parallel_rows(int64_t rows, int64_t floats_per_row, const F& fn) {
  tokenwire::for_row_chunks(rows, floats_per_row,
                            [](int64_t chunks, const auto& g) { parallel_chunks(chunks, g); }, fn);
}

// Query heads `heads` of a run of `rows` decode rows of one sequence against its paged
// context, head_dim D: row i attends the first len0 + i tokens (one row alone, or a
// verification's 1 + k rows, each one token past the one before). One KV block at a time
// (its rows are contiguous: read from memory once, then from L1 by every query head of
// every row of the run, where rows apart read the context once each). Scores for the
// whole context first, then softmax, then the weighted sum of V rows. Independent
// accumulators in registers (4 tokens at a time for the scores, the D/8 chunks of a head
// for the sum) keep FMAs from waiting on each other. Query heads of a group read the same
// K/V rows (GQA without repeating K/V). A row's operations are those it would run alone.
template <int D>
void attend_run(float* out, const float* q, int64_t rows, int64_t len0,
                const std::vector<int64_t>& row_offsets, int64_t block_size,
                const float* k_cache, const float* v_cache, int64_t num_heads, Heads heads,
                int64_t group, float scale, std::vector<float>& scores) {
  constexpr int C = D / 8;
  const int64_t len = static_cast<int64_t>(row_offsets.size());  // the last row's
  const int64_t block_bytes = block_size * (num_heads / group) * D * 4;
  const int64_t count = heads.end - heads.begin, row_floats = num_heads * D;
  scores.resize(count * rows * len);
  // the scores of query head h of row i (len of them; row i's first len0 + i are used)
  auto row_scores = [&](int64_t h, int64_t i) {
    return scores.data() + ((h - heads.begin) * rows + i) * len;
  };
  for (int64_t start = 0; start < len; start += block_size) {
    const int64_t stop = std::min(len, start + block_size);
    for (int64_t h = heads.begin; h < heads.end; ++h) {
      if (stop < len)
        prefetch_part(k_cache + row_offsets[stop], block_bytes, h - heads.begin, count);
      const float* k = k_cache + (h / group) * D;
      for (int64_t i = 0; i < rows; ++i) {
        const float* qh = q + i * row_floats + h * D;
        float* s = row_scores(h, i);
        const int64_t end = std::min(stop, len0 + i);
        int64_t t = start;
        for (; t + 4 <= end; t += 4) {
          const float *k0 = k + row_offsets[t], *k1 = k + row_offsets[t + 1],
                      *k2 = k + row_offsets[t + 2], *k3 = k + row_offsets[t + 3];
          float8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
          for (int c = 0; c < C; ++c) {
            const float8 qc = load8(qh + 8 * c);
            a0 += qc * load8(k0 + 8 * c);
            a1 += qc * load8(k1 + 8 * c);
            a2 += qc * load8(k2 + 8 * c);
            a3 += qc * load8(k3 + 8 * c);
          }
          s[t] = sum8(a0) * scale, s[t + 1] = sum8(a1) * scale;
          s[t + 2] = sum8(a2) * scale, s[t + 3] = sum8(a3) * scale;
        }
        for (; t < end; ++t) {
          const float* kt = k + row_offsets[t];
          float8 a = {};
          for (int c = 0; c < C; ++c) a += load8(qh + 8 * c) * load8(kt + 8 * c);
          s[t] = sum8(a) * scale;
        }
      }
    }
  }
  std::vector<float8> acc(count * rows * C, float8{});
  for (int64_t h = heads.begin; h < heads.end; ++h) {
    for (int64_t i = 0; i < rows; ++i) {
      float* s = row_scores(h, i);
      const int64_t n = len0 + i;
      const float m = *std::max_element(s, s + n);
      float total = 0.f;
      for (int64_t t = 0; t < n; ++t) {
        s[t] = std::exp(s[t] - m);
        total += s[t];
      }
      for (int64_t t = 0; t < n; ++t) s[t] /= total;
    }
  }
  for (int64_t start = 0; start < len; start += block_size) {
    const int64_t stop = std::min(len, start + block_size);
    for (int64_t h = heads.begin; h < heads.end; ++h) {
      if (stop < len)
        prefetch_part(v_cache + row_offsets[stop], block_bytes, h - heads.begin, count);
      const float* v = v_cache + (h / group) * D;
      for (int64_t i = 0; i < rows; ++i) {
        const float* s = row_scores(h, i);
        float8* row_acc = acc.data() + ((h - heads.begin) * rows + i) * C;
        float8 a[C];
        for (int c = 0; c < C; ++c) a[c] = row_acc[c];
        for (int64_t t = start; t < std::min(stop, len0 + i); ++t) {
          const float* vt = v + row_offsets[t];
          for (int c = 0; c < C; ++c) a[c] += s[t] * load8(vt + 8 * c);
        }
        for (int c = 0; c < C; ++c) row_acc[c] = a[c];
      }
    }
  }
  for (int64_t h = heads.begin; h < heads.end; ++h)
    for (int64_t i = 0; i < rows; ++i)
      for (int c = 0; c < C; ++c)
        __builtin_memcpy(out + i * row_floats + h * D + 8 * c,
                         &acc[((h - heads.begin) * rows + i) * C + c], sizeof(float8));
}

// A run of decode rows (first row, rows) that attend through the same blocks, each one
// token past the one before: a verification's 1 + k rows (engine.speculative).
struct Run {
  int64_t first, rows;
};

// The batch's rows as runs: row b joins the run before it when, without a window, it
// attends one token more than that run's last row through the same block ids (compared up
// to its own length: O(blocks) a row).
std::vector<Run> decode_runs(const int32_t* lens, const int32_t* tables, int64_t table_stride,
                             int64_t batch, int64_t block_size, int64_t window) {
  std::vector<Run> runs;
  for (int64_t b = 0; b < batch; ++b) {
    if (window == 0 && !runs.empty()) {
      Run& run = runs.back();
      const int64_t last = run.first + run.rows - 1;
      const int64_t blocks = (lens[b] + block_size - 1) / block_size;
      if (lens[last] > 0 && lens[b] == lens[last] + 1 &&
          std::equal(tables + b * table_stride, tables + b * table_stride + blocks,
                     tables + last * table_stride)) {
        ++run.rows;
        continue;
      }
    }
    runs.push_back({b, 1});
  }
  return runs;
}

}  // namespace

const tokenwire::QuantExports* tokenwire::borrowed_quant_exports() {
  return quant_exports.load(std::memory_order_acquire);
}

// out, q [B, H, D]; k/v_cache [num_blocks, block_size, Hkv, D]; block_tables [>=B, W]
// int32; seq_lens [>=B] int32 (context length including this step's token; 0: zeros);
// window > 0: only the last `window` tokens of each context are read (a sliding window).
void paged_decode_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache,
                            torch::Tensor v_cache, torch::Tensor block_tables,
                            torch::Tensor seq_lens, double scale, int64_t window) {
  for (auto* t : {&out, &q, &k_cache, &v_cache}) check_fp32_contiguous(*t, "q/out/cache");
  TORCH_CHECK(q.dim() == 3 && out.sizes() == q.sizes(), "q and out must be [B, H, D]");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes(),
              "caches must be [num_blocks, block_size, Hkv, D] and alike");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && seq_lens.scalar_type() == torch::kInt32,
              "block_tables and seq_lens must be int32");
  TORCH_CHECK(block_tables.stride(1) == 1 && seq_lens.is_contiguous(),
              "block_tables rows and seq_lens must be contiguous");
  const int64_t batch = q.size(0), num_heads = q.size(1), head_dim = q.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == head_dim && num_heads % num_kv_heads == 0,
              "head_dim or head counts do not match the cache");
  TORCH_CHECK(head_dim == 64 || head_dim == 128 || head_dim == 256,
              "head_dim must be 64, 128 or 256, not ", head_dim);
  TORCH_CHECK(window >= 0, "window must be >= 0 (0: none), not ", window);
  TORCH_CHECK(block_tables.size(0) >= batch && seq_lens.size(0) >= batch,
              "fewer block-table rows or seq_lens than queries");
  const int64_t width = block_tables.size(1);
  const int64_t table_stride = block_tables.stride(0);
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int64_t num_blocks = k_cache.size(0);
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(lens[b] >= 0 && lens[b] <= width * block_size,
                "seq_len ", lens[b], " does not fit the block table");
    // A bad block id would read outside the cache: refuse it here instead.
    for (int64_t j = 0; j * block_size < lens[b]; ++j) {
      const int32_t id = tables[b * table_stride + j];
      TORCH_CHECK(id >= 0 && id < num_blocks, "block id ", id, " of sequence ", b,
                  " is outside the cache (", num_blocks, " blocks)");
    }
  }
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t group = num_heads / num_kv_heads, row = num_kv_heads * head_dim;
  // Fewer runs than threads, on the worker pool: each one's heads are split into parts,
  // so a lone sequence's attention runs on every core (the K/V lines of a group's heads
  // split between two parts are read by both). Under OpenMP the wake-up would cost more
  // than the split saves.
  const std::vector<Run> runs =
      decode_runs(lens, tables, table_stride, batch, block_size, window);
  const int64_t num_runs = static_cast<int64_t>(runs.size());
  const int64_t threads = tokenwire::borrowed_quant_exports() ? at::get_num_threads() : 1;
  const int64_t parts = std::min(num_heads, std::max<int64_t>(1, threads / num_runs));
  parallel_chunks(num_runs * parts, [&](int64_t chunk) {
    thread_local std::vector<float> scores;
    thread_local std::vector<int64_t> row_offsets;
    const Run run = runs[chunk / parts];
    const int64_t part = chunk % parts, b = run.first, last = run.first + run.rows - 1;
    const Heads heads{num_heads * part / parts, num_heads * (part + 1) / parts};
    float* o = op + b * num_heads * head_dim;
    if (lens[b] == 0) {  // alone in its run
      std::fill(o + heads.begin * head_dim, o + heads.end * head_dim, 0.f);
      return;
    }
    // Where each attended token's K/V row starts (the block table read once per chunk):
    // with a window, tokens before it are never read.
    const int32_t* table = tables + b * table_stride;
    const int64_t first = window > 0 ? std::max<int64_t>(0, lens[b] - window) : 0;
    row_offsets.resize(lens[last] - first);
    for (int64_t t = first; t < lens[last]; ++t)
      row_offsets[t - first] = (static_cast<int64_t>(table[t / block_size]) * block_size
                                + t % block_size) * row;
    const float* qb = qp + b * num_heads * head_dim;
    const float s = static_cast<float>(scale);
    const int64_t len0 = lens[b] - first;
    if (head_dim == 64)
      attend_run<64>(o, qb, run.rows, len0, row_offsets, block_size, kp, vp, num_heads, heads,
                     group, s, scores);
    else if (head_dim == 128)
      attend_run<128>(o, qb, run.rows, len0, row_offsets, block_size, kp, vp, num_heads, heads,
                      group, s, scores);
    else
      attend_run<256>(o, qb, run.rows, len0, row_offsets, block_size, kp, vp, num_heads, heads,
                      group, s, scores);
  });
}

namespace {

// One head in place, neox layout: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
inline void rope_head(float* x, const float* cos, const float* sin, int64_t half) {
  float* x2 = x + half;
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x2[i];
    x[i] = a * cos[i] - b * sin[i];
    x2[i] = b * cos[i] + a * sin[i];
  }
}

void check_positions(const torch::Tensor& positions, int64_t tokens, int64_t max_pos) {
  TORCH_CHECK(positions.scalar_type() == torch::kInt64 && positions.is_contiguous() &&
              positions.numel() == tokens, "positions must be contiguous int64 [T]");
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(pos[t] >= 0 && pos[t] < max_pos, "position ", pos[t], " out of range");
}

void check_slots(const torch::Tensor& slot_mapping, int64_t tokens, int64_t num_slots) {
  TORCH_CHECK(slot_mapping.scalar_type() == torch::kInt64 && slot_mapping.is_contiguous() &&
              slot_mapping.dim() == 1, "slot_mapping must be contiguous int64 [T]");
  TORCH_CHECK(slot_mapping.numel() == tokens, "one slot per k/v row");
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(slots[t] >= -1 && slots[t] < num_slots, "slot ", slots[t], " is outside the cache (",
                num_slots, " slots)");
}

}  // namespace

// New tokens' K/V rows into their cache slots: k/v [T, Hkv, D] (token rows may be strided,
// as the views of a fused qkv projection are; each row's heads contiguous) into
// k/v_cache [num_blocks, block_size, Hkv, D] at slot_mapping [T] int64 (-1: padding, not
// stored). One call per layer instead of two index_copy_ dispatches (the same copy).
void store_kv(torch::Tensor k, torch::Tensor v, torch::Tensor k_cache, torch::Tensor v_cache,
              torch::Tensor slot_mapping) {
  check_fp32_contiguous(k_cache, "k_cache");
  check_fp32_contiguous(v_cache, "v_cache");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes(),
              "caches must be [num_blocks, block_size, Hkv, D] and alike");
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  const int64_t row = k_cache.size(2) * k_cache.size(3);
  for (auto* t : {&k, &v}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == torch::kFloat32, "k/v must be CPU float32");
    TORCH_CHECK(t->dim() == 3 && t->size(1) * t->size(2) == row && t->size(2) == k_cache.size(3),
                "k/v must be [T, Hkv, D] matching the cache");
    TORCH_CHECK(t->stride(2) == 1 && t->stride(1) == t->size(2), "k/v heads must be contiguous rows");
  }
  const int64_t tokens = k.size(0);
  TORCH_CHECK(v.size(0) == tokens, "k and v must have the same rows");
  check_slots(slot_mapping, tokens, num_slots);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* kc = k_cache.data_ptr<float>();
  float* vc = v_cache.data_ptr<float>();
  const int64_t k_stride = k.stride(0), v_stride = v.stride(0);
  parallel_rows(tokens, 2 * row, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (slots[t] < 0) continue;
      std::copy_n(kp + t * k_stride, row, kc + slots[t] * row);
      std::copy_n(vp + t * v_stride, row, vc + slots[t] * row);
    }
  });
}

// Rows of x [..., D]: [weight * x / sqrt(mean(x^2) + eps)]. With a residual, x + residual
// is normalized and returned beside it: [out, x + residual].
std::vector<torch::Tensor> rms_norm(torch::Tensor x_in, torch::Tensor weight, double eps,
                                    std::optional<torch::Tensor> residual_in) {
  const bool add = residual_in.has_value();
  const torch::Tensor x = x_in.contiguous();
  check_fp32_contiguous(x, "x");
  check_fp32_contiguous(weight, "weight");
  const torch::Tensor residual = add ? residual_in->contiguous() : torch::Tensor();
  if (add) {
    check_fp32_contiguous(residual, "residual");
    TORCH_CHECK(residual.sizes() == x.sizes(), "residual must match x");
  }
  const int64_t dim = weight.numel();
  TORCH_CHECK(x.size(-1) == dim, "x and weight do not match");
  torch::Tensor out = torch::empty_like(x);
  torch::Tensor new_residual = add ? torch::empty_like(x) : torch::Tensor();
  const int64_t rows = x.numel() / dim;
  const float* xp = x.data_ptr<float>();
  const float* rp = add ? residual.data_ptr<float>() : nullptr;
  float* np = add ? new_residual.data_ptr<float>() : nullptr;
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  parallel_rows(rows, add ? 3 * dim : dim, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = xp + r * dim;
      if (add) {
        float* sum = np + r * dim;
        const float* res = rp + r * dim;
#pragma omp simd
        for (int64_t i = 0; i < dim; ++i) sum[i] = row[i] + res[i];
        row = sum;
      }
      const float inv = 1.f / std::sqrt(dot(row, row, dim) / dim + static_cast<float>(eps));
      float* o = op + r * dim;
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i) o[i] = wp[i] * (row[i] * inv);
    }
  });
  if (add) return {out, new_residual};
  return {out};
}

// In place on x [T, heads, D] (rows may be strided, heads contiguous), neox layout,
// cos/sin from cos_sin_cache[position].
void rotary(torch::Tensor x, torch::Tensor positions, torch::Tensor cos_sin_cache) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.dim() == 3, "x must be float32 [T, heads, D]");
  TORCH_CHECK(x.stride(2) == 1 && x.stride(1) == x.size(2), "x heads must be contiguous rows");
  check_fp32_contiguous(cos_sin_cache, "cos_sin_cache");
  const int64_t tokens = x.size(0), heads = x.size(1), dim = x.size(2), half = dim / 2;
  TORCH_CHECK(cos_sin_cache.size(1) == dim, "cos_sin_cache does not match x");
  check_positions(positions, tokens, cos_sin_cache.size(0));
  const int64_t token_stride = x.stride(0);
  const int64_t* pos = positions.data_ptr<int64_t>();
  float* xp = x.data_ptr<float>();
  const float* cache = cos_sin_cache.data_ptr<float>();
  parallel_rows(tokens, heads * dim, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* cos = cache + pos[t] * dim;
      for (int64_t h = 0; h < heads; ++h)
        rope_head(xp + t * token_stride + h * dim, cos, cos + half, half);
    }
  });
}

// A step's attention inputs in one pass: qkv [T, (H + 2 Hkv) D] (each token's q,
// k and v heads, as the fused projection gives them) -> q [T, H, D] with rope; k (with
// rope) and v go straight to their cache slots (-1: none), as store_kv would put them.
torch::Tensor qkv_rope_store(torch::Tensor qkv, torch::Tensor positions,
                             torch::Tensor cos_sin_cache, torch::Tensor k_cache,
                             torch::Tensor v_cache, torch::Tensor slot_mapping,
                             int64_t num_heads) {
  for (auto* t : {&qkv, &cos_sin_cache, &k_cache, &v_cache})
    check_fp32_contiguous(*t, "qkv/cos_sin_cache/cache");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes(),
              "caches must be [num_blocks, block_size, Hkv, D] and alike");
  const int64_t kv_heads = k_cache.size(2), dim = k_cache.size(3), half = dim / 2;
  const int64_t tokens = qkv.size(0), row = kv_heads * dim;
  TORCH_CHECK(qkv.dim() == 2 && qkv.size(1) == (num_heads + 2 * kv_heads) * dim,
              "qkv must be [T, (num_heads + 2 kv_heads) head_dim]");
  TORCH_CHECK(cos_sin_cache.size(1) == dim, "cos_sin_cache does not match head_dim");
  check_positions(positions, tokens, cos_sin_cache.size(0));
  check_slots(slot_mapping, tokens, k_cache.size(0) * k_cache.size(1));
  torch::Tensor q = torch::empty({tokens, num_heads, dim}, qkv.options());
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const float* src = qkv.data_ptr<float>();
  const float* cache = cos_sin_cache.data_ptr<float>();
  float *qp = q.data_ptr<float>(), *kc = k_cache.data_ptr<float>(), *vc = v_cache.data_ptr<float>();
  parallel_rows(tokens, qkv.size(1), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* cos = cache + pos[t] * dim;
      const float* in = src + t * qkv.size(1);
      float* qt = qp + t * num_heads * dim;
      std::copy_n(in, num_heads * dim, qt);
      for (int64_t h = 0; h < num_heads; ++h) rope_head(qt + h * dim, cos, cos + half, half);
      if (slots[t] < 0) continue;
      float* kt = kc + slots[t] * row;
      std::copy_n(in + num_heads * dim, row, kt);
      for (int64_t h = 0; h < kv_heads; ++h) rope_head(kt + h * dim, cos, cos + half, half);
      std::copy_n(in + num_heads * dim + row, row, vc + slots[t] * row);
    }
  });
  return q;
}

// A decode-only step's attention in one call: qkv_rope_store, then paged_decode_attention
// of the T queries (one per sequence) -> [T, H * D], the o projection's input. One call
// instead of two and the Python between them, 30 times a step.
torch::Tensor qkv_decode_attention(torch::Tensor qkv, torch::Tensor positions,
                                   torch::Tensor cos_sin_cache, torch::Tensor k_cache,
                                   torch::Tensor v_cache, torch::Tensor slot_mapping,
                                   torch::Tensor block_tables, torch::Tensor seq_lens,
                                   int64_t num_heads, double scale) {
  const torch::Tensor q = qkv_rope_store(qkv, positions, cos_sin_cache, k_cache, v_cache,
                                         slot_mapping, num_heads);
  torch::Tensor out = torch::empty_like(q);
  paged_decode_attention(out, q, k_cache, v_cache, block_tables, seq_lens, scale, 0);
  return out.view({q.size(0), -1});
}

// x [T, 2I] (gate, up) -> [T, I] = silu(gate) * up.
torch::Tensor silu_and_mul(torch::Tensor x_in) {
  const torch::Tensor x = x_in.contiguous();
  check_fp32_contiguous(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 2 == 0, "x must be [T, 2I]");
  const int64_t rows = x.size(0), inter = x.size(1) / 2;
  torch::Tensor out = torch::empty({rows, inter}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  parallel_rows(rows, 2 * inter, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* gate = xp + r * 2 * inter;
      const float* up = gate + inter;
      float* o = op + r * inter;
#pragma omp simd
      for (int64_t i = 0; i < inter; ++i) o[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
    }
  });
  return out;
}

// The GIL is released while a kernel runs (as torch's own ops do), so the server's event
// loop thread keeps running beside the engine thread.
namespace tokenwire {
void bind_decode_stack(py::module_& m);
void bind_gemma_decode_stack(py::module_& m);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const auto no_gil = py::call_guard<py::gil_scoped_release>();
  m.def("paged_decode_attention", &paged_decode_attention, py::arg("out"), py::arg("q"),
        py::arg("k_cache"), py::arg("v_cache"), py::arg("block_tables"), py::arg("seq_lens"),
        py::arg("scale"), py::arg("window") = 0, no_gil);
  m.def("paged_prefill_attention", &tokenwire::paged_prefill_attention, py::arg("out"),
        py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("block_tables"),
        py::arg("query_start_loc"), py::arg("seq_lens"), py::arg("scale"),
        py::arg("window") = 0, py::arg("bf16") = false, no_gil);
  m.def("prefill_attention_has_bf16", &tokenwire::prefill_attention_has_bf16);
  m.def("store_kv", &store_kv, no_gil);
  m.def("rms_norm", &rms_norm, no_gil);
  m.def("rotary", &rotary, no_gil);
  m.def("qkv_rope_store", &qkv_rope_store, no_gil);
  m.def("qkv_decode_attention", &qkv_decode_attention, no_gil);
  m.def("silu_and_mul", &silu_and_mul, no_gil);
  m.def("pack_linear_weight", &tokenwire::pack_linear_weight, no_gil);
  tokenwire::bind_decode_stack(m);
  tokenwire::bind_gemma_decode_stack(m);
  // The quant module's exports(), or None: decode attention on OpenMP again.
  m.def("use_quant_exports", [](std::optional<py::capsule> capsule) {
    const tokenwire::QuantExports* table = nullptr;
    if (capsule) {
      TORCH_CHECK(std::string(capsule->name()) == tokenwire::kQuantExportsCapsule,
                  "not the quant module's exports");
      table = capsule->get_pointer<tokenwire::QuantExports>();
    }
    quant_exports.store(table, std::memory_order_release);
  });
  m.def("packed_linear", &tokenwire::packed_linear, no_gil);
}
