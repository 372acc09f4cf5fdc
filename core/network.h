// Network: runs a Graph (a whole model or one shard) on a backend. Each micro-batch in
// flight lives in its own slot (activations and stashes), so K can be forwarded before any
// is backed up; parameter gradients accumulate until zero_grad().
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "core/graph.h"
#include "core/parallel.h"
#include "core/layers/layer.h"

namespace tandem {

class Network {
 public:
  // Initialises parameters in graph order from Rng(seed).
  Network(Graph graph, Backend& backend, uint64_t seed);

  const Graph& graph() const { return graph_; }
  Backend& backend() const { return backend_; }
  // The trainable parameters (what optimizers, checkpoints and federation rounds hold).
  const std::vector<Param*>& params() const { return params_; }
  // Every parameter, frozen ones too (what weights are loaded into and exported from).
  const std::vector<Param*>& all_params() const { return all_params_; }
  // The trainable parameters whose layers add their gradients during backward even when it
  // defers weights (Layer::splits_backward false: batch norm, layer norm, embeddings).
  const std::vector<Param*>& unsplit_params() const { return unsplit_params_; }
  // Whether a backward may be asked for the gradient of input 0 (the default: a back shard's
  // cut). A front, whose input is data, says no before its first forward: its backward then
  // runs only the nodes that lead to a trainable parameter, as PyTorch's requires_grad does
  // (a LoRA encoder skips its frozen embeddings and every key projection's input gradient),
  // and its forward keeps only what those nodes read.
  void set_input_gradient(bool wanted);
  // Whether layers compute again in backward what their forward would stash for it
  // (Layer::set_recompute: attention's probabilities), for a party short of memory. Off by
  // default; set before the first forward.
  void set_recompute(bool recompute);
  // The shard group a layer-sharded stage's tp_copy and tp_reduce nodes sum over (not owned;
  // core/parallel.h). A forward through one without it is an Error naming the node.
  void set_reducer(Reducer* reducer);
  Param& param(const std::string& name);
  int64_t param_count();
  // Floats of one sample's tensors at the spec's shapes: what a training slot keeps for
  // backward (the inputs, the output, what Layer::backward_reads names) and every tensor
  // (a forward passes through at most all of them; a backward's buffers hold as many).
  struct ActivationFloats {
    int64_t kept = 0, all = 0;
  };
  ActivationFloats activation_floats() const;
  // Every layer's non-trained state (layer.h), in graph order, for checkpoints and export.
  std::vector<std::pair<std::string, Tensor*>> buffers();
  std::vector<std::pair<std::string, uint64_t*>> counters();
  // That state copied out and put back (steady state: no allocation). A forward moves batch
  // norm's running statistics: a micro-batch refused after its forward must not leave them moved.
  struct StateSnapshot {
    std::vector<Tensor> buffers;
    std::vector<uint64_t> counters;
  };
  bool has_state() const { return !state_buffers_.empty() || !state_counters_.empty(); }
  void save_state(StateSnapshot& into) const;
  void restore_state(const StateSnapshot& from);

  // Forward of one micro-batch into `slot`; the returned output stays valid until the next
  // forward into the same slot. Inputs are [batch, per-sample shape...] and are kept
  // (shared, not copied) for backward.
  const Tensor& forward(std::span<const Tensor> inputs, int slot);
  const Tensor& forward(const Tensor& input, int slot) { return forward(std::span<const Tensor>(&input, 1), slot); }

  // Forward of the inputs' samples (their first dimension) at most `piece` at a time into
  // `slot`, the outputs put together in `joined` (its storage reused from call to call): an
  // evaluation chunk then runs on a micro-batch's kernels and memory. With piece <= 0 or no
  // more samples than it, one forward (its output returned as forward's is).
  struct Joined {
    std::vector<Tensor> piece_inputs;
    Tensor out, storage;
  };
  const Tensor& forward_in_pieces(std::span<const Tensor> inputs, int slot, int64_t piece, Joined& joined);

  // The output of the last forward into `slot` (throws if there was none).
  const Tensor& output(int slot) const;

