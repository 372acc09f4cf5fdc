#include "core/network.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <unordered_map>

#include "core/error.h"
#include "core/layers/layers.h"

namespace tandem {
namespace {

// The first shape.numel() values of `backing`, grown when too small: micro-batches of other
// sizes or lengths (length buckets) reuse one allocation instead of making their own each time.
Tensor view_of_backing(Tensor& backing, const Shape& shape) {
  if (!backing.defined() || backing.numel() < shape.numel()) backing = Tensor::empty(Shape{shape.numel()});
  return backing.prefix(shape);
}

// acc += add, elementwise, where the backend keeps them.
void add_into(VectorKernel& v, Tensor& acc, const Tensor& add) { v.accumulate(acc.data(), add.data(), acc.numel()); }
// to = from (equal element counts), likewise.
void copy_into(VectorKernel& v, Tensor& to, const Tensor& from) { v.copy(to.data(), from.data(), to.numel()); }

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A pass that throws part-way may leave kernel calls queued (a backend whose calls run ahead):
// they finish before the error unwinds into code that frees or rewrites their tensors. A
// failure of the wait itself is the device's, and the first error is the one to report.
class WaitOnUnwind {
 public:
  explicit WaitOnUnwind(Backend& backend) : backend_(backend), exceptions_(std::uncaught_exceptions()) {}
  ~WaitOnUnwind() {
    if (std::uncaught_exceptions() > exceptions_) try {
        backend_.wait();
      } catch (...) {
      }
  }
  WaitOnUnwind(const WaitOnUnwind&) = delete;
  WaitOnUnwind& operator=(const WaitOnUnwind&) = delete;

 private:
  Backend& backend_;
  int exceptions_;
};

}  // namespace

Network::Network(Graph graph, Backend& backend, uint64_t seed) : graph_(std::move(graph)), backend_(backend) {
  Rng rng(seed);
  const auto& nodes = graph_.nodes();
  for (const GraphNode& node : nodes) {
    std::vector<Shape> shapes;
    std::vector<int> ids;
    for (int s : node.sources) {
      ids.push_back(tensor_id(s));
      shapes.push_back(s >= 0 ? graph_.inputs()[static_cast<std::size_t>(s)].shape
                              : nodes[static_cast<std::size_t>(-s - 1)].shape);
    }
    if (const Support s = backend_.supports(node.spec.op, shapes); !s)
      fail("network", cat("node '", node.spec.name, "' (", node.spec.op, ") cannot run on the ", backend_.name(),
                          " backend: ", s.why));
    layers_.push_back(make_layer(node, shapes, backend_, rng));
    for (Param* p : layers_.back()->params()) {
      p->bind(backend_.vectors());
      all_params_.push_back(p);
      if (p->trainable()) params_.push_back(p);
      if (p->trainable() && !layers_.back()->splits_backward()) unsplit_params_.push_back(p);
    }
    input_ids_.push_back(std::move(ids));
  }
  fuse_relu_into_pools();
  for (auto& [name, buffer] : buffers()) state_buffers_.push_back(buffer);
  for (auto& [name, counter] : counters()) state_counters_.push_back(counter);
  const std::size_t tensors = graph_.inputs().size() + nodes.size();
  grads_.resize(tensors);
  contributions_.resize(tensors);
  grad_holder_.assign(tensors, -1);
  const int never = static_cast<int>(nodes.size());
  last_read_.assign(tensors, -1);
  for (std::size_t n = 0; n < nodes.size(); ++n)
    for (int id : input_ids_[n]) last_read_[static_cast<std::size_t>(id)] = std::max(last_read_[static_cast<std::size_t>(id)], static_cast<int>(n));
  for (std::size_t i = 0; i < graph_.inputs().size(); ++i) last_read_[i] = never;
  last_read_[graph_.inputs().size() + static_cast<std::size_t>(graph_.output())] = never;
  // A view's output shares its source's storage: the source lives as long as the view.
  for (std::size_t n = nodes.size(); n-- > 0;) {
    if (!layers_[n]->is_view()) continue;
    const auto out = graph_.inputs().size() + n, src = static_cast<std::size_t>(input_ids_[n][0]);
    last_read_[src] = std::max(last_read_[src], last_read_[out]);
  }
  plan_backward();
}

void Network::refuse_after_forward(const char* setting) const {
  if (std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return !s.values.empty(); }))
    fail("network", cat(graph_.name(), ": ", setting, " after a forward (it decides what a forward keeps)"));
}

