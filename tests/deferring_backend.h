// A CPU stand-in for a GPU backend whose calls run ahead of the host (cuda with managed tensors
// and TANDEM_CUDA_ASYNC=1), so CPU CI checks the network's waits (Backend::wait): the
// reference's kernels, but a call whose every pointer lies in a tensor is queued and runs at the
// next wait, or before the next call that touches other host memory (a stash), as cuda's staging
// rule. One queue for the process, whichever thread calls (a backend's calls share one stream;
// here every backend's do), and freeing a tensor runs it first, as cudaFree waits for the device. Host code that reads a kernel's output, or rewrites its input, with no wait in
// between sees stale values, and the tests that compare results fail. TANDEM_BACKEND=deferred.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "backends/registry.h"
#include "core/backend.h"
#include "core/tensor.h"

namespace tandem::test {

namespace deferred {

// Every tensor's storage (a TensorMemory hook for all sizes), so a call can tell tensors from
// other memory, as cuda's resident ranges do.
struct Ranges {
  std::mutex mu;
  std::map<std::uintptr_t, std::size_t> ranges;
  bool contains(const void* p) {
    std::lock_guard lock(mu);
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    auto it = ranges.upper_bound(at);
    return it != ranges.begin() && at < std::prev(it)->first + std::prev(it)->second;
  }
};
inline Ranges& ranges() {
  static Ranges* r = new Ranges;
  return *r;
}

// The queued calls. Recursive: a call that drops the last reference to a kernel may free a
// tensor, whose release runs the queue again (what is left of it) on the same thread.
struct Queue {
  std::recursive_mutex mu;
  std::vector<std::function<void()>> calls;
};
inline Queue& queue() {
  static Queue* q = new Queue;
  return *q;
}
inline void flush() {
  Queue& q = queue();
  std::lock_guard lock(q.mu);
  while (!q.calls.empty()) {
    auto calls = std::move(q.calls);
    q.calls.clear();
    for (auto& call : calls) call();
  }
}

inline void* allocate(std::size_t bytes, std::size_t) {
  void* p = ::operator new[](bytes, std::align_val_t{kTensorAlignment});
  std::lock_guard lock(ranges().mu);
  ranges().ranges[reinterpret_cast<std::uintptr_t>(p)] = bytes;
  return p;
}
inline void release(void* p) {
  flush();  // as cudaFree waits for the device
  {
    std::lock_guard lock(ranges().mu);
    ranges().ranges.erase(reinterpret_cast<std::uintptr_t>(p));
  }
  ::operator delete[](p, std::align_val_t{kTensorAlignment});
}
inline const TensorMemory kMemory{0, allocate, release};

// Whether every non-null pointer lies in a tensor.
inline bool tensors() { return true; }
template <typename P, typename... Rest>
bool tensors(P p, Rest... rest) {
  return (p == nullptr || ranges().contains(p)) && tensors(rest...);
}

// Runs `call` now (after the queue) when an operand is other host memory, else queues it.
template <typename F>
void run(bool queued, F&& call) {
  Queue& q = queue();
  std::lock_guard lock(q.mu);
  if (queued) {
    q.calls.emplace_back(std::forward<F>(call));
  } else {
    flush();
    call();
  }
}

// Each kernel kind: the inner kernel shared with the queued calls (a layer may drop it first).
// Convolutions, linears and grouped linears share one contract: forward, backward_data,
// backward_weights.
template <typename Kernel>
class Weighted final : public Kernel {
 public:
  explicit Weighted(std::unique_ptr<Kernel> k) : k_(std::move(k)) {}
  void forward(const float* x, const WeightsView& w, float* y) override {
    run(tensors(x, w.weight, w.bias, y), [k = k_, x, w, y] { k->forward(x, w, y); });
  }
  void backward_data(const float* dy, const WeightsView& w, float* dx) override {
    run(tensors(dy, w.weight, w.bias, dx), [k = k_, dy, w, dx] { k->backward_data(dy, w, dx); });
  }
  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    run(tensors(x, dy, dw, db), [k = k_, x, dy, dw, db] { k->backward_weights(x, dy, dw, db); });
  }

