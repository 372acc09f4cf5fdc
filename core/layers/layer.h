// Layer: one graph node bound to a backend. It owns its parameters and its kernels (created
// once per batch size), runs forward for a micro-batch and backward from what it stashed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/graph.h"
#include "core/parallel.h"
#include "core/param.h"
#include "core/random.h"
#include "core/tensor.h"

namespace tandem {

// What a layer keeps for one micro-batch between forward and backward, besides its input
// and output tensors (which the network keeps). Sized on first use, reused afterwards.
struct Stash {
  std::vector<std::byte> bytes;
  void* reserve(std::size_t n) {
    if (bytes.size() != n) bytes.resize(n);
    return bytes.data();
  }
};

class Layer {
 public:
  explicit Layer(std::string name) : name_(std::move(name)) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  const std::string& name() const { return name_; }
  virtual std::vector<Param*> params() { return {}; }
  // State that is not trained but must survive a checkpoint: tensors named as PyTorch names
  // them (batch norm's running statistics) and counters (dropout's forward count).
  virtual std::vector<std::pair<std::string, Tensor*>> buffers() { return {}; }
  virtual std::vector<std::pair<std::string, uint64_t*>> counters() { return {}; }
  // True when the output is the first input seen with another shape (flatten): the network
  // aliases the tensors instead of calling forward and backward.
  virtual bool is_view() const { return false; }
  // Whether its own code reads or writes tensor values on the host, not only through kernels
  // and the backend's vector passes: the network waits for the backend before running it.
  // Such a layer that reads its own kernels' outputs on the host (batch norm's statistics,
  // LoRA's terms) relies on those outputs being host memory the call copies down and waits for.
  virtual bool touches_host() const { return true; }

  // The forward's tensors whose values backward and backward_weights read, besides the
  // stash: inputs (bit i: input i) and the output. A training forward keeps the others only
  // until the later nodes that read them ran (Network), and their storage then serves other
  // outputs: their shapes stay, their values do not (a frozen linear needs no input, an add
  // nothing). By default every input and the output.
  struct Reads {
    uint32_t inputs = ~0u;
    bool output = true;
  };
  virtual Reads backward_reads() const { return {}; }

  // Training (the default) or evaluation: layers that behave differently (batch norm) follow.
  virtual void set_training(bool) {}
  // For a party short of memory (the edge): a layer whose forward would stash much for its
  // backward computes it again there instead, from what the network keeps (attention's
  // probabilities, a tokens x tokens table a head, from q, k, v and the mask). Results are
  // the same bit for bit; backward_reads() may name more. Off by default.
  virtual void set_recompute(bool) {}
  // A layer-shard op (core/parallel.h: tp_copy, tp_reduce) sums over its shard group through
  // this; the others ignore it.
  virtual void set_reducer(Reducer*) {}

  // `out` is preallocated with this node's shape for the micro-batch.
  virtual void forward(std::span<const Tensor> in, Tensor& out, Stash& stash) = 0;
  // Writes (overwrites) grad_in[i] for every defined grad_in[i]; accumulates parameter
  // gradients through Param::grad_target / commit_grad.
  virtual void backward(std::span<const Tensor> in, const Tensor& out, const Tensor& grad_out,
                        std::span<Tensor> grad_in, Stash& stash) = 0;

  // Zero-bubble's split of backward, for layers with parameters whose gradients can wait:
  // backward_data writes grad_in only, backward_weights later accumulates the parameter
  // gradients from the same grad_out and stash (before either is reused). The two together
  // do exactly what backward does. Layers that cannot split (batch norm's input gradient
  // needs its parameter gradients) keep the default: no split.
  virtual bool splits_backward() const { return false; }
  virtual void backward_data(std::span<const Tensor>, const Tensor&, const Tensor&, std::span<Tensor>, Stash&) {}
  virtual void backward_weights(std::span<const Tensor>, const Tensor&, const Tensor&, Stash&) {}

 private:
  std::string name_;
};

// Kernels keyed by batch size (or rows): the micro-batch size is fixed in steady state, and a
// smaller last batch gets its own kernel instead of re-planning the common one. A sequence's
// kernels may also key on its length (length buckets): a few of each, never one per call.
template <typename Kernel>
class KernelCache {
 public:
  template <typename Make>
  Kernel& get(int64_t batch, Make&& make) {
    return find_or_make(batch, 0, [&] { return make(batch); });
  }
  template <typename Make>
  Kernel& get(int64_t batch, int64_t length, Make&& make) {
    return find_or_make(batch, length, [&] { return make(batch, length); });
  }

 private:
  template <typename Make>
  Kernel& find_or_make(int64_t batch, int64_t length, Make&& make) {
    for (auto& [key, k] : kernels_)
      if (key.first == batch && key.second == length) return *k;
    kernels_.emplace_back(std::pair{batch, length}, make());
    return *kernels_.back().second;
  }
  std::vector<std::pair<std::pair<int64_t, int64_t>, std::unique_ptr<Kernel>>> kernels_;
};

// Builds the layer for a node, initialising its parameters like PyTorch's defaults
// (uniform in +-1/sqrt(fan_in) for weights and biases) from `rng`.
std::unique_ptr<Layer> make_layer(const GraphNode& node, const std::vector<Shape>& input_shapes,
                                  Backend& backend, Rng& rng);

}  // namespace tandem