void Network::set_input_gradient(bool wanted) {
  if (wanted == input_gradient_) return;
  refuse_after_forward("set_input_gradient");
  input_gradient_ = wanted;
  plan_backward();
}

void Network::set_reducer(Reducer* reducer) {
  for (auto& l : layers_) l->set_reducer(reducer);
}

void Network::set_recompute(bool recompute) {
  if (recompute == recompute_) return;
  refuse_after_forward("set_recompute");
  recompute_ = recompute;
  for (auto& l : layers_) l->set_recompute(recompute);
  plan_backward();
}

void Network::plan_backward() {
  const auto& nodes = graph_.nodes();
  const std::size_t first_node = graph_.inputs().size();
  // Only the output and its ancestors take part in backward.
  needs_grad_.assign(nodes.size(), false);
  needs_grad_[static_cast<std::size_t>(graph_.output())] = true;
  for (int i = graph_.output(); i >= 0; --i) {
    if (!needs_grad_[static_cast<std::size_t>(i)]) continue;
    for (int s : nodes[static_cast<std::size_t>(i)].sources)
      if (s < 0) needs_grad_[static_cast<std::size_t>(-s - 1)] = true;
  }
  // Of those, the nodes with work: a trainable parameter, or an input whose gradient someone
  // wants (in topological order, so each node's inputs are decided first).
  grad_wanted_.assign(first_node + nodes.size(), false);
  if (first_node > 0) grad_wanted_[0] = input_gradient_;
  runs_backward_.assign(nodes.size(), false);
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    runs_backward_[n] = needs_grad_[n] && (trains(n) || passes_gradient(n));
    grad_wanted_[first_node + n] = runs_backward_[n];
  }
  // Graph inputs are the caller's and the output is read by the caller: both kept. Otherwise
  // what the backwards that run read (Layer::backward_reads).
  retained_.assign(first_node + nodes.size(), false);
  for (std::size_t i = 0; i < first_node; ++i) retained_[i] = true;
  retained_[first_node + static_cast<std::size_t>(graph_.output())] = true;
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    if (layers_[n]->is_view() || !runs_backward_[n]) continue;
    const Layer::Reads reads = layers_[n]->backward_reads();
    if (reads.output) retained_[first_node + n] = true;
    for (std::size_t k = 0; k < input_ids_[n].size(); ++k)
      if (k >= 32 || (reads.inputs >> k & 1u)) retained_[static_cast<std::size_t>(input_ids_[n][k])] = true;
  }
  // A view is kept when its output is (their storage is one).
  for (std::size_t n = nodes.size(); n-- > 0;) {
    if (!layers_[n]->is_view()) continue;
    const auto out = first_node + n, src = static_cast<std::size_t>(input_ids_[n][0]);
    if (retained_[out]) retained_[src] = true;
  }
}

bool Network::trains(std::size_t n) const {
  const auto params = layers_[n]->params();
  return std::any_of(params.begin(), params.end(), [](const Param* p) { return p->trainable(); });
}

bool Network::passes_gradient(std::size_t n) const {
  return std::any_of(input_ids_[n].begin(), input_ids_[n].end(),
                     [&](int id) { return grad_wanted_[static_cast<std::size_t>(id)]; });
}

bool Network::computes_weight_grads(int node) const {
  const auto n = static_cast<std::size_t>(node);
  return runs_backward_.at(n) && trains(n);
}

bool Network::computes_input_grads(int node) const {
  const auto n = static_cast<std::size_t>(node);
  return runs_backward_.at(n) && passes_gradient(n);
}