 private:
  std::shared_ptr<Kernel> k_;
};

class Relu final : public ReluKernel {
 public:
  explicit Relu(std::unique_ptr<ReluKernel> k) : k_(std::move(k)) {}
  void forward(const float* x, float* y) override { run(tensors(x, y), [k = k_, x, y] { k->forward(x, y); }); }
  void backward(const float* y, const float* dy, float* dx) override {
    run(tensors(y, dy, dx), [k = k_, y, dy, dx] { k->backward(y, dy, dx); });
  }

 private:
  std::shared_ptr<ReluKernel> k_;
};

class Activation final : public ActivationKernel {
 public:
  explicit Activation(std::unique_ptr<ActivationKernel> k) : k_(std::move(k)) {}
  void forward(const float* x, float* y) override { run(tensors(x, y), [k = k_, x, y] { k->forward(x, y); }); }
  void backward(const float* x, const float* y, const float* dy, float* dx) override {
    run(tensors(x, y, dy, dx), [k = k_, x, y, dy, dx] { k->backward(x, y, dy, dx); });
  }

 private:
  std::shared_ptr<ActivationKernel> k_;
};

class Add final : public AddKernel {
 public:
  explicit Add(std::unique_ptr<AddKernel> k) : k_(std::move(k)) {}
  void forward(const float* a, const float* b, float* y) override {
    run(tensors(a, b, y), [k = k_, a, b, y] { k->forward(a, b, y); });
  }

 private:
  std::shared_ptr<AddKernel> k_;
};

class Softmax final : public SoftmaxKernel {
 public:
  explicit Softmax(std::unique_ptr<SoftmaxKernel> k) : k_(std::move(k)) {}
  void forward(const float* x, float* y) override { run(tensors(x, y), [k = k_, x, y] { k->forward(x, y); }); }
  void backward(const float* y, const float* dy, float* dx) override {
    run(tensors(y, dy, dx), [k = k_, y, dy, dx] { k->backward(y, dy, dx); });
  }

 private:
  std::shared_ptr<SoftmaxKernel> k_;
};

class BatchNorm final : public BatchNormKernel {
 public:
  explicit BatchNorm(std::unique_ptr<BatchNormKernel> k) : k_(std::move(k)) {}
  void forward(const float* x, const float* gamma, const float* beta, bool training, float* mean, float* inv_std,
               float* var, float* y) override {
    run(tensors(x, gamma, beta, mean, inv_std, var, y), [k = k_, x, gamma, beta, training, mean, inv_std, var, y] {
      k->forward(x, gamma, beta, training, mean, inv_std, var, y);
    });
  }
  void backward(const float* x, const float* dy, const float* gamma, const float* mean, const float* inv_std,
                bool training, float* dx, float* dgamma, float* dbeta) override {
    run(tensors(x, dy, gamma, mean, inv_std, dx, dgamma, dbeta),
        [k = k_, x, dy, gamma, mean, inv_std, training, dx, dgamma, dbeta] {
          k->backward(x, dy, gamma, mean, inv_std, training, dx, dgamma, dbeta);
        });
  }

 private:
  std::shared_ptr<BatchNormKernel> k_;
};

class LayerNorm final : public LayerNormKernel {
 public:
  explicit LayerNorm(std::unique_ptr<LayerNormKernel> k) : k_(std::move(k)) {}
  void forward(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* var) override {
    run(tensors(x, gamma, beta, y, mean, var),
        [k = k_, x, gamma, beta, y, mean, var] { k->forward(x, gamma, beta, y, mean, var); });
  }
  void backward(const float* x, const float* dy, const float* gamma, const float* mean, const float* var, float* dx,
                float* dgamma, float* dbeta) override {
    run(tensors(x, dy, gamma, mean, var, dx, dgamma, dbeta), [k = k_, x, dy, gamma, mean, var, dx, dgamma, dbeta] {
      k->backward(x, dy, gamma, mean, var, dx, dgamma, dbeta);
    });
  }

