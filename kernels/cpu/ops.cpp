// CPU kernels for fp32 decode steps: paged decode attention straight from the block
// table, the store of new K/V rows into the cache, and the pointwise ops (RMSNorm with
// residual add, rotary, SiLU-and-mul) each in one pass (the projections' matmul is in
// linear.cpp, prefill attention in prefill_attention.cpp; this file holds the module's
// bindings). Built at first use by kernels/cpu/__init__.py with -march=native.
//
// Why: at decode's few rows per step, torch's versions of these are many small ops
// (gathers, 96 tiny GEMMs per layer, ~10 elementwise kernels per norm) whose
// dispatch and memory traffic cost more than the arithmetic (BENCHMARKS.md).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "common.h"
#include "linear.h"
#include "prefill_attention.h"

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

// One sequence: all its query heads against its paged context, head_dim D, one KV
// block at a time (its rows are contiguous: read from memory once, then from L1 by every
// query head). Scores for the whole context first, then softmax, then the weighted sum of
// V rows. Independent accumulators in registers (4 tokens at a time for the scores, the
// D/8 chunks of a head for the sum) keep FMAs from waiting on each other. Query heads of
// a group read the same K/V rows (GQA without repeating K/V).
template <int D>
void attend_one(float* out, const float* q, const std::vector<int64_t>& row_offsets,
                int64_t block_size, const float* k_cache, const float* v_cache,
                int64_t num_heads, int64_t group, float scale, std::vector<float>& scores) {
  constexpr int C = D / 8;
  const int64_t len = static_cast<int64_t>(row_offsets.size());
  scores.resize(num_heads * len);
  for (int64_t start = 0; start < len; start += block_size) {
    const int64_t stop = std::min(len, start + block_size);
    for (int64_t h = 0; h < num_heads; ++h) {
      const float* qh = q + h * D;
      const float* k = k_cache + (h / group) * D;
      float* s = scores.data() + h * len;
      int64_t t = start;
      for (; t + 4 <= stop; t += 4) {
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
      for (; t < stop; ++t) {
        const float* kt = k + row_offsets[t];
        float8 a = {};
        for (int c = 0; c < C; ++c) a += load8(qh + 8 * c) * load8(kt + 8 * c);
        s[t] = sum8(a) * scale;
      }
    }
  }
  std::vector<float8> acc(num_heads * C, float8{});
  for (int64_t h = 0; h < num_heads; ++h) {
    float* s = scores.data() + h * len;
    const float m = *std::max_element(s, s + len);
    float total = 0.f;
    for (int64_t i = 0; i < len; ++i) {
      s[i] = std::exp(s[i] - m);
      total += s[i];
    }
    for (int64_t i = 0; i < len; ++i) s[i] /= total;
  }
  for (int64_t start = 0; start < len; start += block_size) {
    const int64_t stop = std::min(len, start + block_size);
    for (int64_t h = 0; h < num_heads; ++h) {
      const float* v = v_cache + (h / group) * D;
      const float* s = scores.data() + h * len;
      float8 a[C];
      for (int c = 0; c < C; ++c) a[c] = acc[h * C + c];
      for (int64_t i = start; i < stop; ++i) {
        const float* vt = v + row_offsets[i];
        for (int c = 0; c < C; ++c) a[c] += s[i] * load8(vt + 8 * c);
      }
      for (int c = 0; c < C; ++c) acc[h * C + c] = a[c];
    }
  }
  for (int64_t h = 0; h < num_heads; ++h)
    for (int c = 0; c < C; ++c) __builtin_memcpy(out + h * D + 8 * c, &acc[h * C + c], sizeof(float8));
}

}  // namespace

// out, q [B, H, D]; k/v_cache [num_blocks, block_size, Hkv, D]; block_tables [>=B, W]
// int32; seq_lens [>=B] int32 (context length including this step's token; 0: zeros).
void paged_decode_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache,
                            torch::Tensor v_cache, torch::Tensor block_tables,
                            torch::Tensor seq_lens, double scale) {
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
  TORCH_CHECK(head_dim == 64 || head_dim == 128, "head_dim must be 64 or 128, not ", head_dim);
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
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<int64_t> row_offsets;
    for (int64_t b = begin; b < end; ++b) {
      float* o = op + b * num_heads * head_dim;
      if (lens[b] == 0) {
        std::fill(o, o + num_heads * head_dim, 0.f);
        continue;
      }
      // Where each context token's K/V row starts: the block table read once per sequence.
      const int32_t* table = tables + b * table_stride;
      row_offsets.resize(lens[b]);
      for (int64_t t = 0; t < lens[b]; ++t)
        row_offsets[t] = (static_cast<int64_t>(table[t / block_size]) * block_size
                          + t % block_size) * row;
      const float* qb = qp + b * num_heads * head_dim;
      const float s = static_cast<float>(scale);
      if (head_dim == 64)
        attend_one<64>(o, qb, row_offsets, block_size, kp, vp, num_heads, group, s, scores);
      else
        attend_one<128>(o, qb, row_offsets, block_size, kp, vp, num_heads, group, s, scores);
    }
  });
}

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
  TORCH_CHECK(slot_mapping.scalar_type() == torch::kInt64 && slot_mapping.is_contiguous() &&
              slot_mapping.dim() == 1, "slot_mapping must be contiguous int64 [T]");
  const int64_t tokens = slot_mapping.numel();
  TORCH_CHECK(k.size(0) == tokens && v.size(0) == tokens, "one slot per k/v row");
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(slots[t] >= -1 && slots[t] < num_slots, "slot ", slots[t], " is outside the cache (",
                num_slots, " slots)");
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* kc = k_cache.data_ptr<float>();
  float* vc = v_cache.data_ptr<float>();
  const int64_t k_stride = k.stride(0), v_stride = v.stride(0);
  at::parallel_for(0, tokens, 256, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (slots[t] < 0) continue;
      std::copy_n(kp + t * k_stride, row, kc + slots[t] * row);
      std::copy_n(vp + t * v_stride, row, vc + slots[t] * row);
    }
  });
}

