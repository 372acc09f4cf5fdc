// Shared helpers for the test suite: the backend under test (TANDEM_BACKEND), seeded random
// tensors, tolerant comparison against the reference, and one-node model specs.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/model_spec.h"
#include "core/network.h"
#include "core/random.h"
#include "core/tensor.h"
#include "backends/registry.h"
#include "deferring_backend.h"
#include "small_split_spec.h"

namespace tandem::test {

// The text of the Error that f throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// Gives `to`'s parameters the values of the same names in `from` (a shard from its whole model).
inline void copy_params(Network& to, Network& from) {
  for (Param* p : to.params()) {
    p->value().copy_from(from.param(p->name()).value());
    p->bump_version();
  }
}

// The largest elementwise difference of two tensors of one size.
inline float max_abs_diff(const Tensor& a, const Tensor& b) {
  float worst = 0.0f;
  for (int64_t i = 0; i < a.numel(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

// The largest difference between `part`'s parameters and those of the same names in `whole`.
inline float max_diff(Network& part, Network& whole) {
  float worst = 0.0f;
  for (Param* p : part.params()) {
    const Tensor& q = whole.param(p->name()).value();
    for (int64_t i = 0; i < q.numel(); ++i) worst = std::max(worst, std::fabs(p->value()[i] - q[i]));
  }
  return worst;
}

// The backend named by TANDEM_BACKEND (ctest sets it per test), default "reference".
inline std::string backend_under_test() {
  const char* name = std::getenv("TANDEM_BACKEND");
  return name && *name ? name : "reference";
}

// TANDEM_THREADS (default 1): the backend's threads, for the thread-pool variants of tests.
inline std::unique_ptr<Backend> make_test_backend(const std::string& name) {
  if (name == "deferred") return std::make_unique<DeferringBackend>();  // deferring_backend.h
  const char* threads = std::getenv("TANDEM_THREADS");
  return make_backend(name, BackendOptions{threads && *threads ? std::atoi(threads) : 1});
}

// A backend that hands every kernel, pass and wait to another: tests derive from it to refuse a
// kernel or to count what a network asks of its backend.
class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  Support supports(std::string_view op, std::span<const Shape> inputs) const override {
    return inner_->supports(op, inputs);
  }
  std::unique_ptr<Conv2dKernel> conv2d(const Conv2dGeometry& g) override { return inner_->conv2d(g); }
  std::unique_ptr<LinearKernel> linear(const LinearGeometry& g) override { return inner_->linear(g); }
  std::unique_ptr<ReluKernel> relu(int64_t n) override { return inner_->relu(n); }
  std::unique_ptr<ActivationKernel> activation(const Activation& a, int64_t n) override {
    return inner_->activation(a, n);
  }
  std::unique_ptr<MaxPool2dKernel> max_pool2d(const Pool2dGeometry& g) override { return inner_->max_pool2d(g); }
  std::unique_ptr<AvgPool2dKernel> avg_pool2d(const Pool2dGeometry& g) override { return inner_->avg_pool2d(g); }
  std::unique_ptr<GlobalAvgPoolKernel> global_avg_pool(const GlobalPoolGeometry& g) override {
    return inner_->global_avg_pool(g);
  }
  std::unique_ptr<SoftmaxKernel> softmax(int64_t rows, int64_t c) override { return inner_->softmax(rows, c); }
  std::unique_ptr<AddKernel> add(int64_t n) override { return inner_->add(n); }
  std::unique_ptr<BatchNormKernel> batch_norm(const BatchNormGeometry& g) override { return inner_->batch_norm(g); }
  std::unique_ptr<LayerNormKernel> layer_norm(const LayerNormGeometry& g) override { return inner_->layer_norm(g); }
  std::unique_ptr<TokenPoolKernel> token_pool(const TokenPoolGeometry& g) override { return inner_->token_pool(g); }
  std::unique_ptr<MulKernel> mul(const MulGeometry& g) override { return inner_->mul(g); }
  std::unique_ptr<DropoutKernel> dropout(int64_t elements) override { return inner_->dropout(elements); }
  std::unique_ptr<AttentionKernel> attention(const AttentionGeometry& g) override { return inner_->attention(g); }
  std::unique_ptr<GroupedLinearKernel> grouped_linear(const GroupedLinearGeometry& g) override {
    return inner_->grouped_linear(g);
  }
  VectorKernel& vectors() override { return inner_->vectors(); }
  void wait() override { inner_->wait(); }

 protected:
  std::unique_ptr<Backend> inner_;
};

inline void fill_uniform(float* p, int64_t n, Rng& rng, float lo = -1.0f, float hi = 1.0f) {
  for (int64_t i = 0; i < n; ++i) p[i] = rng.uniform(lo, hi);
}

inline Tensor random_tensor(const Shape& shape, Rng& rng, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::empty(shape);
  fill_uniform(t.data(), t.numel(), rng, lo, hi);
  return t;
}

// Asserts |got - want| <= tol * max(1, max|want|) elementwise; reports the worst element.
inline void expect_close(const float* got, const float* want, int64_t n, const std::string& what,
                         float tol = 1e-4f) {
  float scale = 1.0f, worst = 0.0f;
  int64_t worst_at = 0;
  for (int64_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(want[i]));
  for (int64_t i = 0; i < n; ++i) {
    const float d = std::fabs(got[i] - want[i]);
    if (!(d <= worst)) {  // also catches NaN
      worst = std::isnan(d) ? INFINITY : d;
      worst_at = i;
    }
  }
  EXPECT_LE(worst, tol * scale) << what << ": worst element " << worst_at << " got " << got[worst_at] << " want "
                                << want[worst_at] << " (scale " << scale << ", " << n << " elements)";
}

// Learnable but not trivial images [n, 8, 8, 1] for 4 classes: the class picks which
// quadrant is bright, over uniform noise.
struct QuadrantData {
  Tensor images;
  std::vector<int32_t> labels;
};
inline QuadrantData quadrant_data(int64_t n, uint64_t seed) {
  Rng rng(seed);
  QuadrantData d{random_tensor({n, 8, 8, 1}, rng, 0.0f, 0.5f), std::vector<int32_t>(static_cast<std::size_t>(n))};
  for (int64_t i = 0; i < n; ++i) {
    const auto label = static_cast<int32_t>(rng.below(4));
    d.labels[static_cast<std::size_t>(i)] = label;
    for (int64_t y = 0; y < 4; ++y)
      for (int64_t x = 0; x < 4; ++x) d.images[i * 64 + (y + 4 * (label / 2)) * 8 + x + 4 * (label % 2)] += 0.5f;
  }
  return d;
}

// A model with one input of per-sample shape `in` feeding `node`, which is the output.
inline ModelSpec one_node_spec(const Shape& in, NodeSpec node) {
  ModelSpec spec;
  spec.name = "test." + node.op;
  spec.inputs.push_back({"x", in});
  node.inputs = {"x"};
  spec.output = node.name;
  spec.nodes.push_back(std::move(node));
  return spec;
}

}  // namespace tandem::test