 private:
  std::shared_ptr<LayerNormKernel> k_;
};

class Attention final : public AttentionKernel {
 public:
  explicit Attention(std::unique_ptr<AttentionKernel> k) : k_(std::move(k)) {}
  void forward(const float* q, const float* k, const float* v, const float* mask, float* out, float* probs) override {
    run(tensors(q, k, v, mask, out, probs),
        [a = k_, q, k, v, mask, out, probs] { a->forward(q, k, v, mask, out, probs); });
  }
  void backward(const float* q, const float* k, const float* v, const float* probs, const float* dout, float* dq,
                float* dk, float* dv) override {
    run(tensors(q, k, v, probs, dout, dq, dk, dv),
        [a = k_, q, k, v, probs, dout, dq, dk, dv] { a->backward(q, k, v, probs, dout, dq, dk, dv); });
  }

 private:
  std::shared_ptr<AttentionKernel> k_;
};

template <typename Kernel>
class Pool final : public Kernel {  // global and average pooling: forward(x, y), backward(dy, dx)
 public:
  explicit Pool(std::unique_ptr<Kernel> k) : k_(std::move(k)) {}
  void forward(const float* x, float* y) override { run(tensors(x, y), [k = k_, x, y] { k->forward(x, y); }); }
  void backward(const float* dy, float* dx) override { run(tensors(dy, dx), [k = k_, dy, dx] { k->backward(dy, dx); }); }

 private:
  std::shared_ptr<Kernel> k_;
};

class MaxPool final : public MaxPool2dKernel {
 public:
  explicit MaxPool(std::unique_ptr<MaxPool2dKernel> k) : k_(std::move(k)) {}
  std::size_t stash_bytes() const override { return k_->stash_bytes(); }
  void forward(const float* x, float* y, void* stash) override {
    run(tensors(x, y, stash), [k = k_, x, y, stash] { k->forward(x, y, stash); });
  }
  void backward(const float* dy, const void* stash, float* dx) override {
    run(tensors(dy, stash, dx), [k = k_, dy, stash, dx] { k->backward(dy, stash, dx); });
  }

 private:
  std::shared_ptr<MaxPool2dKernel> k_;
};

class TokenPool final : public TokenPoolKernel {
 public:
  explicit TokenPool(std::unique_ptr<TokenPoolKernel> k) : k_(std::move(k)) {}
  void forward(const float* x, const float* w, float* y) override {
    run(tensors(x, w, y), [k = k_, x, w, y] { k->forward(x, w, y); });
  }
  void backward(const float* dy, const float* w, float* dx) override {
    run(tensors(dy, w, dx), [k = k_, dy, w, dx] { k->backward(dy, w, dx); });
  }

 private:
  std::shared_ptr<TokenPoolKernel> k_;
};

class Mul final : public MulKernel {
 public:
  explicit Mul(std::unique_ptr<MulKernel> k) : k_(std::move(k)) {}
  void forward(const float* a, const float* b, float* y) override {
    run(tensors(a, b, y), [k = k_, a, b, y] { k->forward(a, b, y); });
  }
  void backward(const float* dy, const float* a, const float* b, float* da, float* db) override {
    run(tensors(dy, a, b, da, db), [k = k_, dy, a, b, da, db] { k->backward(dy, a, b, da, db); });
  }