// A ReLU read by nothing but a max pool without padding runs after the pool instead, on the
// smaller tensor (max commutes with ReLU; the gradients match, ties included): the ReLU
// node becomes a view of its input. Not for the output, whose value callers read.
void Network::fuse_relu_into_pools() {
  const auto& nodes = graph_.nodes();
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    if (dynamic_cast<ReluLayer*>(layers_[n].get()) == nullptr || static_cast<int>(n) == graph_.output()) continue;
    int readers = 0, pool = -1;
    for (std::size_t c = 0; c < nodes.size(); ++c)
      for (int s : nodes[c].sources)
        if (s == -static_cast<int>(n) - 1) {
          ++readers;
          pool = static_cast<int>(c);
        }
    if (readers != 1) continue;
    auto* p = dynamic_cast<MaxPool2dLayer*>(layers_[static_cast<std::size_t>(pool)].get());
    if (p == nullptr || !p->can_fuse_relu()) continue;
    p->fuse_relu();
    layers_[n] = std::make_unique<ViewLayer>(nodes[n].spec.name);
  }
}

int Network::tensor_id(int source) const {
  return source >= 0 ? source : static_cast<int>(graph_.inputs().size()) + (-source - 1);
}

Param& Network::param(const std::string& name) {
  for (Param* p : all_params())
    if (p->name() == name) return *p;
  fail("network", cat("no parameter named '", name, "'"));
}

std::vector<std::pair<std::string, Tensor*>> Network::buffers() {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (auto& layer : layers_)
    for (auto& b : layer->buffers()) out.push_back(b);
  return out;
}

std::vector<std::pair<std::string, uint64_t*>> Network::counters() {
  std::vector<std::pair<std::string, uint64_t*>> out;
  for (auto& layer : layers_)
    for (auto& c : layer->counters()) out.push_back(c);
  return out;
}

bool Network::gradients_finite() const {
  // A sum of squares is finite exactly when every value is (f32's largest squared is far
  // inside double's range): one pass where the gradients are, no host read of them.
  return std::all_of(params_.begin(), params_.end(), [](const Param* p) {
    return std::isfinite(p->vectors().squared_norm(p->grad().data(), p->grad().numel()));
  });
}

void Network::save_state(StateSnapshot& into) const {
  into.buffers.resize(state_buffers_.size());
  for (std::size_t i = 0; i < state_buffers_.size(); ++i) {
    const Tensor& b = *state_buffers_[i];
    sized(into.buffers[i], b.shape()).copy_from(b);
  }
  into.counters.resize(state_counters_.size());
  for (std::size_t i = 0; i < state_counters_.size(); ++i) into.counters[i] = *state_counters_[i];
}

void Network::restore_state(const StateSnapshot& from) {
  for (std::size_t i = 0; i < state_buffers_.size() && i < from.buffers.size(); ++i)
    state_buffers_[i]->copy_from(from.buffers[i]);
  for (std::size_t i = 0; i < state_counters_.size() && i < from.counters.size(); ++i)
    *state_counters_[i] = from.counters[i];
}

int64_t Network::param_count() {
  int64_t n = 0;
  for (Param* p : params()) n += p->value().numel();
  return n;
}

Network::ActivationFloats Network::activation_floats() const {
  ActivationFloats f;
  const std::size_t first = graph_.inputs().size();
  for (std::size_t id = 0; id < retained_.size(); ++id) {
    if (id >= first && layers_[id - first]->is_view()) continue;  // its source's storage
    const int64_t n = id < first ? graph_.inputs()[id].shape.numel() : graph_.nodes()[id - first].shape.numel();
    f.all += n;
    if (retained_[id]) f.kept += n;
  }
  return f;
}

void Network::set_timing(NodeTimes* times) {
  times_ = times;
  if (times_ == nullptr) return;
  times_->forward_s.assign(graph_.nodes().size(), 0.0);
  times_->backward_s.assign(graph_.nodes().size(), 0.0);
  times_->weights_s.assign(graph_.nodes().size(), 0.0);
}

