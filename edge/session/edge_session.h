// The edge's side of a split-training session: the front shard and its optimizer. A step's
// K micro-batches are forwarded as fast as they are computed (each a Forward message to send
// at once); each Backward, whenever it arrives, is checked and backed up through the front,
// and the optimizer steps after the K-th. Asynchronous (set_async): the next step may be
// forwarded before this one's gradients are in, its backward then runs on the weights its
// forward used (stashed). Transport-free, so it is tested in-process.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/length_buckets.h"
#include "core/network.h"
#include "core/optimizer.h"
#include "core/privacy/cut_noise.h"
#include "core/wire/messages.h"
#include "pipeline/stage.h"

namespace tandem {

class EdgeSession {
 public:
  // `dtypes`: the wire dtypes to offer, most wanted first; the cloud picks one in Welcome.
  EdgeSession(Network& front, Optimizer& optimizer, uint32_t microbatches, const std::array<uint8_t, 32>& model_hash,
              std::string client_id, std::vector<wire::DType> dtypes = {wire::DType::F32});

  // Resuming from this edge's checkpoint of `step` (call before hello()): Hello asks the cloud
  // for its checkpoint of the same step, and Welcome must start there.
  void resume_from(uint64_t step) { resume_step_ = step; }
  // An enrolment token for Hello (an edge without a client certificate).
  void set_token(std::string token) { token_ = std::move(token); }
  std::span<const uint8_t> hello();
  // Welcome (or the cloud's Error, reported in `error`): the cloud's limits (batch size,
  // micro-batches, at least this edge's K) and the step to start from.
  bool on_welcome(const Frame& frame, WireError& error);

  // The asynchronous schedule (PipeDream's weight stashing, staleness bounded at one step):
  // begin_step may start step t+1 while step t's Backwards are still to come, so the edge
  // computes instead of waiting for the first of them. Step t+1's forwards then run on the
  // weights before step t's update; when that update is applied the weights they used are
  // stashed, and their backward runs on the stash: each micro-batch's gradient is exact for
  // the weights its forward saw, and it is applied one update later than in the synchronous
  // schedule. For plain split training only: not with a tail (U-shaped), noise on the cut,
  // NoPeek, or a federation (begin_step refuses). Set before the first step.
  void set_async(bool on);
  bool async() const { return async_; }
  // Steps begun and not yet done: 0, 1, or (asynchronous) 2.
  int steps_in_flight() const { return (cur_.active ? 1 : 0) + (ahead_.active ? 1 : 0); }

  // Starts a step on the front's inputs (each [B, ...], in its graph's order: images, or ids,
  // mask, boxes...) and labels [B] (kept by reference until the step ends); returns its
  // number of micro-batches, min(K, B).
  // lr_scale: the schedule's factor for this step, applied here and sent to the cloud.
  // checkpoint: both sides checkpoint after this step (the cloud's is durable before the
  // step's last Backward leaves, so the cloud never has less than the edge).
  int begin_step(std::span<const Tensor> inputs, const int32_t* labels, float lr_scale = 1.0f,
                 bool checkpoint = false);
  int begin_step(const Tensor& images, const int32_t* labels, float lr_scale = 1.0f, bool checkpoint = false) {
    return begin_step(std::span<const Tensor>(&images, 1), labels, lr_scale, checkpoint);
  }
  // The front's input (index into its graph's inputs) that the cloud's shard reads too: a
  // key padding mask (Graph::split), sent with every Forward and EvalForward. -1: none.
  void set_mask_input(int index);
  // Runs micro-batch mb of the step begun last through the front shard; returns the
  // Forward message to send.
  std::span<const uint8_t> forward(int mb);
  // A Backward for the oldest step in flight; `step_done` turns true after its last one
  // (optimizer applied; step_loss_sum() is then that step's).
  bool on_backward(const Frame& frame, WireError& error, bool& step_done);
  // U-shaped (set_tail): the middle's output for a micro-batch of this step. The tail and the
  // loss run on it, and `reply` gets the MiddleGradient to send (valid until the next message
  // is written).
  bool on_middle_output(const Frame& frame, WireError& error, std::span<const uint8_t>& reply);
  // Whatever the cloud sends during a step: a Backward, or (U-shaped) a MiddleOutput, whose
  // MiddleGradient is put in `reply` (else `reply` is empty).
  bool on_step_message(const Frame& frame, WireError& error, bool& step_done, std::span<const uint8_t>& reply);

