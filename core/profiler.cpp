#include "core/profiler.h"

#include <algorithm>

#include "core/error.h"
#include "core/random.h"

namespace tandem {
namespace {

Tensor random_tensor(const Shape& shape, Rng& rng) {
  Tensor t = Tensor::empty(shape);
  float* p = t.data();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = rng.uniform(-1.0f, 1.0f);
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double gflops(double flops_per_sample, int64_t batch, double seconds) {
  return seconds > 0 ? flops_per_sample * static_cast<double>(batch) / seconds * 1e-9 : 0.0;
}

}  // namespace

double LayerProfile::forward_gflops(int64_t batch) const { return gflops(cost.forward_flops, batch, forward_s); }
double LayerProfile::backward_gflops(int64_t batch) const { return gflops(cost.backward_flops(), batch, backward_s); }

std::vector<LayerProfile> profile_layers(Network& net, int64_t batch, int iterations, int warmup, bool input_grad) {
  if (batch < 1 || iterations < 1 || warmup < 0)
    fail("profiler", cat("batch and iterations must be >= 1, got ", batch, " and ", iterations));
  if (!input_grad) net.set_input_gradient(false);  // a front: only what leads to a trained weight
  const Graph& graph = net.graph();
  Rng rng(0x9f0f11e5ULL);
  std::vector<Tensor> inputs;
  for (const auto& in : graph.inputs()) {
    if (!in.integer && !in.mask) {
      inputs.push_back(random_tensor(in.shape.batched(batch), rng));
      continue;
    }
    // Ids and coordinates 0 (valid for any table; the gather costs the same), masks all 1.
    Tensor t = Tensor::empty(in.shape.batched(batch));
    t.fill(in.mask ? 1.0f : 0.0f);
    inputs.push_back(std::move(t));
  }
  const auto& nodes = graph.nodes();
  const Tensor grad = random_tensor(nodes[static_cast<std::size_t>(graph.output())].shape.batched(batch), rng);

  std::vector<std::vector<double>> fwd(nodes.size()), bwd(nodes.size()), wgt(nodes.size());
  Network::NodeTimes times;
  for (int it = 0; it < warmup + iterations; ++it) {
    net.set_timing(&times);
    net.forward(inputs, 0);
    // Split as the cloud runs it: input gradients, then the deferred weight gradients.
    net.backward(grad, 0, input_grad, /*defer_weights=*/true);
    net.backward_weights(0);
    net.set_timing(nullptr);
    if (it < warmup) continue;
    for (std::size_t n = 0; n < nodes.size(); ++n) {
      fwd[n].push_back(times.forward_s[n]);
      bwd[n].push_back(times.backward_s[n] + times.weights_s[n]);
      wgt[n].push_back(times.weights_s[n]);
    }
  }
  net.zero_grad();

  std::vector<LayerProfile> out;
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    out.push_back({nodes[n].spec.name, nodes[n].spec.op, median(fwd[n]), median(bwd[n]),
                   nodes[n].shape.numel() * static_cast<int64_t>(sizeof(float)),
                   op_cost(nodes[n].spec, graph.input_shapes(nodes[n]), nodes[n].shape)});
    out.back().weights_s = median(wgt[n]);
  }
  return out;
}

}  // namespace tandem