void Network::set_training(bool training) {
  training_ = training;
  for (auto& l : layers_) l->set_training(training);
}

Tensor Network::from_pool(std::vector<Tensor>& pool, const Shape& shape, Tensor* taken) {
  std::size_t best = pool.size();
  for (std::size_t i = 0; i < pool.size(); ++i)
    if (pool[i].numel() >= shape.numel() && (best == pool.size() || pool[i].numel() < pool[best].numel()))
      best = i;
  Tensor backing = best < pool.size() ? std::move(pool[best]) : Tensor::empty(Shape{shape.numel()});
  if (best < pool.size()) pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(best));
  if (taken) *taken = backing;
  return backing.prefix(shape);
}

void Network::zero_grad() {
  if (any_weights_pending())
    fail("network", cat(graph_.name(), ": zero_grad while a deferred backward's weight gradients are pending"));
  for (Param* p : params_) p->zero_grad();
}

bool Network::weights_pending(int slot_index) const {
  return slot_index >= 0 && static_cast<std::size_t>(slot_index) < slots_.size() &&
         slots_[static_cast<std::size_t>(slot_index)].weights_pending;
}

bool Network::any_weights_pending() const {
  return std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.weights_pending; });
}

void Network::drop_deferred_weights() {
  for (Slot& s : slots_) {
    if (!s.weights_pending) continue;
    for (Tensor& t : s.deferred_grad_out) t = Tensor();
    s.weights_pending = false;
  }
}

void Network::backward_weights(int slot_index) {
  if (!weights_pending(slot_index)) return;
  const WaitOnUnwind unwinding(backend_);
  Slot& s = slots_[static_cast<std::size_t>(slot_index)];
  const std::size_t first_node = graph_.inputs().size();
  for (std::size_t n = graph_.nodes().size(); n-- > 0;) {
    Tensor& grad_out = s.deferred_grad_out[n];
    if (!grad_out.defined()) continue;
    node_inputs_.clear();
    for (int in_id : input_ids_[n]) node_inputs_.push_back(s.values[static_cast<std::size_t>(in_id)]);
    const double t0 = times_ ? now_s() : 0.0;
    if (layers_[n]->touches_host()) backend_.wait();
    layers_[n]->backward_weights(node_inputs_, s.values[first_node + n], grad_out, s.stashes[n]);
    if (times_) times_->weights_s[n] += (backend_.wait(), now_s()) - t0;  // the work, not its launch
    grad_out = Tensor();
  }
  s.weights_pending = false;
  backend_.wait();  // the gradients are whole for whoever reads them next (an optimizer, a save)
}

Network::Slot& Network::slot(int index) {
  if (index < 0) fail("network", cat("negative micro-batch slot ", index));
  if (static_cast<std::size_t>(index) >= slots_.size()) {
    slots_.resize(static_cast<std::size_t>(index) + 1);
  }
  Slot& s = slots_[static_cast<std::size_t>(index)];
  if (s.values.empty()) {
    s.values.resize(graph_.inputs().size() + graph_.nodes().size());
    s.stashes.resize(graph_.nodes().size());
    s.backing.resize(graph_.nodes().size());
  }
  return s;
}

Tensor& Network::buffer(Buffers& pool, int id, const Shape& shape) {
  const auto i = static_cast<std::size_t>(id);
  if (pool.view.size() <= i) pool.view.resize(i + 1), pool.backing.resize(i + 1);
  Tensor& t = pool.view[i];
  if (!t.defined() || t.shape() != shape) t = view_of_backing(pool.backing[i], shape);
  return t;
}

