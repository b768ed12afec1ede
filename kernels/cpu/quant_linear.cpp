// Python bindings of the weight-only quantized kernels: y = x W^T (+ b) with W kept as codes,
// scales and offsets (quant_kernels.h), and the embedding lookup that unpacks only the rows
// a step reads. Picks the instruction set at run time; callers may force a smaller one.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common.h"
#include "quant_exports.h"
#include "quant_kernels.h"
#include "worker_pool.h"

namespace tokenwire::quant {
namespace {

// A matmul is split into chunks of whole 4-row groups, about kChunksPerThread per thread so
// the caller can take over a late worker's share, and none under kMinChunkMacs
// multiply-adds (~10 us on one core: claiming a chunk costs ~0.1 us).
constexpr int64_t kRows = 4, kChunksPerThread = 4, kMinChunkMacs = int64_t(1) << 17;

// From kDenseRows activation rows on (a long prefill chunk) the weight is unpacked a chunk
// of rows at a time into fp32 scratch (never kept: kDenseChunkFloats of it) and multiplied
// by torch's GEMM with the exact fp32 activations: unpacking each weight row costs the
// same whatever the rows, so it pays only on long chunks; 256 is where it overtook the
// int8 path on the default model's shapes (docs/kernels.md, "Where the CPU thresholds
// come from").
constexpr int64_t kDenseRows = 256, kDenseChunkFloats = int64_t(1) << 20;

// AVX2 has no VNNI, so its int8 dots' cost grows with the rows faster than that of
// unpacking each weight row to fp32 once into cache-sized scratch and multiplying it by the
// exact fp32 rows with fmas (avx2::gemm_unpacked), which wins from a dozen rows on (a
// batched decode step): 12 against the two-level dots, 8 against three (the measured
// crossover per shape is in docs/kernels.md, "Where the CPU thresholds come from").
constexpr int64_t kAvx2UnpackedRows = 12;

// From kPanelRows activation rows on, a CPU with AMX runs sub-32 weights' matmuls on its tiles
// (quant_isa_amx.cpp) at the int8 dots' two levels, prefill chunks included: a tile holds
// 16 rows whatever the count, so below ~8 the VNNI dots are faster, at 12 the tiles lead on
// every shape of the default model (docs/kernels.md, "Where the CPU thresholds come from").
// Without AMX, AVX-512 VNNI runs them from the same count on with the same panels and
// arithmetic (quant_panels.h), its dots broadcasting a row's bytes against 16 weight rows at
// once: the per-block work of scaling and adding is shared by 16 weight rows where the
// row-major dots share it by 4 activation rows, and from 12 rows (a tile of 16 with 4 of
// padding) the panels lead on every shape of the default model (docs/kernels.md, same
// section; on AMD EPYC Zen 4 they run prefill chunks at 1.8-2.4x the dense path's speed).
constexpr int64_t kPanelRows = 12, kPanelChunkBytes = 256 << 10;
// The panels' chunks per thread: fewer than kChunksPerThread, as a thread reads all of the
// activations again for each chunk it takes (2 MB and more for a 2048-row chunk, past L2):
// 2 a thread against 4 made a 2048-row chunk's four matmuls of the default model 1.04x
// faster (the 576-wide outputs 1.02-1.11x, loadtest.matmul_ab, AMD EPYC Zen 4), and
// leaves the caller a late worker's second chunk to take over.
constexpr int64_t kPanelChunksPerThread = 2;

// The first row count at which an instruction set's panels take sub-32 weights' matmuls.
int64_t panel_rows(int64_t isa) {
  return isa == kAmx || isa == kAvx512 ? kPanelRows : std::numeric_limits<int64_t>::max();
}

// The first row count at which an instruction set's path takes x as exact fp32 instead of
// rounded to int8 levels (activation_levels: portable reads 3, AVX2 and AVX-512 2), for a
// weight of sub-blocks of `sub`: on the panels, sub-32 weights never leave the int8 levels.
int64_t exact_rows(int64_t isa, int64_t sub = kBlock) {
  if (sub == kBlock && panel_rows(isa) < kDenseRows) return std::numeric_limits<int64_t>::max();
  return isa == kAvx2 ? kAvx2UnpackedRows : kDenseRows;
}

bool isa_supported(int64_t isa) {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
#ifdef TOKENWIRE_QUANT_EMULATE_AVX512
  if (isa == kAvx512) return true;  // avx512_emulated.h: portable C, runs anywhere
#else
  if (isa == kAmx) return isa_supported(kAvx512) && amx::available();
#endif
  if (isa == kAvx512)
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  if (isa == kAvx2) return avx2;
  return isa == kPortable;
}

int64_t best_isa() {
  for (int64_t isa : {kAmx, kAvx512, kAvx2})
    if (isa_supported(isa)) return isa;
  return kPortable;
}

// tokenwire::for_row_chunks (common.h) on the worker pool.
template <class F>
void pool_rows(int64_t rows, int64_t floats_per_row, const F& fn) {
  for_row_chunks(rows, floats_per_row, [](int64_t chunks, const auto& g) {
    WorkerPool::instance().run(chunks, at::get_num_threads(), g);
  }, fn);
}

// The weight's tensors -> Weights, checked against each other and against in_features k.
Weights weights_of(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& offsets,
                   int64_t bits, int64_t sub, int64_t k) {
  TORCH_CHECK(bits == 4 || bits == 8, "bits must be 4 or 8, got ", bits);
  TORCH_CHECK(sub == 16 || sub == 32, "sub-block must be 16 or 32 weights, got ", sub);
  TORCH_CHECK(k > 0 && k % kBlock == 0, "in_features must be a multiple of 32, got ", k);
  const int64_t kp = (k + kGroup - 1) / kGroup * kGroup;
  TORCH_CHECK(codes.device().is_cpu() && codes.scalar_type() == at::kByte && codes.is_contiguous() &&
                  codes.dim() == 2 && codes.size(1) == code_bytes(kp, int(bits)),
              "codes must be contiguous uint8 [out_features, ", code_bytes(kp, int(bits)), "], got ",
              codes.sizes());
  const bool half = scales.scalar_type() == at::kHalf;
  for (const at::Tensor* t : {&scales, &offsets})
    TORCH_CHECK(t->device().is_cpu() && t->is_contiguous() &&
                    (t->scalar_type() == at::kHalf || t->scalar_type() == at::kFloat) &&
                    t->scalar_type() == scales.scalar_type() && t->dim() == 2 &&
                    t->size(0) == codes.size(0) && t->size(1) == kp / sub,
                "scales and offsets must be contiguous float16 or float32 [out_features, ",
                kp / sub, "] of one type, got ", t->sizes(), " ", t->scalar_type());
  return Weights{codes.data_ptr<uint8_t>(), scales.data_ptr(), offsets.data_ptr(), codes.size(0),
                 kp, int(bits), int(sub), half, kp - k >= kGroup / 2};
}

// The AVX2 kernel reads 8-bit codes against x12: vpmaddubsw would overflow on an unsigned
// code times the first level (2 * 255 * 127), and an int16 dot of code and 128 * p1 + p2 takes
// two levels in one multiply (1.35-1.65x the speed of the sign trick it replaced).
bool needs_x12(int64_t isa, int bits) { return isa == kAvx2 && bits == 8; }

// d or sums of rows 4q..4q+3 ([present][subs], row-major) -> tile q's transposed layout,
// zeros for the rows past `present` (a partial last tile: nothing is read past row m).
void transpose_tile(const float* rows, int64_t present, int64_t subs, int sub, float* out) {
  const int64_t halves = sub == 16 ? 2 : 1, per_group = kGroup / sub;
  for (int64_t g = 0; g < subs / per_group; ++g)
    for (int64_t h = 0; h < halves; ++h)
      for (int64_t b = 0; b < 4; ++b)
        for (int64_t r = 0; r < 4; ++r)
          out[(g * halves + h) * 16 + 4 * b + r] =
              r < present ? rows[r * subs + g * per_group + b * halves + h] : 0.f;
}

// x [m, k] -> its Activations (quant_kernels.h), in buffers private to the calling thread and
// reused by its next call (a tensor allocation each, three per matmul, cost more than a
// decode row's quantization): the levels [m, kp] int8, d and sums [m, kp / sub], where asked
// their 4-row-tile transposes (a last tile of 2 or 3 rows too; the panels do not read them)
// and the first two levels as int16.
Activations quantize_rows(const at::Tensor& x, int64_t kp, int sub, int64_t isa, bool x12,
                          bool tiled_params = true) {
  const int64_t m = x.size(0), k = x.size(1), subs = kp / sub;
  const int64_t tiles = m % 4 > 1 ? m / 4 + 1 : m / 4;
  const int64_t tiled = tiled_params ? 4 * tiles * subs : 0;
  thread_local std::vector<int8_t> levels;
  thread_local std::vector<float> floats;
  thread_local std::vector<int16_t> words;
  levels.resize(kLevels * m * kp);
  floats.resize(2 * m * subs + 2 * tiled);
  words.resize(x12 ? m * kp : 0);
  int8_t* p = levels.data();
  float *d = floats.data(), *sums = d + m * subs;
  float* d4 = tiled_params ? d + 2 * m * subs : nullptr;  // nullptr: not asked for
  float* sums4 = tiled_params ? d4 + tiled : nullptr;
  const float* xp = x.data_ptr<float>();
  auto* quantize_row = isa == kAvx512 ? avx512::quantize_row
                       : isa == kAvx2 ? avx2::quantize_row
                                      : portable::quantize_row;
  int16_t* x12p = x12 ? words.data() : nullptr;
  pool_rows(m, k, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      quantize_row(xp + r * k, k, kp, sub, p + r * kp, m * kp, d + r * subs, sums + r * subs);
      if (!x12p) continue;
      const int8_t *p1 = p + r * kp, *p2 = p1 + m * kp;
      for (int64_t i = 0; i < kp; ++i)
        x12p[r * kp + i] = static_cast<int16_t>(p1[i] * (1 << kLevelShift) + p2[i]);
    }
  });
  for (int64_t t = 0; tiled_params && t < tiles; ++t) {
    const int64_t present = std::min<int64_t>(4, m - 4 * t);
    transpose_tile(d + 4 * t * subs, present, subs, sub, d4 + 4 * t * subs);
    transpose_tile(sums + 4 * t * subs, present, subs, sub, sums4 + 4 * t * subs);
  }
  return Activations{{p, p + m * kp, p + 2 * m * kp}, d, sums, d4, sums4, m, kp, x12p};
}

