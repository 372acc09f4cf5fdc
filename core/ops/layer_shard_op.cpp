// tp_copy and tp_reduce: the two points where a stage split into layer shards (tensor
// parallel, Megatron-LM's f and g) meets its shard group. A linear split by its output
// features (columns) reads its input through tp_copy: the same input on every member going
// forward, its gradient summed over the members going back (each member's slice of the
// layer gives only its part of it). A linear split by its input features (rows) writes
// through tp_reduce: the members' partial outputs summed going forward, the gradient passed
// through unchanged going back. Both sum through the Reducer given the Network
// (core/parallel.h); pipeline/layer_shards.h makes the split specs.
#include <cstring>

#include "core/error.h"
#include "core/layers/layer.h"
#include "core/ops/elementwise.h"

namespace tandem {
namespace {

class LayerShardLayer final : public Layer {
 public:
  // `forward_sum`: tp_reduce (sums going forward); else tp_copy (sums the gradient going back).
  LayerShardLayer(std::string name, bool forward_sum) : Layer(std::move(name)), forward_sum_(forward_sum) {}
  void set_reducer(Reducer* reducer) override { reducer_ = reducer; }
  Reads backward_reads() const override { return {0u, false}; }  // nothing: the gradient passes or is summed

  void forward(std::span<const Tensor> in, Tensor& out, Stash&) override {
    std::memcpy(out.data(), in[0].data(), static_cast<std::size_t>(in[0].numel()) * sizeof(float));
    if (forward_sum_) reducer().all_sum(std::span<float>(out.data(), static_cast<std::size_t>(out.numel())));
  }
  void backward(std::span<const Tensor>, const Tensor&, const Tensor& grad_out, std::span<Tensor> grad_in,
                Stash&) override {
    if (!grad_in[0].defined()) return;
    std::memcpy(grad_in[0].data(), grad_out.data(), static_cast<std::size_t>(grad_out.numel()) * sizeof(float));
    if (!forward_sum_) reducer().all_sum(std::span<float>(grad_in[0].data(), static_cast<std::size_t>(grad_in[0].numel())));
  }

 private:
  Reducer& reducer() {
    if (!reducer_)
      fail("layer shards", cat("node '", name(), "' (", forward_sum_ ? "tp_reduce" : "tp_copy",
                               ") joins the members of a stage split into layer shards, and this network has no shard "
                               "group: give it one (Network::set_reducer, pipeline/layer_shards.h)"));
    return *reducer_;
  }
  bool forward_sum_;
  Reducer* reducer_ = nullptr;
};

OpDef layer_shard_op(const char* name, bool forward_sum) {
  OpDef d = ops::elementwise(name, 0, 0);  // a copy (the sum's cost is the network's)
  d.make_layer = [forward_sum](const GraphNode& node, std::span<const Shape>, Backend&, Rng&) -> std::unique_ptr<Layer> {
    return std::make_unique<LayerShardLayer>(node.spec.name, forward_sum);
  };
  return d;
}

}  // namespace

void define_layer_shard_op(OpTable& t) {
  t.add(layer_shard_op("tp_copy", false));
  t.add(layer_shard_op("tp_reduce", true));
}

}  // namespace tandem