  // Backward of the micro-batch in `slot` from the gradient of the output. Accumulates
  // parameter gradients; returns the gradient of input 0 when asked (else an empty tensor).
  // The returned gradient is valid until the next backward.
  // With `defer_weights`, layers that can split their backward (Layer::splits_backward)
  // leave their parameter gradients for backward_weights(slot): the input gradient is ready
  // sooner (zero-bubble's split: a party in the middle sends it, then computes the rest).
  Tensor backward(const Tensor& grad_output, int slot, bool want_input_grad, bool defer_weights = false);
  // The parameter gradients a deferred backward of `slot` left; accumulated exactly as an
  // undeferred backward would. Must run before the slot's next forward or backward, and
  // before the gradients are read (both refuse while any is pending). Nothing pending: no-op.
  void backward_weights(int slot);
  bool weights_pending(int slot) const;
  // What a backward computes at node `node` (as set_input_gradient and the frozen parameters
  // leave it): its parameters' gradients (it has a trainable one) and its inputs' (one of
  // them is wanted). The planner's FLOP estimate counts these.
  bool computes_weight_grads(int node) const;
  bool computes_input_grads(int node) const;
  bool any_weights_pending() const;
  // Forgets every pending weight-gradient pass (an abandoned step's).
  void drop_deferred_weights();

  void zero_grad();
  // Whether every trainable parameter's gradient is finite (an update must not take others).
  bool gradients_finite() const;
  // Training (default) or evaluation mode for every layer (batch norm uses batch statistics
  // and updates its running ones only in training). An evaluation forward keeps no more than
  // it needs: each node output goes back to the slot's pool once its last reader ran, so it
  // holds a few tensors at a time, not every node's output; its slot cannot be backed up.
  void set_training(bool training);

  // When set, each node's forward and backward wall time is added to times (indexed like
  // graph().nodes()); the caller owns it. For the profiler; off (null) by default.
  struct NodeTimes {
    std::vector<double> forward_s, backward_s;
    std::vector<double> weights_s;  // deferred weight-gradient passes (backward_weights)
  };
  void set_timing(NodeTimes* times);

 private:
  // Tensors of the shape last asked for (`view`), each a view of the largest allocation made
  // for it so far (`backing`), indexed alike.
  struct Buffers {
    std::vector<Tensor> view, backing;
  };
  // A deferred backward's working buffers, which live until its backward_weights: gradients
  // per tensor id, and per input position a tensor a node reads more than once. Each is a
  // view of the largest allocation made for it, so micro-batches of unequal size (K not
  // dividing B) or length reuse it.
  struct BackwardBuffers {
    Buffers grads, scratch, repeats;
  };
  struct Slot {
    std::vector<Tensor> values;  // per tensor id: graph inputs, then node outputs
    std::vector<Tensor> backing;  // per node: the storage its output is a view of
    std::vector<Stash> stashes;  // per node
    // A deferred backward's own buffers: the output gradients it leaves for backward_weights
    // live there until then, while other slots back up (a middle party's zero-bubble split).
    BackwardBuffers deferred;
    // Per node: the output gradient a deferred backward left for backward_weights.
    std::vector<Tensor> deferred_grad_out;
    bool weights_pending = false;
    bool evaluated = false;  // the last forward was an evaluation's (its values are gone)
    std::vector<Tensor> pool;  // evaluation: storage free for the next node output
    // Training: per tensor id, the whole storage a transient output (see retained_) was
    // given from transients_, which it goes back to after its last reader.
    std::vector<Tensor> transient;
  };
  int tensor_id(int source) const;
  void fuse_relu_into_pools();  // GraphNode::sources entry -> tensor id
  Slot& slot(int index);
  Tensor& buffer(Buffers& pool, int id, const Shape& shape);