// x's Activations -> the panels' inputs (quant_kernels.h): levels 1 and 2 from the lo/hi
// order to natural weight order, per 16-row tile, and d times 128; rows split among the
// pool's threads (on one, a 2048-row chunk's repacking took 2-3% of its matmuls' time).
void repack_rows(const Activations& x, int64_t k, panels::Inputs& out) {
  using panels::kTile;
  const int64_t mp = (x.m + kTile - 1) / kTile * kTile, blocks = k / kBlock, subs = x.kp / kBlock;
  out.mp = mp, out.k = k, out.blocks = blocks;
  // Every row below m is written over; only the padding rows of the last tile are zeroed.
  out.levels.resize(2 * mp * k);
  out.d.resize(mp * blocks);
  out.sums.resize(mp * blocks);
  for (int l = 0; l < 2; ++l)
    std::fill(out.levels.begin() + (l * mp + x.m) * k, out.levels.begin() + (l + 1) * mp * k, 0);
  std::fill(out.d.begin() + x.m * blocks, out.d.end(), 0.f);
  std::fill(out.sums.begin() + x.m * blocks, out.sums.end(), 0.f);
  pool_rows(x.m, k, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int l = 0; l < 2; ++l) {
        const int8_t* src = x.p[l] + r * x.kp;
        int8_t* dst = out.levels.data() + (l * mp + r) * k;
        for (int64_t b = 0; b < blocks; ++b) {
          const int64_t at = b / 4 * kGroup + 16 * (b % 4);
          std::memcpy(dst + 32 * b, src + at, 16);
          std::memcpy(dst + 32 * b + 16, src + at + 64, 16);
        }
      }
      for (int64_t b = 0; b < blocks; ++b) {
        out.d[r * blocks + b] = x.d[r * subs + b] * float(1 << kLevelShift);
        out.sums[r * blocks + b] = x.sums[r * subs + b];
      }
    }
  });
}