const Tensor& Network::forward(std::span<const Tensor> inputs, int slot_index) {
  const WaitOnUnwind unwinding(backend_);
  const auto& graph_inputs = graph_.inputs();
  if (inputs.size() != graph_inputs.size())
    fail("network", cat(graph_.name(), ": expected ", graph_inputs.size(), " inputs, got ", inputs.size()));
  const int64_t batch = inputs.empty() ? 0 : inputs[0].shape()[0];
  // With length buckets the sequences may run shorter: every per-token shape follows.
  const int64_t length = graph_.sequence_length(inputs);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Shape want = Graph::at_length(graph_inputs[i].shape, graph_inputs[i].tokens, length).batched(batch);
    if (inputs[i].shape() != want)
      fail("network", cat(graph_.name(), ": input '", graph_inputs[i].name, "' has shape ", inputs[i].shape().str(),
                          ", expected ", want.str()));
  }
  Slot& s = slot(slot_index);
  if (s.weights_pending)
    fail("network", cat(graph_.name(), ": forward into slot ", slot_index, " before its deferred weight gradients"));
  for (std::size_t i = 0; i < inputs.size(); ++i) s.values[i] = inputs[i];
  const bool evaluation = !training_;
  if (evaluation) {
    // What the slot's last pass left (a training pass's storage, an evaluation's output) is
    // free for this one, as a training pass overwrites its own.
    s.pool.reserve(graph_.nodes().size() + 1);  // never more than every node output: no growth
    for (Tensor& b : s.backing)
      if (b.defined()) s.pool.push_back(std::move(b));
    for (std::size_t id = inputs.size(); id < s.values.size(); ++id) {
      Tensor& v = s.values[id];
      const bool view = layers_[id - inputs.size()]->is_view();
      const bool read_again = std::any_of(inputs.begin(), inputs.end(), [&](const Tensor& in) { return in.data() == v.data(); });
      if (s.evaluated && v.defined() && !view && !read_again) s.pool.push_back(v);
      v = Tensor();
    }
  }
  s.evaluated = evaluation;

  const auto& nodes = graph_.nodes();
  const std::size_t first_node = graph_inputs.size();
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    node_inputs_.clear();
    for (int id : input_ids_[n]) node_inputs_.push_back(s.values[static_cast<std::size_t>(id)]);
    const Shape out_shape = Graph::at_length(nodes[n].shape, nodes[n].tokens, length).batched(batch);
    Tensor& out = s.values[first_node + n];
    const std::size_t out_id = first_node + n;
    // Transient tensors read for the last time (or never) give their storage back; their
    // values stay in the slot for their shapes only.
    auto give_back_transients = [&] {
      if (s.transient.empty()) return;
      auto give_back = [&](std::size_t id) {
        if (retained_[id] || !s.transient[id].defined()) return;
        transients_.push_back(std::move(s.transient[id]));
        s.transient[id] = Tensor();
      };
      for (int in : input_ids_[n])
        for (auto id = static_cast<std::size_t>(in);;) {  // through views to their sources
          if (last_read_[id] == static_cast<int>(n)) give_back(id);
          if (id < first_node || !layers_[id - first_node]->is_view()) break;
          id = static_cast<std::size_t>(input_ids_[id - first_node][0]);
        }
      if (last_read_[out_id] < 0 && !layers_[n]->is_view()) give_back(out_id);
    };
    if (layers_[n]->is_view()) {
      out = node_inputs_[0].reshape(out_shape);
      if (!evaluation) give_back_transients();  // a view nothing reads ends its source's life here
      continue;
    }
    if (evaluation) {
      out = from_pool(s.pool, out_shape);
    } else if (!retained_[out_id]) {
      if (s.transient.size() != s.values.size()) s.transient.resize(s.values.size());
      out = from_pool(transients_, out_shape, &s.transient[out_id]);
    } else if (!out.defined() || out.shape() != out_shape) {
      // After an evaluation in this slot, its pool holds what the slot's training had.
      out = !s.backing[n].defined() && !s.pool.empty() ? from_pool(s.pool, out_shape, &s.backing[n])
                                                        : view_of_backing(s.backing[n], out_shape);
    }
    const double t0 = times_ ? now_s() : 0.0;
    if (layers_[n]->touches_host()) backend_.wait();
    layers_[n]->forward(node_inputs_, out, s.stashes[n]);
    if (times_) times_->forward_s[n] += (backend_.wait(), now_s()) - t0;
    if (!evaluation) {
      give_back_transients();
      continue;
    }
    for (int id : input_ids_[n]) {  // inputs read for the last time go back to the pool
      Tensor& v = s.values[static_cast<std::size_t>(id)];
      if (last_read_[static_cast<std::size_t>(id)] != static_cast<int>(n) || !v.defined()) continue;
      const std::size_t node = static_cast<std::size_t>(id) - first_node;
      if (!layers_[node]->is_view()) s.pool.push_back(v);
      v = Tensor();
    }
  }
  if (!evaluation) s.pool.clear();  // training keeps a backing a node; what it did not take goes
  backend_.wait();  // the output is whole for the host (the loss, the wire)
  return s.values[first_node + static_cast<std::size_t>(graph_.output())];
}