 private:
  std::shared_ptr<MulKernel> k_;
};

class Dropout final : public DropoutKernel {
 public:
  explicit Dropout(std::unique_ptr<DropoutKernel> k) : k_(std::move(k)) {}
  void forward(uint64_t seed, uint64_t call, float p, const float* x, float* y, uint8_t* keep) override {
    run(tensors(x, y, keep), [k = k_, seed, call, p, x, y, keep] { k->forward(seed, call, p, x, y, keep); });
  }
  void backward(const uint8_t* keep, float scale, const float* dy, float* dx) override {
    run(tensors(keep, dy, dx), [k = k_, keep, scale, dy, dx] { k->backward(keep, scale, dy, dx); });
  }

 private:
  std::shared_ptr<DropoutKernel> k_;
};

// The host loops, queued likewise; the norm returns a value, so it runs the queue first.
class Vectors final : public VectorKernel {
 public:
  explicit Vectors(VectorKernel& inner) : v_(inner) {}
  void fill(float* x, float value, int64_t n) override { run(tensors(x), [&v = v_, x, value, n] { v.fill(x, value, n); }); }
  void copy(float* to, const float* from, int64_t n) override {
    run(tensors(to, from), [&v = v_, to, from, n] { v.copy(to, from, n); });
  }
  void copy_rows(float* to, int64_t ts, const float* from, int64_t fs, int64_t width, int64_t rows) override {
    run(tensors(to, from), [&v = v_, to, ts, from, fs, width, rows] { v.copy_rows(to, ts, from, fs, width, rows); });
  }
  void permute(float* to, const float* from, const int64_t* dims, const int* perm, int rank) override {
    std::array<int64_t, 8> d{};
    std::array<int, 8> p{};
    std::copy_n(dims, rank, d.begin());
    std::copy_n(perm, rank, p.begin());
    run(tensors(to, from), [&v = v_, to, from, d, p, rank] { v.permute(to, from, d.data(), p.data(), rank); });
  }
  void elementwise(Elementwise op, float* to, const float* x0, const float* x1, const float* x2,
                   const Broadcast& b) override {
    run(tensors(to, x0, x1, x2), [&v = v_, op, to, x0, x1, x2, b] { v.elementwise(op, to, x0, x1, x2, b); });
  }
  void matmul(float* c, const float* a, const float* b, const Matmul& m) override {
    run(tensors(c, a, b), [&v = v_, c, a, b, m] { v.matmul(c, a, b, m); });
  }
  void extreme_rows(float* to, const float* from, int64_t rows, int64_t width, bool max) override {
    run(tensors(to, from), [&v = v_, to, from, rows, width, max] { v.extreme_rows(to, from, rows, width, max); });
  }
  void route_rows(float* to, const float* x, const float* y, const float* dy, int64_t rows, int64_t width) override {
    run(tensors(to, x, y, dy), [&v = v_, to, x, y, dy, rows, width] { v.route_rows(to, x, y, dy, rows, width); });
  }
  void sum_rows(float* to, const float* from, int64_t rows, int64_t width, float scale) override {
    run(tensors(to, from), [&v = v_, to, from, rows, width, scale] { v.sum_rows(to, from, rows, width, scale); });
  }
  void spread_rows(float* to, const float* from, int64_t rows, int64_t width, float scale) override {
    run(tensors(to, from), [&v = v_, to, from, rows, width, scale] { v.spread_rows(to, from, rows, width, scale); });
  }
  void accumulate(float* acc, const float* add, int64_t n) override {
    run(tensors(acc, add), [&v = v_, acc, add, n] { v.accumulate(acc, add, n); });
  }
  void scale(float* x, double factor, int64_t n) override {
    run(tensors(x), [&v = v_, x, factor, n] { v.scale(x, factor, n); });
  }
  double squared_norm(const float* x, int64_t n) override {
    flush();
    return v_.squared_norm(x, n);
  }
  void sgd(const SgdUpdate& u, float* w, const float* g, float* m, int64_t n) override {
    run(tensors(w, g, m), [&v = v_, u, w, g, m, n] { v.sgd(u, w, g, m, n); });
  }
  void adam(const AdamUpdate& u, float* w, const float* g, float* m, float* s, int64_t n) override {
    run(tensors(w, g, m, s), [&v = v_, u, w, g, m, s, n] { v.adam(u, w, g, m, s, n); });
  }
  void wait() override { flush(); }