// The panels' path (AMX tiles or AVX-512 VNNI): x rounded as for the int8 dots, repacked
// for the panels, threads splitting the weight's 16-row panels.
at::Tensor panel_linear(const at::Tensor& x, const Weights& w, const float* bias, int64_t isa) {
  const Activations q = quantize_rows(x, w.kp, w.sub, kAvx512, false, false);
  thread_local panels::Inputs mine;  // the workers below must read this thread's, not theirs
  panels::Inputs& inputs = mine;
  repack_rows(q, x.size(1), inputs);
  auto* gemm = isa == kAmx ? amx::gemm : avx512::gemm_panels;
  at::Tensor out = at::empty({x.size(0), w.n}, x.options());
  float* op = out.data_ptr<float>();
  // A chunk's panels are unpacked once and meet every row from cache: at least
  // kPanelChunksPerThread chunks per thread, none holding more than kPanelChunkBytes of codes,
  // and as many chunks for each thread, their sizes one panel apart at most. (Chunks of a
  // fixed size left one thread a chunk more than the other: 36 panels in 9 chunks of 4
  // kept one of 2 threads idle a ninth of the call.)
  using panels::kTile;
  const int64_t count = (w.n + kTile - 1) / kTile, threads = at::get_num_threads();
  const int64_t most = std::max<int64_t>(1, kPanelChunkBytes / (kTile * w.kp));
  int64_t chunks = std::max(threads * kPanelChunksPerThread, (count + most - 1) / most);
  chunks = std::min(count, (chunks + threads - 1) / threads * threads);
  WorkerPool::instance().run(chunks, int(threads), [&](int64_t c) {
    gemm(w, inputs, bias, op, x.size(0), c * count / chunks, (c + 1) * count / chunks);
  });
  return out;
}