  // A U-shaped split (graph.h, u_shaped_cut): the edge also runs the tail, from the cloud's
  // middle output to the loss, so the labels never leave. Its parameters train with the
  // front's (the optimizer must hold both), and join the front's in a federation's rounds.
  // Set before the first step; null: the cloud runs the rest and the loss.
  void set_tail(Network* tail);
  // U-shaped: each sample's gradient of its own loss (its row of the gradient sent up, times
  // the step's samples) clipped and noised (CutNoise's forward) before it leaves; the tail's
  // own gradients stay exact. Owned by the caller; null: none.
  void set_gradient_noise(CutNoise* noise) { grad_noise_ = noise; }
  // U-shaped: for the gradient sent up, each sample's loss gradient at the logits (of its
  // own loss) goes through `noise` (CutNoise's forward: its clip at the gradient's bound,
  // then Gaussian noise) before the tail's backward; the tail's own weights take the exact
  // gradient. With this or set_gradient_noise the loss reported to the cloud is 0. Owned by
  // the caller; null: none.
  void set_label_noise(CutNoise* noise) { label_noise_ = noise; }
  bool u_shaped() const { return tail_ != nullptr; }

  uint64_t step() const { return step_; }  // steps done (updates applied)

  // Split-federated (the cloud's Welcome says so): every aggregate_every() steps the front
  // shard goes up (front_weights) and the round's average comes down (on_aggregated).
  uint32_t aggregate_every() const { return aggregate_every_; }
  // The Welcome's fresh enrolment token (an edge that came with one, whose token is spent):
  // what a Hello after a lost link carries. Empty otherwise.
  const std::string& next_token() const { return next_token_; }
  bool aggregate_due() const { return aggregate_every_ > 0 && step_ > 0 && step_ % aggregate_every_ == 0; }
  // Welcome announced the newest average: on_aggregated must take it before the first step.
  bool awaiting_aggregate() const { return awaiting_aggregate_; }
  // final: after the edge's last step, whatever its number (the run ends on the average).
  std::span<const uint8_t> front_weights(uint64_t samples, bool final = false);
  // After the run's last step: whether its front must still join a round (front_weights
  // with final), so the run ends on the average; false outside a federation.
  bool final_round_due() const { return aggregate_every_ > 0 && step_ > 0 && exchanged_step_ != step_; }
  bool on_aggregated(const Frame& frame, WireError& error);
  uint32_t round() const { return round_; }
  // FedProx: adds mu * (w - w_round) to each gradient, w_round the last average taken, so
  // an edge's non-IID steps drift less from the federation's weights (0: plain FedAvg).
  void set_proximal(float mu) { proximal_mu_ = mu; }
  // Noise on the cut (differential privacy for what leaves): every Forward (and EvalForward,
  // unless `evaluation` is false) carries each sample's activations clipped and noised; each
  // Backward's gradient goes back through the clip before the front's backward. Owned by the
  // caller; null: none.
  void set_cut_noise(CutNoise* noise, bool evaluation = true) {
    noise_ = noise;
    noise_evaluation_ = evaluation;
  }
  // NoPeek: adds alpha times the distance correlation between the step's inputs and its cut
  // activations (before any noise; all K micro-batches together, computed at the step's
  // first Backward) to the edge's loss, so the front learns activations that say less about
  // the input. The penalty is the edge's alone: the cloud never sees it. 0: none.
  void set_nopeek(float alpha) { nopeek_ = alpha; }
  double step_dcor() const { return step_dcor_; }  // the step's distance correlation (NoPeek on)
  // Per round (split-federated only): the front keeps the round's average through the
  // round, sums its steps' gradients and takes one optimizer step on the sum just before it
  // sends its weights (the sum of S steps' gradients: S steps taken without moving). Every
  // edge's front then stays the same during a round, so the shared back shard cannot learn
  // which edge's drifted features it sees (with non-IID edges that drift is what costs
  // accuracy; bench/README.md, federation.sh). Per step: local SGD (FedAvg), the default.
  enum class FrontUpdates { PerStep, PerRound };
  void set_front_updates(FrontUpdates u) { front_updates_ = u; }
  // Steps whose front gradients are summed and not yet applied (per round).
  uint32_t pending_front_steps() const { return pending_front_steps_; }
  uint32_t rounds_joined() const { return rounds_joined_; }
  wire::DType dtype() const { return dtype_; }  // the wire dtype the cloud chose
  double step_loss_sum() const { return done_loss_sum_; }  // of the step done last
  // Tokens the front has run in training micro-batches so far (samples times their length
  // bucket); 0 when the model has no length buckets.
  int64_t tokens_run() const { return tokens_run_; }
  // Runs an evaluation chunk through the front (in pieces of set_eval_microbatch's samples)
  // and returns its EvalForward.
  std::span<const uint8_t> eval_forward(uint64_t batch_id, std::span<const Tensor> inputs, const int32_t* labels,
                                        int64_t count);
  // The most samples one evaluation forward runs (0: a whole chunk at once). Set to a
  // training micro-batch's, evaluation runs on the kernels and memory training made: a
  // chunk's forward at its own size would build kernels with scratch for it (spam-bert's
  // front at 52 mails took 180 MiB more than its training did).
  void set_eval_microbatch(int64_t samples) { eval_rows_ = samples; }
  std::span<const uint8_t> eval_forward(uint64_t batch_id, const Tensor& images, const int32_t* labels, int64_t count) {
    return eval_forward(batch_id, std::span<const Tensor>(&images, 1), labels, count);
  }
  struct EvalResult {
    int64_t correct = 0, count = 0;
    double cloud_busy_s = 0;  // the cloud's compute time for this edge so far
  };
  // The cloud's answer to an eval_forward; false with `error` set when the frame is bad or
  // the cloud refused (its Error's code and text, "(no text)" when it sent none).
  bool on_eval_result(const Frame& frame, WireError& error, EvalResult& result);
  std::span<const uint8_t> bye(const std::string& reason) { return writer_.bye(reason); }