  Graph graph_;
  Backend& backend_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Param*> params_;      // the layers' trainable parameters, in graph order
  std::vector<Param*> all_params_;  // and the frozen ones
  std::vector<Param*> unsplit_params_;
  std::vector<Tensor*> state_buffers_;     // buffers(), kept once
  std::vector<uint64_t*> state_counters_;  // counters(), kept once
  std::vector<std::vector<int>> input_ids_;  // per node: tensor ids of its inputs
  std::vector<bool> needs_grad_;            // per node: on a path to the output
  bool input_gradient_ = true;              // set_input_gradient
  bool recompute_ = false;                  // set_recompute
  // Per node: its backward has work (it is on a path to the output, and it has a trainable
  // parameter or an input whose gradient is wanted). Per tensor id: its gradient is wanted
  // (its node runs backward; of the graph inputs only input 0, with input_gradient_).
  std::vector<bool> runs_backward_, grad_wanted_;
  // needs_grad_, runs_backward_, grad_wanted_ and retained_ from the graph, the layers and
  // input_gradient_.
  void plan_backward();
  // Node n has a trainable parameter; one of its inputs' gradients is wanted (grad_wanted_).
  bool trains(std::size_t n) const;
  bool passes_gradient(std::size_t n) const;
  // Throws when a forward has run: `setting` decides what a forward keeps.
  void refuse_after_forward(const char* setting) const;
  // Per tensor id: the last node whose forward reads it (views extend their source's), or
  // the node count for the output and graph inputs, which an evaluation forward keeps.
  std::vector<int> last_read_;
  // Per tensor id: whether a backward reads its values (Layer::backward_reads of its node and
  // of its readers; views pass it to their source), so a training forward keeps it in the
  // slot until then. The others are transient: their storage comes from transients_ and goes
  // back there after their last reader, so the micro-batches in flight keep only what
  // backward needs (a LoRA encoder's frozen linears' inputs, its adds' operands) and one
  // forward's worth of the rest between them.
  std::vector<bool> retained_;
  std::vector<Tensor> transients_;
  bool training_ = true;
  // The smallest storage in `pool` holding `shape` (or new), taken out; `taken` is set to all
  // of it and the view returned.
  static Tensor from_pool(std::vector<Tensor>& pool, const Shape& shape, Tensor* taken = nullptr);
  std::vector<Slot> slots_;
  // Gradients of the backward in progress (one runs at a time), per tensor id.
  std::vector<Tensor> grads_;
  // Every undeferred backward's gradients, whatever its slot (one runs at a time and its input
  // gradient is read before the next), from one pool with lifetimes: a buffer goes back once
  // no gradient in flight uses it (its node's backward ran, or it was added into another), so
  // a backward holds the few gradients live at once, not one a tensor (spam-bert's front:
  // 44 MiB a set at 8 mails). `users` counts the tensor ids (grad_holder_) and the node
  // inputs being written that use each storage; a view's gradient shares its consumer's.
  struct GradPool {
    std::vector<Tensor> storage;
    std::vector<int> users;
  };
  GradPool grad_pool_;
  std::vector<int> grad_holder_;  // per tensor id: its gradient's storage in grad_pool_, or -1
  std::vector<int> node_holders_;  // per input of the node backing up: its gradient's storage, or -1
  // A pool buffer for `shape` (the smallest free one that holds it, or a new one), its user
  // count 1; returns its index.
  int take_grad(const Shape& shape);
  void release_grad(int index);
  std::vector<int> contributions_;
  std::vector<Tensor> node_inputs_, node_grads_;
  NodeTimes* times_ = nullptr;
};

// Gives `shard`'s parameters the values the whole model (`whole`, seeded with `seed`) starts
// with, so a shard's weights do not depend on where the model is cut. The whole model's
// layers are made one at a time on `whole_backend` (one that runs every op of it, such as the
// reference backend; no kernel of it is made) and dropped once their parameters are copied:
// a party never holds the whole model, only its largest layer beside its own shard.
void init_from_whole_model(const Graph& whole, uint64_t seed, Network& shard, Backend& whole_backend);
void init_from_whole_model(const Graph& whole, uint64_t seed, std::span<Network* const> shards, Backend& whole_backend);

}  // namespace tandem