// The dense path: out = x W^T (+ bias), W unpacked kDenseChunkFloats at a time.
at::Tensor dense_linear(const at::Tensor& x, const Weights& w, const std::optional<at::Tensor>& bias,
                        int64_t isa) {
  const int64_t k = x.size(1), rows = std::max<int64_t>(16, kDenseChunkFloats / k);
  auto* unpack = isa == kAvx512 ? avx512::unpack_row
                : isa == kAvx2  ? avx2::unpack_row
                                : portable::unpack_row;
  at::Tensor out = at::empty({x.size(0), w.n}, x.options());
  at::Tensor scratch = at::empty({std::min(rows, w.n), k}, x.options());
  float* buf = scratch.data_ptr<float>();
  for (int64_t n0 = 0; n0 < w.n; n0 += rows) {
    const int64_t count = std::min(rows, w.n - n0);
    WorkerPool::instance().run((count + 15) / 16, at::get_num_threads(), [&](int64_t c) {
      for (int64_t j = 16 * c; j < std::min(count, 16 * c + 16); ++j) unpack(w, n0 + j, k, buf + j * k);
    });
    const at::Tensor weight = scratch.narrow(0, 0, count);
    at::Tensor part = bias ? at::addmm(bias->narrow(0, n0, count), x, weight.t())
                           : at::mm(x, weight.t());
    out.narrow(1, n0, count).copy_(part);
  }
  return out;
}

// AVX2's small-batch path: out = x W^T (+ bias) with x exact, laid out once as panels of 8
// rows, threads splitting the weight rows in chunks of 16 (each unpacked once, its scratch
// private to the thread).
at::Tensor unpacked_linear(const at::Tensor& x, const Weights& w, const float* bias) {
  const int64_t m = x.size(0), k = x.size(1), chunks = (w.n + 15) / 16;
  at::Tensor out = at::empty({m, w.n}, x.options());
  at::Tensor xt = at::empty({(m + 7) / 8 * 8, k}, x.options());
  avx2::pack_rows(x.data_ptr<float>(), m, k, xt.data_ptr<float>());
  const float* xtp = xt.data_ptr<float>();
  float* op = out.data_ptr<float>();
  WorkerPool::instance().run(chunks, at::get_num_threads(), [&](int64_t c) {
    avx2::gemm_unpacked(w, xtp, m, k, bias, op, 16 * c, std::min(w.n, 16 * c + 16));
  });
  return out;
}

