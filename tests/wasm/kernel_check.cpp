// The portable kernels in WebAssembly against the same code built natively: each binary model
// spec's whole network (every op it holds) runs forward, loss and backward on seeded inputs,
// and every output and gradient is written to a file (wasm, under node) or compared with one
// (native), computed on the same portable backend or on the reference backend.
// Usage: kernel_check --write OUT SPEC.tdms... | kernel_check --compare IN [--against reference] SPEC.tdms...
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/loss.h"
#include "core/network.h"
#include "core/random.h"

namespace tandem {
namespace {

struct Named {
  std::string name;
  std::vector<float> values;
};

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("kernel_check", cat("cannot read ", path));
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Logits, loss, input gradient and every parameter's gradient of one training pass.
std::vector<Named> run(const std::string& spec_path, const std::string& backend_name) {
  const std::vector<uint8_t> bytes = read_file(spec_path);
  const ModelSpec spec = parse_model_binary(bytes.data(), bytes.size());
  const Graph graph = Graph::build(spec);
  auto backend = make_backend(backend_name);
  Network net(graph, *backend, 11);
  constexpr int64_t kBatch = 3;
  // Each input seeded: images in [0, 1); ids and coordinates small integers (0..3: within any
  // table, boxes [x0, y0, x0 + 1, y0 + 1]); masks keep all but sample 1's last two tokens.
  Rng rng(5);
  std::vector<Tensor> inputs;
  for (const GraphInput& in : graph.inputs()) {
    Tensor x = Tensor::empty(in.shape.batched(kBatch));
    const int64_t per = in.shape.numel();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t b = i / per, j = i % per;
      if (in.mask) x.data()[i] = b == 1 && j >= per - 2 ? 0.0f : 1.0f;
      else if (in.integer && in.shape[in.shape.rank() - 1] == 4) x.data()[i] = static_cast<float>((i / 4) % 3 + (j % 4 >= 2));
      else if (in.integer) x.data()[i] = static_cast<float>(rng.below(4));
      else x.data()[i] = rng.uniform(0.0f, 1.0f);
    }
    inputs.push_back(std::move(x));
  }
  const int64_t classes = graph.classes();
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < kBatch; ++i) labels.push_back(static_cast<int32_t>(i * 7 % classes));
  net.set_training(true);
  net.zero_grad();
  const Tensor& logits = net.forward(inputs, 0);
  Tensor dlogits = Tensor::empty(logits.shape());
  const double loss = compute_loss(graph.loss(), logits, labels.data(), 1.0f / kBatch, &dlogits, graph.output_groups());
  // The input gradient where input 0 is differentiable (not token ids).
  const bool input_grad = !graph.inputs()[0].integer;
  const Tensor dx = net.backward(dlogits, 0, input_grad);
  std::vector<Named> out;
  const std::string model = spec.name + ".";
  out.push_back({model + "logits", std::vector<float>(logits.data(), logits.data() + logits.numel())});
  out.push_back({model + "loss", {static_cast<float>(loss)}});
  if (input_grad) out.push_back({model + "input_grad", std::vector<float>(dx.data(), dx.data() + dx.numel())});
  for (Param* p : net.params())
    out.push_back({model + p->name() + ".grad", std::vector<float>(p->grad().data(), p->grad().data() + p->grad().numel())});
  return out;
}

int main_(int argc, char** argv) {
  if (argc < 4 || (std::strcmp(argv[1], "--write") != 0 && std::strcmp(argv[1], "--compare") != 0)) {
    std::fprintf(stderr, "usage: kernel_check --write OUT | --compare IN  SPEC.tdms...\n");
    return 2;
  }
  int first = 3;
  std::string backend = "portable";
  if (argc > 5 && std::strcmp(argv[3], "--against") == 0) {
    backend = argv[4];
    first = 5;
  }
  const double tolerance = 1e-4;
  std::vector<Named> all;
  for (int i = first; i < argc; ++i)
    for (auto& n : run(argv[i], backend)) all.push_back(std::move(n));
  if (std::strcmp(argv[1], "--write") == 0) {
    std::ofstream f(argv[2], std::ios::binary);
    for (const Named& n : all) {
      const uint64_t sizes[2] = {n.name.size(), n.values.size()};
      f.write(reinterpret_cast<const char*>(sizes), sizeof sizes);
      f.write(n.name.data(), static_cast<std::streamsize>(n.name.size()));
      f.write(reinterpret_cast<const char*>(n.values.data()), static_cast<std::streamsize>(n.values.size() * 4));
    }
    if (!f.flush()) fail("kernel_check", cat("cannot write ", argv[2]));
    std::printf("wrote %zu tensors\n", all.size());
    return 0;
  }
  const std::vector<uint8_t> theirs = read_file(argv[2]);
  // Each layer's largest gradient: a bias whose gradient is rounding noise (a convolution
  // followed by batch norm has a zero bias gradient) is compared at its weights' scale.
  auto layer = [](const std::string& name) {
    const std::size_t grad = name.rfind(".grad");
    const std::size_t dot = grad == std::string::npos ? std::string::npos : name.rfind('.', grad - 1);
    return dot == std::string::npos ? name : name.substr(0, dot);
  };
  std::map<std::string, double> layer_scale;
  for (const Named& n : all)
    for (float v : n.values) {
      double& m = layer_scale[layer(n.name)];
      m = std::max(m, static_cast<double>(std::fabs(v)));
    }
  std::size_t at = 0, checked = 0, bad = 0;
  double worst = 0;
  for (const Named& n : all) {
    uint64_t sizes[2];
    if (at + sizeof sizes > theirs.size()) fail("kernel_check", cat(argv[2], " ends before ", n.name));
    std::memcpy(sizes, theirs.data() + at, sizeof sizes);
    at += sizeof sizes;
    const std::string name(reinterpret_cast<const char*>(theirs.data() + at), sizes[0]);
    at += sizes[0];
    if (name != n.name || sizes[1] != n.values.size())
      fail("kernel_check", cat("expected ", n.name, " of ", n.values.size(), " values, the file has ", name, " of ", sizes[1]));
    std::vector<float> w(sizes[1]);
    std::memcpy(w.data(), theirs.data() + at, sizes[1] * 4);
    at += sizes[1] * 4;
    // Relative to the largest magnitude of the tensor's layer (summation order may differ).
    double scale = std::max(1e-12, layer_scale[layer(n.name)]), diff = 0;
    for (float v : n.values) scale = std::max(scale, static_cast<double>(std::fabs(v)));
    for (std::size_t i = 0; i < w.size(); ++i)
      diff = std::max(diff, std::fabs(static_cast<double>(w[i]) - n.values[i]) / scale);
    if (!(diff <= tolerance)) {
      std::printf("MISMATCH %s: max relative difference %.3g (largest magnitude %.3g)\n", n.name.c_str(), diff, scale);
      ++bad;
    }
    worst = std::max(worst, diff);
    checked += n.values.size();
  }
  std::printf("%zu tensors, %zu values: wasm vs native %s, max relative difference %.3g (tolerance %g), %zu mismatches\n",
              all.size(), checked, backend.c_str(), worst, tolerance, bad);
  return bad == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  try {
    return tandem::main_(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_check: %s\n", e.what());
    return 1;
  }
}