const Tensor& Network::forward_in_pieces(std::span<const Tensor> inputs, int slot, int64_t piece, Joined& joined) {
  const int64_t count = inputs.empty() ? 0 : inputs[0].shape()[0];
  if (piece <= 0 || count <= piece) return forward(inputs, slot);
  joined.piece_inputs.resize(inputs.size());
  for (int64_t begin = 0; begin < count; begin += piece) {
    const int64_t n = std::min(piece, count - begin);
    for (std::size_t k = 0; k < inputs.size(); ++k) joined.piece_inputs[k] = inputs[k].slice_batch(begin, n);
    const Tensor& out = forward(joined.piece_inputs, slot);
    if (begin == 0) joined.out = view_of_backing(joined.storage, out.shape().resize_batch(count));
    backend_.vectors().copy(joined.out.data() + begin * out.shape().item_numel(), out.data(), out.numel());
  }
  backend_.wait();  // the joined output is whole for the host
  return joined.out;
}

const Tensor& Network::output(int slot_index) const {
  if (slot_index < 0 || static_cast<std::size_t>(slot_index) >= slots_.size() ||
      slots_[static_cast<std::size_t>(slot_index)].values.empty())
    fail("network", cat(graph_.name(), ": no forward in slot ", slot_index));
  const Slot& s = slots_[static_cast<std::size_t>(slot_index)];
  return s.values[graph_.inputs().size() + static_cast<std::size_t>(graph_.output())];
}

