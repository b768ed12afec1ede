// Gemma 3's decode-only step in one call (engine/cpu_decode.py builds it): the same kernels
// and aten ops in the same order as engine/models/gemma3.py's forward, so the same bits
// out, without the Python between them (~25 calls per layer, 18 layers).
//
// What Gemma adds to decode_stack.cpp's Llama layer:
//    x = norm(hidden); q, k, v = split(qkv(x)); q, k = norm per head; rope (the layer's
//    table: local or global base); k, v -> cache; attention (the layer's window, 0: none)
//    hidden += norm(o(attn));  hidden += norm(down(gelu_tanh(gate) * up)) of norm(hidden)
#include <torch/extension.h>

#include <utility>
#include <vector>

#include "ops.h"
#include "quant_projection.h"

namespace tokenwire {
namespace {

struct GemmaLayer {
  // Norms as (1 + w): input, after attention, before and after the MLP, q and k per head.
  at::Tensor input_norm, post_attention_norm, pre_mlp_norm, post_mlp_norm, q_norm, k_norm;
  at::Tensor cos_sin_cache;  // the layer's rope table
  int64_t window;            // 0: full attention
  Projection qkv, o, gate_up, down;
};

class GemmaDecodeStack {
 public:
  GemmaDecodeStack(at::Tensor final_norm, int64_t num_heads, int64_t num_kv_heads,
                   double scale, double eps)
      : final_norm_(std::move(final_norm)), num_heads_(num_heads),
        num_kv_heads_(num_kv_heads), scale_(scale), eps_(eps) {}

  // norms: input, post-attention, pre-MLP, post-MLP, q, k.
  void add_layer(std::vector<at::Tensor> norms, at::Tensor cos_sin_cache, int64_t window,
                 Projection qkv, Projection o, Projection gate_up, Projection down) {
    TORCH_CHECK(norms.size() == 6, "six norms per layer, not ", norms.size());
    layers_.push_back({norms[0], norms[1], norms[2], norms[3], norms[4], norms[5],
                       std::move(cos_sin_cache), window, std::move(qkv), std::move(o),
                       std::move(gate_up), std::move(down)});
  }

  // hidden [T, hidden]: the step's scaled embeddings, one token per sequence -> the final
  // norm's output [T, hidden].
  at::Tensor forward(at::Tensor hidden, const at::Tensor& positions,
                     const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                     const at::Tensor& seq_lens,
                     const std::vector<std::pair<at::Tensor, at::Tensor>>& kv) {
    const QuantExports& quant = quant_or_throw();
    TORCH_CHECK(kv.size() == layers_.size(), kv.size(), " KV caches for ", layers_.size(),
                " layers");
    for (size_t i = 0; i < layers_.size(); ++i) {
      const GemmaLayer& layer = layers_[i];
      const at::Tensor attn = attention(quant, layer, norm(hidden, layer.input_norm),
                                        positions, slot_mapping, block_tables, seq_lens, kv[i]);
      hidden = hidden + norm(project(quant, attn, layer.o), layer.post_attention_norm);
      const auto gate_up = project(quant, norm(hidden, layer.pre_mlp_norm), layer.gate_up)
                               .chunk(2, -1);
      const at::Tensor mlp = project(quant, at::gelu(gate_up[0], "tanh") * gate_up[1],
                                     layer.down);
      hidden = hidden + norm(mlp, layer.post_mlp_norm);
    }
    return norm(hidden, final_norm_);
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

 private:
  at::Tensor norm(const at::Tensor& x, const at::Tensor& weight) const {
    return rms_norm(x, weight, eps_, std::nullopt)[0];
  }

  // x [T, hidden] -> [T, H * D]: LlamaModel._attention with q/k norms, then
  // CpuAttention's store and decode.
  at::Tensor attention(const QuantExports& quant, const GemmaLayer& layer, const at::Tensor& x,
                       const at::Tensor& positions, const at::Tensor& slot_mapping,
                       const at::Tensor& block_tables, const at::Tensor& seq_lens,
                       const std::pair<at::Tensor, at::Tensor>& kv) const {
    const at::Tensor qkv = project(quant, x, layer.qkv);
    const int64_t dim = kv.first.size(3), q_width = num_heads_ * dim;
    const int64_t kv_width = num_kv_heads_ * dim;
    const at::Tensor q = norm(qkv.narrow(1, 0, q_width).reshape({-1, num_heads_, dim}),
                              layer.q_norm);
    const at::Tensor k = norm(qkv.narrow(1, q_width, kv_width).reshape({-1, num_kv_heads_, dim}),
                              layer.k_norm);
    const at::Tensor v = qkv.narrow(1, q_width + kv_width, kv_width)
                             .reshape({-1, num_kv_heads_, dim});
    rotary(q, positions, layer.cos_sin_cache);
    rotary(k, positions, layer.cos_sin_cache);
    store_kv(k, v, kv.first, kv.second, slot_mapping);
    at::Tensor out = at::empty_like(q);
    paged_decode_attention(out, q, kv.first, kv.second, block_tables, seq_lens, scale_,
                           layer.window);
    return out.view({q.size(0), q_width});
  }

  std::vector<GemmaLayer> layers_;
  at::Tensor final_norm_;
  int64_t num_heads_, num_kv_heads_;
  double scale_, eps_;
};

}  // namespace

void bind_gemma_decode_stack(py::module_& m) {
  py::class_<GemmaDecodeStack>(m, "GemmaDecodeStack")
      .def(py::init<at::Tensor, int64_t, int64_t, double, double>(), py::arg("final_norm"),
           py::arg("num_heads"), py::arg("num_kv_heads"), py::arg("scale"), py::arg("eps"))
      .def("add_layer", &GemmaDecodeStack::add_layer)
      .def("forward", &GemmaDecodeStack::forward, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("num_layers", &GemmaDecodeStack::num_layers);
}

}  // namespace tokenwire
