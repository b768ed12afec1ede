// CPU kernels for fp32 decode steps: paged decode attention straight from the block
// table, and the pointwise ops (RMSNorm with residual add, rotary, SiLU-and-mul) each
// in one pass. Built at first use by kernels/cpu/__init__.py with -march=native.
//
// Why: at decode's few rows per step, torch's versions of these are many small ops
// (gathers, 96 tiny GEMMs per layer, ~10 elementwise kernels per norm) whose
// dispatch and memory traffic cost more than the arithmetic (BENCHMARKS.md).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

namespace {

void check_fp32_contiguous(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, " must be float32");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// One sequence: all its query heads against its paged context. Scores for the whole
// context first, then softmax, then the weighted sum of V rows. Each token's K and V rows
// (all KV heads, contiguous) are read once for every query head of their group (GQA
// without repeating K/V).
void attend_one(float* out, const float* q, const float* k_cache, const float* v_cache,
                const int32_t* table, int64_t seq_len, int64_t block_size,
                int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale,
                std::vector<float>& scores, std::vector<float>& acc) {
  const int64_t group = num_heads / num_kv_heads, row = num_kv_heads * head_dim;
  scores.resize(num_heads * seq_len);
  acc.assign(num_heads * head_dim, 0.f);
  auto token_offset = [&](int64_t t) {
    return (static_cast<int64_t>(table[t / block_size]) * block_size + t % block_size) * row;
  };
  for (int64_t t = 0; t < seq_len; ++t) {
    const float* k = k_cache + token_offset(t);
    for (int64_t h = 0; h < num_heads; ++h)
      scores[h * seq_len + t] = dot(q + h * head_dim, k + (h / group) * head_dim, head_dim) * scale;
  }
  std::vector<float> inv_sum(num_heads);
  for (int64_t h = 0; h < num_heads; ++h) {
    float* s = scores.data() + h * seq_len;
    const float m = *std::max_element(s, s + seq_len);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t t = 0; t < seq_len; ++t) {
      s[t] = std::exp(s[t] - m);
      sum += s[t];
    }
    inv_sum[h] = 1.f / sum;
  }
  for (int64_t t = 0; t < seq_len; ++t) {
    const float* v = v_cache + token_offset(t);
    for (int64_t h = 0; h < num_heads; ++h) {
      const float p = scores[h * seq_len + t];
      const float* vh = v + (h / group) * head_dim;
      float* a = acc.data() + h * head_dim;
#pragma omp simd
      for (int64_t d = 0; d < head_dim; ++d) a[d] += p * vh[d];
    }
  }
  for (int64_t h = 0; h < num_heads; ++h)
    for (int64_t d = 0; d < head_dim; ++d)
      out[h * head_dim + d] = acc[h * head_dim + d] * inv_sum[h];
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
  TORCH_CHECK(block_tables.size(0) >= batch && seq_lens.size(0) >= batch,
              "fewer block-table rows or seq_lens than queries");
  const int64_t width = block_tables.size(1);
  const int64_t table_stride = block_tables.stride(0);
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  for (int64_t b = 0; b < batch; ++b)
    TORCH_CHECK(lens[b] >= 0 && lens[b] <= width * block_size,
                "seq_len ", lens[b], " does not fit the block table");
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc;
    for (int64_t b = begin; b < end; ++b) {
      float* o = op + b * num_heads * head_dim;
      if (lens[b] == 0) {
        std::fill(o, o + num_heads * head_dim, 0.f);
        continue;
      }
      attend_one(o, qp + b * num_heads * head_dim, kp, vp, tables + b * table_stride, lens[b],
                 block_size, num_heads, num_kv_heads, head_dim, static_cast<float>(scale),
                 scores, acc);
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention);
  m.def("rms_norm", &rms_norm);
  m.def("rotary", &rotary);
  m.def("silu_and_mul", &silu_and_mul);
}