Tensor Network::backward(const Tensor& grad_output, int slot_index, bool want_input_grad, bool defer_weights) {
  if (slot_index < 0 || static_cast<std::size_t>(slot_index) >= slots_.size() || slots_[static_cast<std::size_t>(slot_index)].values.empty())
    fail("network", cat(graph_.name(), ": backward of slot ", slot_index, " before its forward"));
  const WaitOnUnwind unwinding(backend_);
  Slot& s = slots_[static_cast<std::size_t>(slot_index)];
  if (s.weights_pending)
    fail("network", cat(graph_.name(), ": backward of slot ", slot_index, " before its deferred weight gradients"));
  if (s.evaluated)
    fail("network", cat(graph_.name(), ": backward of slot ", slot_index,
                        " after an evaluation forward, which keeps no activations (set_training(true) first)"));
  const std::size_t first_node = graph_.inputs().size();
  const auto& nodes = graph_.nodes();
  const std::size_t out_id = first_node + static_cast<std::size_t>(graph_.output());
  if (grad_output.shape() != s.values[out_id].shape())
    fail("network", cat(graph_.name(), ": output gradient has shape ", grad_output.shape().str(), ", expected ",
                        s.values[out_id].shape().str()));

  if (want_input_grad && !input_gradient_)
    fail("network", cat(graph_.name(), ": backward asked for the input's gradient, but set_input_gradient(false)"));
  std::fill(contributions_.begin(), contributions_.end(), 0);
  for (auto& g : grads_) g = Tensor();
  // The last backward's gradients (its input gradient included) are free again.
  std::fill(grad_pool_.users.begin(), grad_pool_.users.end(), 0);
  std::fill(grad_holder_.begin(), grad_holder_.end(), -1);
  grads_[out_id] = grad_output;  // the caller's: never written
  contributions_[out_id] = 1;

  // A deferred backward keeps its gradients in the slot's own buffers until backward_weights,
  // a buffer a tensor; an undeferred one takes them from the pool and gives them back.
  BackwardBuffers& deferred = s.deferred;
  for (std::size_t n = nodes.size(); n-- > 0;) {
    if (!runs_backward_[n]) continue;
    const std::size_t id = first_node + n;
    if (contributions_[id] == 0) continue;  // nothing downstream used this output
    const Tensor& grad_out = grads_[id];
    node_inputs_.clear();
    node_grads_.clear();
    node_holders_.clear();
    for (int in_id : input_ids_[n]) node_inputs_.push_back(s.values[static_cast<std::size_t>(in_id)]);
    for (int in_id : input_ids_[n]) {
      const auto i = static_cast<std::size_t>(in_id);
      node_holders_.push_back(-1);
      if (!grad_wanted_[i] || (i < first_node && !want_input_grad)) {
        node_grads_.emplace_back();
        continue;
      }
      const Shape& shape = s.values[i].shape();
      const auto position = static_cast<int>(node_grads_.size());
      if (layers_[n]->is_view()) {  // shares the output gradient's storage
        node_grads_.push_back(grad_out.reshape(shape));
        if ((node_holders_.back() = grad_holder_[id]) >= 0) ++grad_pool_.users[static_cast<std::size_t>(grad_holder_[id])];
      } else if (!defer_weights) {
        node_holders_.back() = take_grad(shape);
        node_grads_.push_back(grad_pool_.storage[static_cast<std::size_t>(node_holders_.back())].prefix(shape));
      } else if (std::find(input_ids_[n].begin(), input_ids_[n].begin() + position, in_id) !=
                 input_ids_[n].begin() + position) {  // the same tensor read twice (concat(x, x)): a buffer of its own
        node_grads_.push_back(buffer(deferred.repeats, position, shape));
      } else if (contributions_[i] == 0) {
        node_grads_.push_back(buffer(deferred.grads, in_id, shape));
      } else {
        node_grads_.push_back(buffer(deferred.scratch, in_id, shape));
      }
    }
    if (!layers_[n]->is_view()) {
      const double t0 = times_ ? now_s() : 0.0;
      if (defer_weights && layers_[n]->splits_backward()) {
        // grad_out is final here (every consumer of this node ran) and lives in the slot's
        // own buffers (s.deferred), which nothing writes before the slot's next backward.
        if (layers_[n]->touches_host()) backend_.wait();
        layers_[n]->backward_data(node_inputs_, s.values[id], grad_out, node_grads_, s.stashes[n]);
        if (s.deferred_grad_out.size() != nodes.size()) s.deferred_grad_out.resize(nodes.size());
        s.deferred_grad_out[n] = grad_out;
        s.weights_pending = true;
      } else {
        if (layers_[n]->touches_host()) backend_.wait();
        layers_[n]->backward(node_inputs_, s.values[id], grad_out, node_grads_, s.stashes[n]);
      }
      if (times_) times_->backward_s[n] += (backend_.wait(), now_s()) - t0;
    }
    // Fold each input's gradient into what earlier consumers left there.
    for (std::size_t k = 0; k < input_ids_[n].size(); ++k) {
      if (!node_grads_[k].defined()) continue;
      const auto i = static_cast<std::size_t>(input_ids_[n][k]);
      const int held = node_holders_[k];
      if (contributions_[i]++ == 0) {
        grads_[i] = node_grads_[k];
        if ((grad_holder_[i] = held) >= 0) ++grad_pool_.users[static_cast<std::size_t>(held)];
      } else if (defer_weights) {
        Tensor& own = buffer(deferred.grads, static_cast<int>(i), grads_[i].shape());
        if (own.data() != grads_[i].data()) copy_into(backend_.vectors(), own, grads_[i]);
        add_into(backend_.vectors(), own, node_grads_[k]);
        grads_[i] = own;
      } else {
        // Added in place where the gradient's storage is its own, else into a copy.
        const int mine = grad_holder_[i];
        if (mine < 0 || grad_pool_.users[static_cast<std::size_t>(mine)] > 1) {
          const int own = take_grad(grads_[i].shape());
          Tensor copy = grad_pool_.storage[static_cast<std::size_t>(own)].prefix(grads_[i].shape());
          copy_into(backend_.vectors(), copy, grads_[i]);
          if (mine >= 0) release_grad(mine);
          grads_[i] = copy;
          grad_holder_[i] = own;
        }
        add_into(backend_.vectors(), grads_[i], node_grads_[k]);
      }
      if (held >= 0) release_grad(held);
    }
    // This node's output gradient was read for the last time.
    if (grad_holder_[id] >= 0 && !defer_weights) release_grad(grad_holder_[id]);
    grad_holder_[id] = -1;
  }
  backend_.wait();  // the input gradient is whole for the host (the wire, the stage before)
  return want_input_grad ? grads_[0] : Tensor();
}

