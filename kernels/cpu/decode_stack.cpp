// A decode-only step's decoder layers in one call, for models whose projections are all
// quantized (engine/cpu_decode.py builds it). The same kernels in the same order as
// engine/models/llama.py's forward, so the same bits out; what goes is the Python between
// them: 8 kernel calls per layer, each with its argument conversions and the model's own
// lines around it, ~30 us per layer on the CI box (~1 ms of an 11 ms step of SmolLM2-135M).
//
// The matmul is the quantized module's, borrowed through quant_exports.h.
#include <torch/extension.h>

#include <utility>
#include <vector>

#include "ops.h"
#include "quant_projection.h"

namespace tokenwire {
namespace {

struct Layer {
  at::Tensor input_norm, post_norm;
  Projection qkv, o, gate_up, down;
};

class DecodeStack {
 public:
  DecodeStack(at::Tensor final_norm, int64_t num_heads, double scale, double eps)
      : final_norm_(std::move(final_norm)), num_heads_(num_heads), scale_(scale), eps_(eps) {}

  void add_layer(at::Tensor input_norm, at::Tensor post_norm, Projection qkv, Projection o,
                 Projection gate_up, Projection down) {
    layers_.push_back({std::move(input_norm), std::move(post_norm), std::move(qkv),
                       std::move(o), std::move(gate_up), std::move(down)});
  }

  // hidden [T, hidden]: the step's embedded tokens, one per sequence -> the final norm's
  // output [T, hidden].
  at::Tensor forward(at::Tensor hidden, const at::Tensor& positions,
                     const at::Tensor& cos_sin_cache, const at::Tensor& slot_mapping,
                     const at::Tensor& block_tables, const at::Tensor& seq_lens,
                     const std::vector<std::pair<at::Tensor, at::Tensor>>& kv) {
    const QuantExports& quant = quant_or_throw();
    TORCH_CHECK(kv.size() == layers_.size(), kv.size(), " KV caches for ", layers_.size(),
                " layers");
    std::optional<at::Tensor> residual;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& layer = layers_[i];
      at::Tensor x;
      if (!residual) {
        residual = hidden;
        x = rms_norm(hidden, layer.input_norm, eps_, std::nullopt)[0];
      } else {
        auto normed = rms_norm(hidden, layer.input_norm, eps_, residual);
        x = normed[0], residual = normed[1];
      }
      const at::Tensor attn = qkv_decode_attention(
          project(quant, x, layer.qkv), positions, cos_sin_cache, kv[i].first, kv[i].second,
          slot_mapping, block_tables, seq_lens, num_heads_, scale_);
      hidden = project(quant, attn, layer.o);
      auto normed = rms_norm(hidden, layer.post_norm, eps_, residual);
      residual = normed[1];
      hidden = project(quant, silu_and_mul(project(quant, normed[0], layer.gate_up)),
                       layer.down);
    }
    return rms_norm(hidden, final_norm_, eps_, residual)[0];
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

 private:
  std::vector<Layer> layers_;
  at::Tensor final_norm_;
  int64_t num_heads_;
  double scale_, eps_;
};

}  // namespace

void bind_decode_stack(py::module_& m) {
  py::class_<DecodeStack>(m, "DecodeStack")
      .def(py::init<at::Tensor, int64_t, double, double>(), py::arg("final_norm"),
           py::arg("num_heads"), py::arg("scale"), py::arg("eps"))
      .def("add_layer", &DecodeStack::add_layer)
      .def("forward", &DecodeStack::forward, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("num_layers", &DecodeStack::num_layers);
}

}  // namespace tokenwire