 private:
  VectorKernel& v_;
};

}  // namespace deferred

class DeferringBackend final : public Backend {
 public:
  DeferringBackend() : vectors_(inner_->vectors()) { set_tensor_memory(&deferred::kMemory); }
  ~DeferringBackend() override { deferred::flush(); }
  std::string_view name() const override { return inner_->name(); }
  Support supports(std::string_view op, std::span<const Shape> inputs) const override {
    return inner_->supports(op, inputs);
  }
  std::unique_ptr<Conv2dKernel> conv2d(const Conv2dGeometry& g) override {
    return std::make_unique<deferred::Weighted<Conv2dKernel>>(inner_->conv2d(g));
  }
  std::unique_ptr<LinearKernel> linear(const LinearGeometry& g) override {
    return std::make_unique<deferred::Weighted<LinearKernel>>(inner_->linear(g));
  }
  std::unique_ptr<GroupedLinearKernel> grouped_linear(const GroupedLinearGeometry& g) override {
    return std::make_unique<deferred::Weighted<GroupedLinearKernel>>(inner_->grouped_linear(g));
  }
  std::unique_ptr<ReluKernel> relu(int64_t n) override { return std::make_unique<deferred::Relu>(inner_->relu(n)); }
  std::unique_ptr<ActivationKernel> activation(const Activation& a, int64_t n) override {
    return std::make_unique<deferred::Activation>(inner_->activation(a, n));
  }
  std::unique_ptr<MaxPool2dKernel> max_pool2d(const Pool2dGeometry& g) override {
    return std::make_unique<deferred::MaxPool>(inner_->max_pool2d(g));
  }
  std::unique_ptr<AvgPool2dKernel> avg_pool2d(const Pool2dGeometry& g) override {
    return std::make_unique<deferred::Pool<AvgPool2dKernel>>(inner_->avg_pool2d(g));
  }
  std::unique_ptr<GlobalAvgPoolKernel> global_avg_pool(const GlobalPoolGeometry& g) override {
    return std::make_unique<deferred::Pool<GlobalAvgPoolKernel>>(inner_->global_avg_pool(g));
  }
  std::unique_ptr<SoftmaxKernel> softmax(int64_t rows, int64_t c) override {
    return std::make_unique<deferred::Softmax>(inner_->softmax(rows, c));
  }
  std::unique_ptr<AddKernel> add(int64_t n) override { return std::make_unique<deferred::Add>(inner_->add(n)); }
  std::unique_ptr<BatchNormKernel> batch_norm(const BatchNormGeometry& g) override {
    return std::make_unique<deferred::BatchNorm>(inner_->batch_norm(g));
  }
  std::unique_ptr<LayerNormKernel> layer_norm(const LayerNormGeometry& g) override {
    return std::make_unique<deferred::LayerNorm>(inner_->layer_norm(g));
  }
  std::unique_ptr<MulKernel> mul(const MulGeometry& g) override {
    return std::make_unique<deferred::Mul>(inner_->mul(g));
  }
  std::unique_ptr<TokenPoolKernel> token_pool(const TokenPoolGeometry& g) override {
    return std::make_unique<deferred::TokenPool>(inner_->token_pool(g));
  }
  std::unique_ptr<DropoutKernel> dropout(int64_t n) override {
    return std::make_unique<deferred::Dropout>(inner_->dropout(n));
  }
  std::unique_ptr<AttentionKernel> attention(const AttentionGeometry& g) override {
    return std::make_unique<deferred::Attention>(inner_->attention(g));
  }
  VectorKernel& vectors() override { return vectors_; }
  void wait() override { deferred::flush(); }

 private:
  std::unique_ptr<Backend> inner_ = make_backend("reference");
  deferred::Vectors vectors_;
};

}  // namespace tandem::test