int Network::take_grad(const Shape& shape) {
  GradPool& p = grad_pool_;
  std::size_t best = p.storage.size();
  for (std::size_t i = 0; i < p.storage.size(); ++i)
    if (p.users[i] == 0 && p.storage[i].numel() >= shape.numel() &&
        (best == p.storage.size() || p.storage[i].numel() < p.storage[best].numel()))
      best = i;
  if (best == p.storage.size()) {  // none holds it: the largest free one grows (at most the peak's count), else a new one
    for (std::size_t i = 0; i < p.storage.size(); ++i)
      if (p.users[i] == 0 && (best == p.storage.size() || p.storage[i].numel() > p.storage[best].numel())) best = i;
    if (best == p.storage.size()) {
      p.storage.emplace_back();
      p.users.push_back(0);
    }
    p.storage[best] = Tensor();  // the old storage goes before the new one comes
    p.storage[best] = Tensor::empty(Shape{shape.numel()});
  }
  p.users[best] = 1;
  return static_cast<int>(best);
}

void Network::release_grad(int index) { --grad_pool_.users[static_cast<std::size_t>(index)]; }

void init_from_whole_model(const Graph& whole, uint64_t seed, std::span<Network* const> shards, Backend& whole_backend) {
  // The whole model's layers one at a time, drawing from one Rng in the order Network's
  // constructor does; a layer is dropped once the shards have taken its parameters, so the
  // whole model is never held at once.
  std::unordered_map<std::string, Param*> wanted;
  for (Network* shard : shards)
    for (Param* p : shard->all_params())
      if (!wanted.emplace(p->name(), p).second)
        fail("network", cat("two shards of ", whole.name(), " hold a parameter named '", p->name(), "'"));
  Rng rng(seed);
  const auto& nodes = whole.nodes();
  for (std::size_t n = 0; n < nodes.size() && !wanted.empty(); ++n) {
    std::vector<Shape> shapes;
    for (int s : nodes[n].sources)
      shapes.push_back(s >= 0 ? whole.inputs()[static_cast<std::size_t>(s)].shape
                              : nodes[static_cast<std::size_t>(-s - 1)].shape);
    const std::unique_ptr<Layer> layer = make_layer(nodes[n], shapes, whole_backend, rng);
    for (Param* p : layer->params()) {
      const auto it = wanted.find(p->name());
      if (it == wanted.end()) continue;
      it->second->value().copy_from(p->value());
      it->second->bump_version();
      wanted.erase(it);
    }
  }
  if (!wanted.empty()) fail("network", cat("no parameter named '", wanted.begin()->first, "' in ", whole.name()));
}

void init_from_whole_model(const Graph& whole, uint64_t seed, Network& shard, Backend& whole_backend) {
  Network* one = &shard;
  init_from_whole_model(whole, seed, std::span<Network* const>(&one, 1), whole_backend);
}

}  // namespace tandem
