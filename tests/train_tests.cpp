// Training tests on the backend under test: loss falls, the same seed gives bitwise-equal
// weights, K micro-batches equal one whole-batch step, a split model trains like the whole
// model, and the steady-state step makes no heap allocation.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <span>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>

#include <dlfcn.h>
#include <execinfo.h>

#include "core/graph.h"
#include "core/error.h"
#include "core/network.h"
#include "pipeline/local_pipeline.h"
#include "test_support.h"

// Counts C++ heap allocations (plain and aligned operator new) while `counting` is set, in
// this test binary only. C libraries' malloc calls (XNNPACK's operator re-creation) are not seen.
// Each is told apart by its call stack: one with a vendor's library (oneDNN, cuDNN, cuBLAS)
// among its callers (their own bookkeeping, also through libstdc++, out of tandem's reach)
// counts in vendor_allocations, any other (tandem's code, the standard library on its behalf)
// in allocations.
static std::atomic<bool> counting{false};
static std::atomic<int64_t> allocations{0}, allocated_bytes{0}, vendor_allocations{0};

static bool in_vendor_library(const void* address) {
  Dl_info info{};
  if (dladdr(address, &info) == 0 || !info.dli_fname) return false;
  const std::string_view file = info.dli_fname;
  for (const char* lib : {"libdnnl", "libcudnn", "libcublas", "libcuda", "libnvrtc", "libnvJitLink"})
    if (file.find(lib) != std::string_view::npos) return true;
  return false;
}

// TANDEM_ALLOC_TRACE=1: the call stacks of tandem's first allocations while counting, as
// module+offset (addr2line -f -C -i -e MODULE OFFSET names them), for a backend whose count
// is not 0 on a machine without a debugger.
struct Traced {
  void* frames[32];
  int depth;
};
static Traced traced[16];
static std::atomic<int> traced_count{0};
static const bool tracing = [] {
  const char* v = std::getenv("TANDEM_ALLOC_TRACE");
  return v && *v == '1';
}();

// backtrace's first call loads libgcc_s: here, before any counted operator new.
static const bool backtrace_loaded = [] {
  void* frames[2];
  return backtrace(frames, 2) > 0;
}();