// Rows of x [..., D]: out = weight * x / sqrt(mean(x^2) + eps). With a residual:
// x + residual is written to new_residual first and normalized.
void rms_norm(torch::Tensor out, torch::Tensor x, torch::Tensor weight, double eps,
              std::optional<torch::Tensor> residual_in, std::optional<torch::Tensor> new_residual_out) {
  const bool add = residual_in.has_value();
  TORCH_CHECK(add == new_residual_out.has_value(), "residual and new_residual go together");
  torch::Tensor residual = add ? *residual_in : torch::Tensor();
  torch::Tensor new_residual = add ? *new_residual_out : torch::Tensor();
  check_fp32_contiguous(out, "out");
  check_fp32_contiguous(x, "x");
  check_fp32_contiguous(weight, "weight");
  if (add) {
    check_fp32_contiguous(residual, "residual");
    check_fp32_contiguous(new_residual, "new_residual");
    TORCH_CHECK(residual.sizes() == x.sizes() && new_residual.sizes() == x.sizes(),
                "residual must match x");
  }
  const int64_t dim = weight.numel();
  TORCH_CHECK(x.size(-1) == dim && out.sizes() == x.sizes(), "x, out and weight do not match");
  const int64_t rows = x.numel() / dim;
  const float* xp = x.data_ptr<float>();
  const float* rp = add ? residual.data_ptr<float>() : nullptr;
  float* np = add ? new_residual.data_ptr<float>() : nullptr;
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
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
}

// In place on x [T, heads, D] (rows may be strided, heads contiguous), neox layout:
// (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), cos/sin from cos_sin_cache[position].
void rotary(torch::Tensor x, torch::Tensor positions, torch::Tensor cos_sin_cache) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.dim() == 3, "x must be float32 [T, heads, D]");
  TORCH_CHECK(x.stride(2) == 1 && x.stride(1) == x.size(2), "x heads must be contiguous rows");
  check_fp32_contiguous(cos_sin_cache, "cos_sin_cache");
  TORCH_CHECK(positions.scalar_type() == torch::kInt64 && positions.is_contiguous(),
              "positions must be contiguous int64");
  const int64_t tokens = x.size(0), heads = x.size(1), dim = x.size(2), half = dim / 2;
  TORCH_CHECK(cos_sin_cache.size(1) == dim && positions.numel() == tokens,
              "cos_sin_cache or positions do not match x");
  const int64_t max_pos = cos_sin_cache.size(0), token_stride = x.stride(0);
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(pos[t] >= 0 && pos[t] < max_pos, "position ", pos[t], " out of range");
  float* xp = x.data_ptr<float>();
  const float* cache = cos_sin_cache.data_ptr<float>();
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* cos = cache + pos[t] * dim;
      const float* sin = cos + half;
      for (int64_t h = 0; h < heads; ++h) {
        float* x1 = xp + t * token_stride + h * dim;
        float* x2 = x1 + half;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float a = x1[i], b = x2[i];
          x1[i] = a * cos[i] - b * sin[i];
          x2[i] = b * cos[i] + a * sin[i];
        }
      }
    }
  });
}

// x [T, 2I] (gate, up) -> out [T, I] = silu(gate) * up.
void silu_and_mul(torch::Tensor out, torch::Tensor x) {
  check_fp32_contiguous(out, "out");
  check_fp32_contiguous(x, "x");
  TORCH_CHECK(x.dim() == 2 && out.dim() == 2 && x.size(0) == out.size(0) &&
              x.size(1) == 2 * out.size(1), "x must be [T, 2I] and out [T, I]");
  const int64_t rows = x.size(0), inter = out.size(1);
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* gate = xp + r * 2 * inter;
      const float* up = gate + inter;
      float* o = op + r * inter;
#pragma omp simd
      for (int64_t i = 0; i < inter; ++i) o[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
    }
  });
}

// The GIL is released while a kernel runs (as torch's own ops do), so the server's event
// loop thread keeps running beside the engine thread.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const auto no_gil = py::call_guard<py::gil_scoped_release>();
  m.def("paged_decode_attention", &paged_decode_attention, no_gil);
  m.def("paged_prefill_attention", &tokenwire::paged_prefill_attention, no_gil);
  m.def("store_kv", &store_kv, no_gil);
  m.def("rms_norm", &rms_norm, no_gil);
  m.def("rotary", &rotary, no_gil);
  m.def("silu_and_mul", &silu_and_mul, no_gil);
  m.def("pack_linear_weight", &tokenwire::pack_linear_weight, no_gil);
  m.def("packed_linear", &tokenwire::packed_linear, no_gil);
}