 private:
  Network& front_;
  Optimizer& optimizer_;
  uint32_t microbatches_;
  std::array<uint8_t, 32> model_hash_;
  std::string client_id_, token_;
  std::vector<wire::DType> offered_;
  wire::DType dtype_ = wire::DType::F32;
  MessageWriter writer_;
  uint64_t step_ = 0, resume_step_ = 0;
  bool welcomed_ = false;
  uint32_t aggregate_every_ = 0, round_ = 0, rounds_joined_ = 0;
  std::string next_token_;
  bool awaiting_aggregate_ = false;
  uint64_t exchanged_step_ = 0;  // the step whose round's average arrived
  float proximal_mu_ = 0.0f;
  std::vector<Tensor> anchor_;   // the last average taken (FedProx)
  FrontUpdates front_updates_ = FrontUpdates::PerStep;
  uint32_t pending_front_steps_ = 0;
  bool per_round() const { return front_updates_ == FrontUpdates::PerRound && aggregate_every_ > 0; }
  NamedTensors front_params() const;  // what a round exchanges: the front's, then the tail's
  std::vector<Param*> edge_params() const;
  Network* tail_ = nullptr;
  CutNoise* grad_noise_ = nullptr;
  CutNoise* label_noise_ = nullptr;
  Tensor noised_dlogits_, noised_grad_in_;
  std::vector<Tensor> tail_grads_;  // label noise: the tail's gradients before the noisy pass
  Tensor per_sample_, noised_grad_;  // CutNoise::forward_per_sample's scratch and result
  std::vector<float> grad_scales_;
  std::optional<Stage> tail_stage_;  // U-shaped: the tail's forward -> loss -> backward
  const int32_t* eval_labels_ = nullptr;  // U-shaped: the evaluation batch in flight
  int64_t eval_count_ = 0;
  uint64_t eval_batch_ = 0;
  Tensor eval_decoded_;
  // What leaves for these activations: themselves, or clipped and noised (slot: the
  // micro-batch, or microbatches_ for evaluation).
  const Tensor& leaving(const Tensor& activations, std::size_t slot);
  uint32_t batch_limit_ = 0;  // the cloud's batch size (Welcome)
  // A step in flight: what it trains on and how far it is.
  struct StepState {
    bool active = false;
    uint64_t number = 0;
    std::vector<Tensor> inputs;       // each [B, ...]
    const int32_t* labels = nullptr;  // kept by reference until the step ends
    float lr_scale = 1.0f;
    bool checkpoint = false;
    int microbatches = 0, backed = 0;
    // Per micro-batch: 0 not sent, 1 forwarded, 3 (U-shaped) its middle gradient sent, 2 backed up.
    std::vector<uint8_t> state;
    double loss_sum = 0.0;
    uint64_t weights = 0;  // the updates applied when its forwards ran
    // With NoPeek the step's micro-batches share one length (its penalty reads them as one
    // matrix): the bucket of the whole batch, else -1 (each micro-batch its own).
    int64_t length = -1;
    int64_t batch() const { return inputs[0].shape()[0]; }
  };
  StepState cur_;    // the oldest step in flight (or the last one done)
  StepState ahead_;  // asynchronous: the step begun while cur_'s gradients are still coming
  StepState& newest() { return ahead_.active ? ahead_ : cur_; }
  bool async_ = false;
  // The micro-batch's slot in the front (activations, cuts, decoded gradients): asynchronous,
  // the two steps in flight use K slots each; evaluation the one after them.
  std::size_t slot_of(const StepState& s, uint32_t mb) const {
    return (async_ ? static_cast<std::size_t>(s.number % 2) * microbatches_ : 0) + mb;
  }
  std::size_t eval_slot() const { return microbatches_ * (async_ ? 2u : 1u); }
  // The slot the last evaluation ran in: slot 0 when no step was in flight (a training slot's
  // storage and stashes then serve it, so evaluation holds no memory of its own), else
  // eval_slot(), so it never disturbs a step in flight.
  std::size_t eval_in_ = 0;
  std::vector<Tensor> stash_;  // the weights a step's forwards ran on, once updated since
  bool stash_in_ = false;      // the params hold the stash (their own values are in stash_)
  void swap_stash();
  double done_loss_sum_ = 0.0;
  std::vector<Tensor> mb_inputs_;  // a micro-batch's slices of the step's inputs
  // Per slot (the micro-batches, then evaluation): its inputs as the front runs them, cut to
  // their length bucket (core/length_buckets.h); kept until the slot's next forward.
  std::vector<LengthCut> cut_;
  int64_t tokens_run_ = 0;
  LengthCut& cut_slot(std::size_t slot);
  int mask_input_ = -1;            // set_mask_input
  int tail_mask_ = -1;             // U-shaped: the front input the tail reads as its mask, or -1
  Tensor eval_mask_;               // U-shaped: the evaluation batch's mask, for the tail
  int64_t eval_rows_ = 0;          // set_eval_microbatch
  Network::Joined eval_joined_;  // an evaluation chunk's activations, forwarded eval_rows_ samples at a time
  // The tail's input 0 for slot's micro-batch of `count` samples (its length: the slot's).
  Shape tail_input_shape(std::size_t slot, int64_t count) const;
  // The micro-batch [begin, begin + count) of every input of step s, cut to its bucket, in
  // cut_[slot].
  std::span<const Tensor> slice_inputs(const StepState& s, int64_t begin, int64_t count, std::size_t slot);
  // The tail's inputs: the middle's output, and its mask when it reads one.
  std::span<const Tensor> tail_inputs(const Tensor& middle, const Tensor* mask);
  std::vector<Tensor> tail_in_;
  std::vector<Tensor> decoded_;  // per slot: its gradient decoded (non-F32 sessions)
  CutNoise* noise_ = nullptr;
  bool noise_evaluation_ = true;
  std::vector<Tensor> noised_, cut_grads_;  // per micro-batch (and one for evaluation)
  std::vector<std::vector<float>> clip_scales_;
  float nopeek_ = 0.0f;
  void nopeek_step();  // the step's correlation and its gradient for every sample
  bool nopeek_ready_ = false;
  double step_dcor_ = 0.0;
  std::vector<float> nopeek_z_, nopeek_grad_;  // the step's activations and the penalty's gradient
  std::vector<double> dcor_work_;              // distance_correlation's scratch
};

}  // namespace tandem