static void note_allocation(std::size_t n) {
  if (!counting.load(std::memory_order_relaxed)) return;
  Traced stack{};
  stack.depth = backtrace(stack.frames, 32);  // this binary's own frames first: never a vendor's
  for (int f = 0; f < stack.depth; ++f)
    if (in_vendor_library(stack.frames[f])) {
      vendor_allocations.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  allocations.fetch_add(1, std::memory_order_relaxed);
  allocated_bytes.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
  if (tracing)
    if (const int i = traced_count.fetch_add(1); i < 16) traced[i] = stack;
}

static void print_traced() {
  for (int i = 0; i < std::min(traced_count.load(), 16); ++i) {
    std::printf("allocation %d:", i);
    for (int f = 0; f < traced[i].depth; ++f) {
      Dl_info info{};
      if (dladdr(traced[i].frames[f], &info) && info.dli_fname)
        std::printf(" %s+0x%lx", info.dli_fname,
                    static_cast<unsigned long>(static_cast<const char*>(traced[i].frames[f]) -
                                               static_cast<const char*>(info.dli_fbase)));
    }
    std::printf("\n");
  }
}

[[gnu::noinline]] static void* allocate(std::size_t n) {
  note_allocation(n);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] static void* allocate_aligned(std::size_t n, std::align_val_t a) {
  note_allocation(n);
  const auto align = static_cast<std::size_t>(a);
  if (void* p = std::aligned_alloc(align, (n + align - 1) / align * align)) return p;
  throw std::bad_alloc();
}

#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) { return allocate(n); }
void* operator new[](std::size_t n) { return allocate(n); }
void* operator new(std::size_t n, std::align_val_t a) { return allocate_aligned(n, a); }
void* operator new[](std::size_t n, std::align_val_t a) { return allocate_aligned(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace tandem::test {
namespace {

// A small CNN in the shape of the Fashion-MNIST sample, cut after its conv block.
ModelSpec small_cnn() {
  ModelSpec spec;
  spec.name = "small-cnn";
  spec.inputs.push_back({"image", Shape{8, 8, 1}});
  auto add = [&](const std::string& name, const std::string& op, const std::string& input) -> NodeSpec& {
    NodeSpec n;
    n.name = name;
    n.op = op;
    n.inputs = {input};
    spec.nodes.push_back(n);
    return spec.nodes.back();
  };
  NodeSpec& conv = add("conv1", "conv2d", "image");
  conv.conv2d.out_channels = 6;
  conv.conv2d.kernel = {3, 3};
  conv.conv2d.padding = {1, 1};
  add("relu1", "relu", "conv1");
  add("pool1", "max_pool2d", "relu1").pool = {{2, 2}, {2, 2}, {0, 0}};
  add("flatten", "flatten", "pool1");
  add("fc1", "linear", "flatten").linear.out_features = 24;
  add("relu2", "relu", "fc1");
  add("fc2", "linear", "relu2").linear.out_features = 4;
  spec.output = "fc2";
  spec.cut = "pool1";
  return spec;
}

using Data = QuadrantData;
Data make_data(int64_t n, uint64_t seed) { return quadrant_data(n, seed); }

OptimizerOptions sgd() { return {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 1e-4f, .nesterov = false}; }

ModelSpec with_loss(ModelSpec spec, const std::string& loss) {
  spec.loss = loss;
  return spec;
}

struct Whole {
  explicit Whole(const std::string& loss = "softmax_cross_entropy") : loss_name(loss) {}
  std::string loss_name;
  std::unique_ptr<Backend> backend = make_test_backend(backend_under_test());
  Network net{Graph::build(with_loss(small_cnn(), loss_name)), *backend, 1234};
  Sgd opt{net.params(), sgd()};
  LocalPipeline trainer{{&net}, {&opt}};
};

std::vector<float> weights_of(Network& net) {
  std::vector<float> all;
  for (Param* p : net.params()) all.insert(all.end(), p->value().data(), p->value().data() + p->value().numel());
  return all;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float worst = 0.0f;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

// Counts the waits a network asks of its backend (Backend::wait), the backend under test's
// otherwise: where a GPU backend lets kernel calls run ahead (cuda, TANDEM_CUDA_ASYNC=1), these
// are the host's only reads of what its kernels wrote.
class WaitCounting final : public ForwardingBackend {
 public:
  WaitCounting() : ForwardingBackend(make_test_backend(backend_under_test())) {}
  void wait() override {
    ++waits;
    inner_->wait();
  }
  int waits = 0;
};

// A pass waits once at its end (the output or the input gradient is the host's then), and
// before each layer that touches values on the host (batch norm: its running statistics);
// kernel-only layers (convolution, ReLU, pooling, linear) never.
TEST(Train, TheNetworkWaitsForItsBackendOnlyWhereTheHostReads) {
  const Data d = make_data(4, 3);
  for (const bool with_batch_norm : {false, true}) {
    SCOPED_TRACE(with_batch_norm ? "with batch norm" : "kernels only");
    ModelSpec spec = small_cnn();
    if (with_batch_norm) {
      NodeSpec bn;
      bn.name = "bn1";
      bn.op = "batch_norm";
      bn.inputs = {"conv1"};
      spec.nodes.insert(spec.nodes.begin() + 1, bn);
      spec.nodes[2].inputs = {"bn1"};  // relu1
    }
    WaitCounting backend;
    Network net(Graph::build(spec), backend, 5);
    net.set_training(true);
    const int host_layers = with_batch_norm ? 1 : 0;
    const Tensor& out = net.forward({&d.images, 1}, 0);
    EXPECT_EQ(backend.waits, 1 + host_layers) << "forward";
    Tensor grad = Tensor::zeros(out.shape());
    grad[0] = 1.0f;
    net.backward(grad, 0, true);
    EXPECT_EQ(backend.waits, 2 + 2 * host_layers) << "backward";
    net.forward({&d.images, 1}, 1);
    net.backward(grad, 1, true, /*defer_weights=*/true);
    EXPECT_EQ(backend.waits, 4 + 4 * host_layers) << "forward and backward with the weights deferred";
    net.backward_weights(1);
    EXPECT_EQ(backend.waits, 5 + 4 * host_layers) << "the deferred weight gradients: kernels only, one wait";
  }
}

TEST(Train, LossFallsOver50Steps) {
  Whole w;
  Data d = make_data(64, 5);
  double first = 0.0, last = 0.0;
  for (int step = 0; step < 50; ++step) {
    StepStats s = w.trainer.train_step(d.images, d.labels.data(), 1);
    if (step == 0) first = s.loss_sum / 64;
    last = s.loss_sum / 64;
  }
  EXPECT_LT(last, 0.5 * first) << "loss " << first << " -> " << last;
  StepStats eval = w.trainer.evaluate(d.images, d.labels.data(), 16);
  EXPECT_GE(eval.correct, 56) << "training accuracy after 50 steps";
}

// The spec's loss is the one trained: MSE against one-hot labels learns the task too.
TEST(Train, MseLossTrainsAClassifier) {
  Whole w("mse");
  Data d = make_data(64, 5);
  double first = 0.0, last = 0.0;
  for (int step = 0; step < 80; ++step) {
    StepStats s = w.trainer.train_step(d.images, d.labels.data(), 2);
    if (step == 0) first = s.loss_sum / 64;
    last = s.loss_sum / 64;
  }
  EXPECT_LT(last, 0.6 * first) << "mse " << first << " -> " << last;
  EXPECT_GE(w.trainer.evaluate(d.images, d.labels.data(), 16).correct, 48) << "training accuracy after 80 steps";
}

TEST(Train, SameSeedGivesBitwiseEqualWeights) {
  Data d = make_data(32, 6);
  auto run = [&] {
    Whole w;
    for (int step = 0; step < 10; ++step) w.trainer.train_step(d.images, d.labels.data(), 2);
    return weights_of(w.net);
  };
  const auto a = run(), b = run();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST(Train, MicrobatchesEqualWholeBatch) {
  Data d = make_data(48, 7);
  auto run = [&](int k) {
    Whole w;
    for (int step = 0; step < 20; ++step) w.trainer.train_step(d.images, d.labels.data(), k);
    return weights_of(w.net);
  };
  const auto whole = run(1);
  EXPECT_LE(max_abs_diff(run(4), whole), 1e-5f);
  EXPECT_LE(max_abs_diff(run(5), whole), 1e-5f);  // uneven micro-batches
}

// relu1 -> pool1 runs as pool then ReLU (the ReLU folded into the pool); it must train like
// a spec that writes pool -> ReLU explicitly, where nothing is folded.
TEST(Train, ReluFoldedIntoPoolTrainsLikePoolThenRelu) {
  ModelSpec explicit_order = small_cnn();
  for (NodeSpec& n : explicit_order.nodes) {
    if (n.name == "pool1") n.inputs = {"conv1"};
    if (n.name == "relu1") n.inputs = {"pool1"};
    if (n.name == "flatten") n.inputs = {"relu1"};
  }
  Data d = make_data(32, 9);
  for (float& v : std::span(d.images.data(), static_cast<std::size_t>(d.images.numel())))
    v = std::round(v * 4.0f) / 4.0f;  // coarse values: ties inside pooling windows
  auto run = [&](const ModelSpec& spec, bool* folded) {
    auto backend = make_test_backend(backend_under_test());
    Network net(Graph::build(spec), *backend, 1234);
    Sgd opt(net.params(), sgd());
    LocalPipeline trainer({&net}, {&opt});
    Network::NodeTimes times;
    net.set_timing(&times);
    for (int step = 0; step < 10; ++step) trainer.train_step(d.images, d.labels.data(), 2);
    const auto& nodes = net.graph().nodes();
    for (std::size_t i = 0; i < nodes.size(); ++i)
      if (nodes[i].spec.name == "relu1") *folded = times.forward_s[i] == 0.0;  // a view is not timed
    return weights_of(net);
  };
  bool folded = false, explicit_folded = true;
  const auto a = run(small_cnn(), &folded), b = run(explicit_order, &explicit_folded);
  EXPECT_TRUE(folded) << "relu1 -> pool1 should run as a view plus the pool's ReLU";
  EXPECT_FALSE(explicit_folded);
  EXPECT_LE(max_abs_diff(a, b), 1e-6f);
}

TEST(Train, SplitEqualsWholeModel) {
  Data d = make_data(32, 8);
  Whole w;
  auto [front_graph, back_graph] = Graph::build(small_cnn()).split("pool1");
  Network front(front_graph, *w.backend, 1), back(back_graph, *w.backend, 2);
  for (Network* shard : {&front, &back})
    for (Param* p : shard->params()) {
      p->value().copy_from(w.net.param(p->name()).value());
      p->bump_version();
    }
  Sgd front_opt(front.params(), sgd()), back_opt(back.params(), sgd());
  LocalPipeline split({&front, &back}, {&front_opt, &back_opt});
  for (int step = 0; step < 10; ++step) {
    w.trainer.train_step(d.images, d.labels.data(), 1);
    split.train_step(d.images, d.labels.data(), 4);
  }
  for (Network* shard : {&front, &back})
    for (Param* p : shard->params()) {
      const Tensor& want = w.net.param(p->name()).value();
      float worst = 0.0f;
      for (int64_t i = 0; i < want.numel(); ++i) worst = std::max(worst, std::fabs(p->value()[i] - want[i]));
      EXPECT_LE(worst, 1e-5f) << p->name();
    }
}

// Zero-bubble's split of backward: input gradients first, parameter gradients later. Two
// copies of each model take the same micro-batches; one defers its weight gradients and runs
// them after every backward, in micro-batch order. Input and parameter gradients must be
// bitwise equal to the undeferred backward's (convolutions, linears, heads, batch norm,
// residual adds). A slot with weights pending refuses a forward, and zero_grad refuses.
TEST(Train, DeferredWeightGradientsEqualImmediateOnes) {
  // A residual block with batch norm, a linear and heads: every kind of node with parameters.
  ModelSpec residual;
  residual.name = "small-residual";
  residual.inputs.push_back({"image", Shape{8, 8, 1}});
  auto add = [&](const std::string& name, const std::string& op, std::vector<std::string> inputs) -> NodeSpec& {
    NodeSpec n;
    n.name = name;
    n.op = op;
    n.inputs = std::move(inputs);
    residual.nodes.push_back(n);
    return residual.nodes.back();
  };
  for (const char* conv : {"conv1", "conv2"}) {
    NodeSpec& c = add(conv, "conv2d", {conv == std::string("conv1") ? "image" : "relu1"});
    c.conv2d.out_channels = 4;
    c.conv2d.kernel = {3, 3};
    c.conv2d.padding = {1, 1};
    if (conv == std::string("conv1")) {
      add("bn1", "batch_norm", {"conv1"});
      add("relu1", "relu", {"bn1"});
    }
  }
  add("sum", "add", {"conv2", "relu1"});
  add("flatten", "flatten", {"sum"});
  add("fc", "linear", {"flatten"}).linear.out_features = 12;
  // (xnnpack has no grouped linear: heads are a cloud op.)
  const bool heads = backend_under_test() != "xnnpack";
  if (heads) add("heads", "heads", {"fc"}).heads = {3, 5, 2};
  residual.output = heads ? "heads" : "fc";
  std::vector<ModelSpec> specs = {small_cnn(), residual};
  for (const ModelSpec& spec : specs) {
    SCOPED_TRACE(spec.name);
    auto backend = make_test_backend(backend_under_test());
    const Graph graph = Graph::build(spec);
    Network now(graph, *backend, 11), later(graph, *backend, 11);
    Rng rng(5);
    const Shape& in = graph.inputs()[0].shape;
    std::vector<Tensor> inputs, grads_out;
    for (int mb = 0; mb < 3; ++mb) inputs.push_back(random_tensor(in.batched(2), rng, 0.0f, 1.0f));
    for (int step = 0; step < 2; ++step) {
      now.zero_grad();
      later.zero_grad();
      for (int mb = 0; mb < 3; ++mb) {
        const Tensor& a = now.forward(inputs[mb], mb);
        const Tensor& b = later.forward(inputs[mb], mb);
        ASSERT_EQ(std::memcmp(a.data(), b.data(), a.numel() * sizeof(float)), 0);
        if (grads_out.size() <= static_cast<std::size_t>(mb)) grads_out.push_back(random_tensor(a.shape(), rng));
      }
      std::vector<const float*> at_now, at_later;  // where each input gradient was left
      for (int mb = 0; mb < 3; ++mb) {
        const Tensor in_now = now.backward(grads_out[mb], mb, true);
        const Tensor in_later = later.backward(grads_out[mb], mb, true, true);
        at_now.push_back(in_now.data());
        at_later.push_back(in_later.data());
        const Tensor dx_now = in_now.clone(), dx_later = in_later.clone();
        EXPECT_TRUE(later.weights_pending(mb));
        ASSERT_EQ(std::memcmp(dx_now.data(), dx_later.data(), dx_now.numel() * sizeof(float)), 0) << "mb " << mb;
      }
      // Undeferred backwards share one set of buffers whatever their slot (what one returns
      // lives until the next); deferred ones keep their slot's until backward_weights.
      EXPECT_EQ(at_now[0], at_now[1]);
      EXPECT_EQ(at_now[1], at_now[2]);
      EXPECT_NE(at_later[0], at_later[1]);
      EXPECT_NE(at_later[1], at_later[2]);
      EXPECT_THROW(later.forward(inputs[0], 0), Error);
      EXPECT_THROW(later.zero_grad(), Error);
      for (int mb = 0; mb < 3; ++mb) later.backward_weights(mb);
      EXPECT_FALSE(later.any_weights_pending());
      for (Param* p : now.params()) {
        const Tensor& want = p->grad();
        const Tensor& got = later.param(p->name()).grad();
        EXPECT_EQ(std::memcmp(want.data(), got.data(), want.numel() * sizeof(float)), 0) << p->name();
      }
    }
  }
}

TEST(Train, SteadyStateStepDoesNotAllocate) {
  Whole w;
  Data d = make_data(32, 9);
  // tandem's own allocations and the vendor libraries' in one steady-state step.
  auto count_step = [&] {
    allocations = vendor_allocations = 0;
    counting = true;
    w.trainer.train_step(d.images, d.labels.data(), 5);  // uneven micro-batches: 7, 7, 6, 6, 6
    counting = false;
    return std::pair{allocations.load(), vendor_allocations.load()};
  };
  for (int step = 0; step < 3; ++step) w.trainer.train_step(d.images, d.labels.data(), 5);
  ASSERT_TRUE(backtrace_loaded);
  const auto first = count_step(), second = count_step(), third = count_step();
  if (tracing) print_traced();
  EXPECT_EQ(first.first + second.first + third.first, 0)
      << "tandem's heap allocations in 3 steady-state steps on " << backend_under_test();
  // oneDNN 2.6 builds a small argument map inside every primitive execution, and cuDNN 9's
  // legacy calls build theirs (neither reachable through the API): the count must not grow.
  EXPECT_EQ(first.second, second.second);
  EXPECT_EQ(second.second, third.second);
  std::printf("allocations per steady-state step on %s: tandem's %lld, its vendor libraries' %lld\n",
              std::string(backend_under_test()).c_str(), static_cast<long long>(third.first),
              static_cast<long long>(third.second));
}

// The heap bytes and allocations `run` makes (this binary's operator new).
template <typename Run>
std::pair<int64_t, int64_t> bytes_of(Run&& run) {
  allocations = allocated_bytes = 0;
  counting = true;
  run();
  counting = false;
  return {allocated_bytes.load(), allocations.load()};
}

// A chain of six linear layers of 64 with ReLUs between, read through a flatten of an 8x8
// image: 12 node outputs of one size. `frozen` linears (from the first) are frozen.
ModelSpec mlp_of_six(int frozen = 0) {
  ModelSpec spec;
  spec.name = "mlp";
  spec.inputs.push_back({"image", Shape{8, 8, 1}});
  NodeSpec flat;
  flat.name = "flat";
  flat.op = "flatten";
  flat.inputs = {"image"};
  spec.nodes.push_back(flat);
  std::string last = "flat";
  for (int i = 0; i < 6; ++i) {
    NodeSpec fc;
    fc.name = cat("fc", i);
    fc.op = "linear";
    fc.inputs = {last};
    fc.linear.out_features = 64;
    fc.freeze = i < frozen;
    spec.nodes.push_back(fc);
    NodeSpec relu;
    relu.name = cat("relu", i);
    relu.op = "relu";
    relu.inputs = {fc.name};
    spec.nodes.push_back(relu);
    last = relu.name;
  }
  spec.output = last;
  return spec;
}

// An evaluation forward hands each node output back to its slot's pool after its last reader:
// it allocates a fraction of what a training forward keeps, computes the same logits, allocates
// nothing the second time, and its slot refuses a backward with the reason.
TEST(Train, EvaluationKeepsOnlyWhatIsStillRead) {
  std::unique_ptr<Backend> backend = make_test_backend(backend_under_test());
  Network net(Graph::build(mlp_of_six()), *backend, 7);
  Data d = make_data(16, 4);
  Tensor trained;
  const auto training = bytes_of([&] { trained = net.forward(d.images, 1).clone(); });
  net.set_training(false);
  Tensor evaluated;
  const auto evaluation = bytes_of([&] { evaluated = net.forward(d.images, 2).clone(); });
  ASSERT_EQ(evaluated.shape(), trained.shape());
  for (int64_t i = 0; i < evaluated.numel(); ++i) EXPECT_EQ(evaluated[i], trained[i]) << "logit " << i;
  EXPECT_LT(evaluation.first * 2, training.first)
      << "an evaluation forward allocated " << evaluation.first << " bytes, a training one " << training.first;
  // oneDNN's own allocations inside its primitives count apart (in_vendor_library): none here.
  const auto again = bytes_of([&] { net.forward(d.images, 2); });
  EXPECT_EQ(again.second, 0) << "a second evaluation forward allocated";
  EXPECT_EQ(error_of([&] { net.backward(Tensor::zeros(trained.shape()), 2, false); }),
            "[network] mlp: backward of slot 2 after an evaluation forward, which keeps no activations "
            "(set_training(true) first)");
  // Back to training, the slot trains again.
  net.set_training(true);
  net.forward(d.images, 2);
  EXPECT_NO_THROW(net.backward(Tensor::zeros(trained.shape()), 2, false));
}

// An undeferred backward takes its gradients from a pool and gives each back once read: down
// a chain it holds two at a time, not one a tensor, allocates nothing the second time, and
// computes what the deferred backward (a buffer a tensor) computes.
TEST(Train, BackwardHoldsOnlyTheGradientsStillToBeRead) {
  std::unique_ptr<Backend> backend = make_test_backend(backend_under_test());
  Network net(Graph::build(mlp_of_six()), *backend, 7);
  Network deferred(Graph::build(mlp_of_six()), *backend, 7);
  Data d = make_data(16, 4);
  Rng rng(3);
  const Tensor dy = random_tensor({16, 64}, rng);
  // Kernels warm first (xnnpack makes a scratch at its first weight gradient), through a
  // deferred backward, which keeps buffers of its own.
  net.forward(d.images, 0);
  net.backward(dy, 0, true, /*defer_weights=*/true);
  net.backward_weights(0);
  auto undeferred = [&] {
    net.zero_grad();
    net.forward(d.images, 0);
    return bytes_of([&] { net.backward(dy, 0, true); });
  };
  const auto first = undeferred(), again = undeferred();
  const int64_t one = 16 * 64 * static_cast<int64_t>(sizeof(float));
  // Two gradients down the chain (the input's, kept for the caller, is one of them), where a
  // buffer a tensor took 13; the rest is bookkeeping (the pool's vectors, storage blocks).
  EXPECT_LE(first.first - again.first, 3 * one) << "the first backward allocated " << first.first << " bytes";
  EXPECT_EQ(again.second, 0) << "a second backward allocated";
  net.zero_grad();
  net.forward(d.images, 0);
  const Tensor dx = net.backward(dy, 0, true).clone();
  deferred.forward(d.images, 0);
  const Tensor dx_deferred = deferred.backward(dy, 0, true, /*defer_weights=*/true).clone();
  deferred.backward_weights(0);
  ASSERT_EQ(dx.shape(), dx_deferred.shape());
  EXPECT_EQ(std::memcmp(dx.data(), dx_deferred.data(), dx.bytes()), 0);
  for (Param* p : net.params()) {
    const Tensor& want = deferred.param(p->name()).grad();
    EXPECT_EQ(std::memcmp(want.data(), p->grad().data(), want.bytes()), 0) << p->name();
  }
}

// A front (no gradient for its input) runs backward only through the nodes that lead to a
// trained weight, as PyTorch's requires_grad: with the first three linears frozen, the nodes
// before the fourth never back up, its input gradient is not computed, a forward keeps less,
// and the trained weights get the gradients the unfrozen network gives them.
TEST(Train, AFrontBacksUpOnlyToItsFirstTrainedWeight) {
  std::unique_ptr<Backend> backend = make_test_backend(backend_under_test());
  Network frozen(Graph::build(mlp_of_six(3)), *backend, 7);
  Network all(Graph::build(mlp_of_six(0)), *backend, 7);
  Network frozen_any_input(Graph::build(mlp_of_six(3)), *backend, 7);
  frozen.set_input_gradient(false);
  all.set_input_gradient(false);
  EXPECT_LT(frozen.activation_floats().kept, frozen_any_input.activation_floats().kept);
  EXPECT_LT(frozen.activation_floats().kept, all.activation_floats().kept);
  Data d = make_data(16, 4);
  Rng rng(3);
  const Tensor dy = random_tensor({16, 64}, rng);
  Network::NodeTimes times;
  frozen.set_timing(&times);
  frozen.forward(d.images, 0);
  frozen.backward(dy, 0, false);
  frozen.set_timing(nullptr);
  all.forward(d.images, 0);
  all.backward(dy, 0, false);
  const auto& nodes = frozen.graph().nodes();
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    const bool before = n < 7;  // flat, fc0, relu0, fc1, relu1, fc2, relu2
    if (before) {
      EXPECT_EQ(times.backward_s[n], 0.0) << nodes[n].spec.name << " backed up";
    } else {
      EXPECT_GT(times.backward_s[n], 0.0) << nodes[n].spec.name << " did not back up";
    }
  }
  ASSERT_EQ(frozen.params().size(), 6u);  // fc3, fc4, fc5: weight and bias
  for (Param* p : frozen.params()) {
    const Tensor& want = all.param(p->name()).grad();
    EXPECT_EQ(std::memcmp(want.data(), p->grad().data(), want.bytes()), 0) << p->name();
  }
  EXPECT_EQ(error_of([&] { frozen.backward(dy, 0, true); }),
            "[network] mlp: backward asked for the input's gradient, but set_input_gradient(false)");
  EXPECT_EQ(error_of([&] { frozen.set_input_gradient(true); }),
            "[network] mlp: set_input_gradient after a forward (it decides what a forward keeps)");
}

// Attention computed again in backward (set_recompute, the edge's default) keeps no
// probabilities for the micro-batches in flight: three slots' forwards allocate at least two
// [batch, heads, tokens, tokens] tables less than with them stashed (the third is the thread's
// scratch, once), and the gradients are the same bit for bit.
TEST(Train, RecomputedAttentionKeepsNoProbabilities) {
  ModelSpec spec;
  spec.name = "attention";
  spec.inputs.push_back({"x", Shape{16, 8}});
  for (const char* name : {"q", "k", "v"}) {
    NodeSpec n;
    n.name = name;
    n.op = "linear";
    n.inputs = {"x"};
    n.linear.out_features = 8;
    spec.nodes.push_back(n);
  }
  NodeSpec att;
  att.name = "att";
  att.op = "attention";
  att.inputs = {"q", "k", "v"};
  att.attention.heads = 2;
  spec.nodes.push_back(att);
  spec.output = "att";
  std::unique_ptr<Backend> backend = make_test_backend(backend_under_test());
  Network stashed(Graph::build(spec), *backend, 7), recomputed(Graph::build(spec), *backend, 7);
  recomputed.set_recompute(true);
  Rng rng(5);
  std::vector<Tensor> xs, dys;
  for (int mb = 0; mb < 3; ++mb) xs.push_back(random_tensor({4, 16, 8}, rng)), dys.push_back(random_tensor({4, 16, 8}, rng));
  auto forwards = [&](Network& net) {
    return bytes_of([&] {
      for (int mb = 0; mb < 3; ++mb) net.forward(xs[static_cast<std::size_t>(mb)], mb);
    });
  };
  const int64_t table = 4 * 2 * 16 * 16 * static_cast<int64_t>(sizeof(float));
  const auto with = forwards(stashed), without = forwards(recomputed);
  EXPECT_LE(without.first + 2 * table - 256, with.first)  // 256: the scratch's shared-storage block
      << "stashed: " << with.first << " bytes, recomputed: " << without.first << " bytes";
  for (int mb = 0; mb < 3; ++mb) {
    stashed.backward(dys[static_cast<std::size_t>(mb)], mb, false);
    recomputed.backward(dys[static_cast<std::size_t>(mb)], mb, false);
  }
  for (Param* p : stashed.params()) {
    const Tensor& got = recomputed.param(p->name()).grad();
    EXPECT_EQ(std::memcmp(got.data(), p->grad().data(), got.bytes()), 0) << p->name();
  }
}

}  // namespace
}  // namespace tandem::test