// x [M, K] fp32 -> [M, N]; isa -1 picks the best this CPU has.
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                        const at::Tensor& offsets, int64_t bits, int64_t sub,
                        const std::optional<at::Tensor>& bias, int64_t isa) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous() &&
                  x.dim() == 2, "x must be contiguous float32 [rows, in_features]");
  const Weights w = weights_of(codes, scales, offsets, bits, sub, x.size(1));
  if (isa < 0) isa = best_isa();
  TORCH_CHECK(isa_supported(isa), "instruction set ", isa, " is not available on this CPU");
  const float* bias_ptr = nullptr;
  if (bias) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                bias->numel() == w.n, "bias must be contiguous float32 [out_features]");
    bias_ptr = bias->data_ptr<float>();
  }
  if (w.sub == kBlock && x.size(0) >= panel_rows(isa)) return panel_linear(x, w, bias_ptr, isa);
  if (isa == kAmx) isa = kAvx512;
  if (x.size(0) >= kDenseRows) return dense_linear(x, w, bias, isa);
  if (x.size(0) >= exact_rows(isa)) return unpacked_linear(x, w, bias_ptr);
  const Activations q = quantize_rows(x, w.kp, w.sub, isa, needs_x12(isa, w.bits));
  at::Tensor out = at::empty({x.size(0), w.n}, x.options());
  const Gemm g{w, q, bias_ptr, out.data_ptr<float>()};
  auto* gemm = isa == kAvx512 ? avx512::gemm : isa == kAvx2 ? avx2::gemm : portable::gemm;
  // Threads split the weight rows: each streams its own part of the weight once.
  const int threads = at::get_num_threads();
  const int64_t groups = (w.n + kRows - 1) / kRows, group_macs = kRows * w.kp * q.m;
  const int64_t per_chunk = std::max((kMinChunkMacs + group_macs - 1) / group_macs,
                                     (groups + threads * kChunksPerThread - 1) /
                                         (threads * kChunksPerThread));
  WorkerPool::instance().run((groups + per_chunk - 1) / per_chunk, threads, [&](int64_t c) {
    gemm(g, c * per_chunk * kRows, std::min(w.n, (c + 1) * per_chunk * kRows));
  });
  return out;
}

// ids [T] -> fp32 rows [T, K]: w = scale * code + offset, rounded once where the source
// format rounds once (`fused`: ggml's d * (q - zero)) and twice where it rounds the product
// first (d * q + m), so the values equal ggml's own dequantization bit for bit.
at::Tensor quant_embedding(const at::Tensor& ids, const at::Tensor& codes, const at::Tensor& scales,
                           const at::Tensor& offsets, int64_t bits, int64_t sub, int64_t k,
                           bool fused) {
  const Weights w = weights_of(codes, scales, offsets, bits, sub, k);
  TORCH_CHECK(ids.scalar_type() == at::kLong && ids.dim() == 1, "ids must be int64 [T]");
  const at::Tensor idc = ids.contiguous();
  const int64_t t = idc.numel();
  const int64_t* ip = idc.data_ptr<int64_t>();
  for (int64_t i = 0; i < t; ++i)
    TORCH_CHECK(ip[i] >= 0 && ip[i] < w.n, "token id ", ip[i], " out of range");
  at::Tensor out = at::empty({t, k}, at::TensorOptions().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  pool_rows(t, k, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const WeightRow row = weight_row(w, ip[i]);
      for (int64_t j = 0; j < k; ++j) {
        const float s = param_at(row.scales, w.half, j / w.sub);
        const float o = param_at(row.offsets, w.half, j / w.sub);
        const float c = float(code_at(row.codes, w.bits, j));
        op[i * k + j] = fused ? std::fma(s, c, o) : s * c + o;  // -ffp-contract=off
      }
    }
  });
  return out;
}

void run_on_pool(int64_t chunks, int threads, void (*fn)(void*, int64_t), void* ctx) {
  WorkerPool::instance().run(chunks, threads, [&](int64_t c) { fn(ctx, c); });
}

const QuantExports kExports{run_on_pool, quant_linear};

}  // namespace
}  // namespace tokenwire::quant

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace tokenwire::quant;
  const auto no_gil = py::call_guard<py::gil_scoped_release>();
  m.def("quant_linear", &quant_linear, no_gil);
  m.def("quant_embedding", &quant_embedding, no_gil);
  m.def("isa_supported", &isa_supported);
  m.def("best_isa", &best_isa);
  m.def("dense_rows", [] { return kDenseRows; });
  m.def("exact_rows", &exact_rows, py::arg("isa"), py::arg("sub") = kBlock);
  m.def("activation_levels",
        [](int64_t isa) { return isa == kPortable ? kLevels : kSimdLevels; });
  m.def("exports", [] {  // for the ops module: quant_exports.h
    return py::capsule(const_cast<tokenwire::QuantExports*>(&kExports),
                       tokenwire::kQuantExportsCapsule);
  });
}
