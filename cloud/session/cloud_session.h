// One edge's split-training session on the cloud: the back shard, its optimizer and the
// session's state machine. Each arriving message is verified and checked against the session
// (hello first, model hash, step window, shapes, labels, finite values); a problem ends the
// session with an Error reply, never an exception. Transport-free, so it is tested in-process.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "core/checkpoint/checkpoint.h"
#include "core/network.h"
#include "core/optimizer.h"
#include "core/wire/messages.h"

#include "cloud/federation/federation.h"
#include "cloud/session/back_shard_trainer.h"
#include "pipeline/stage.h"

namespace tandem {

// Where sessions keep their back shard's checkpoints, per edge (the service: a folder per
// client id in its state folder). Both throw Error saying what went wrong.
// Client ids name the cloud's checkpoint folders: 1 to 64 letters, digits, '.', '_' and '-',
// not starting with '.'.
bool valid_client_id(std::string_view id);

class SessionCheckpoints {
 public:
  virtual ~SessionCheckpoints() = default;
  virtual void save(const std::string& client_id, uint64_t step, std::span<const uint8_t> checkpoint) = 0;
  virtual CheckpointData load(const std::string& client_id, uint64_t step) = 0;
};

// Split-federated: keeps the shared back shard (with its optimizer) and a round's average
// of the front shards; called between steps by the session holding the back shard's turn
// (the service: STATE/federation/, cloud/federation/round_checkpoints.h). Throws Error.
class RoundCheckpoints {
 public:
  virtual ~RoundCheckpoints() = default;
  virtual void save(uint32_t round, const NamedTensors& average, Network& back, Optimizer& optimizer) = 0;
};

struct CloudSessionConfig {
  std::array<uint8_t, 32> model_hash{};  // what Hello must carry
  uint32_t batch_size = 64;
  uint32_t microbatches = 4;
  int32_t classes = 10;
  uint64_t session_id = 1;
  std::size_t max_message_bytes = kDefaultMaxMessageBytes;
  // Wire dtypes this cloud accepts; the session uses the first one in the edge's Hello that
  // is among them, for activations and gradients alike.
  std::vector<wire::DType> dtypes = {wire::DType::F32, wire::DType::F16, wire::DType::BF16, wire::DType::I8};
  // Recorded in checkpoints. A U-shaped cut ("A,B", graph.h) makes the session the middle's:
  // the shard runs from A to B, Forwards must carry no labels, each Forward is answered with
  // a MiddleOutput and each MiddleGradient with the Backward of the middle's input.
  std::string cut;
  SessionCheckpoints* checkpoints = nullptr;  // none: a resuming edge is refused
  // Split-federated: the rounds (the back shard every session shares is a shared
  // BackShardTrainer).
  Federation* federation = nullptr;
  RoundCheckpoints* rounds = nullptr;  // none: a federation's rounds are not checkpointed
  // The identity the connection proved: its client certificate's CN. A Hello naming another
  // client id is refused (Unauthorized). Empty: no certificate, and `authorize` decides.
  std::string peer_identity{};
  // Set when the edge has no client certificate: given the Hello's token and client id,
  // returns "" to let it in, else why it is refused (Unauthorized).
  std::function<std::string(const std::string& token, const std::string& client_id)> authorize = nullptr;
  // With `authorize`: a fresh single-use token for the client it let in, sent in the Welcome
  // (the edge's Hello after a lost link; its own token is spent). None: no token is sent.
  std::function<std::string(const std::string& client_id)> next_token = nullptr;
  // Input gradients first: each Forward's reply leaves before the back shard's weight
  // gradients, which run while the session is idle (false: all of backward before the reply,
  // for comparison).
  bool defer_weights = true;
  // A replica of a shared shard: called once a Hello is accepted, before the session joins;
  // a non-empty answer (this replica's share of the set's edges is taken) refuses it with Busy.
  std::function<std::string()> take_place = nullptr;
};

struct CloudReply {
  CloudReply() = default;
  CloudReply(std::span<const uint8_t> b, bool c, std::vector<uint8_t> t = {}) : bytes(b), close(c), then(std::move(t)) {}
  std::span<const uint8_t> bytes;  // valid until the session handles the next message; empty: none
  bool close = false;              // send, then close the connection
  std::vector<uint8_t> then;       // a second message to send after it (the newest Aggregated)
};

class CloudSession {
 public:
  // `shard`: the back shard this session trains (its input is the cut), its own or shared.
  CloudSession(BackShardTrainer& shard, const CloudSessionConfig& config);
  ~CloudSession();
  CloudSession(const CloudSession&) = delete;
  CloudSession& operator=(const CloudSession&) = delete;
  // From another thread: stop waiting for a turn on a shared back shard (the connection closed).
  void cancel() { cancelled_ = true; }

  // The reply to one message from the edge. What the cloud itself fails at (an Error from a
  // kernel: the GPU's memory budget, a library) refuses with Internal and closes the session.
  CloudReply handle(const Frame& frame);
  // Applies the optimizer step that the last handled message completed, if any. The service
  // calls it after queueing the reply, so the last gradient of a step leaves before the
  // update; handle() calls it first in any case.
  void finish_step();
  // Input gradients first (zero-bubble's split of backward): a Forward's reply carries the
  // gradient of the cut as soon as it is known, and the back shard's own weight gradients
  // wait here. The service runs them while no message waits, one micro-batch at a time;
  // finish_step runs what is left before the update.
  bool has_deferred_work() const { return !deferred_.empty(); }
  void run_deferred();
  uint64_t step() const { return step_; }
  bool closed() const { return state_ == State::Closed; }
  double busy_seconds() const { return busy_s_; }
  uint64_t trained_samples() const { return trained_samples_; }
  double train_loss_sum() const { return train_loss_sum_; }
  const std::string& client_id() const { return client_id_; }
  wire::DType dtype() const { return dtype_; }

 private:
  enum class State { AwaitHello, Training, Closed };
  CloudReply dispatch(const Frame& frame);  // handle's work
  CloudReply refuse(const WireError& error);
  CloudReply on_hello(const wire::Hello& hello);
  CloudReply on_forward(const Frame& frame, const wire::Forward& fwd);
  // U-shaped: the gradient of a micro-batch's middle output, answered with its Backward.
  CloudReply on_middle_gradient(const Frame& frame, const wire::MiddleGradient& grad);
  // A batched shared shard: the micro-batch trains within a batch of several edges'.
  CloudReply on_batched_forward(const flatbuffers::Vector<int32_t>& labels, uint32_t mb, int64_t count);
  // The micro-batch's backward is done: counts it, and marks the step complete after the last.
  void microbatch_done(uint32_t mb);
  CloudReply on_eval(const Frame& frame, const wire::EvalForward& eval);
  CloudReply on_front_weights(const Frame& frame, const wire::FrontWeights& weights);
  WireError evicted() const;
  void release_turn() {
    deferred_.clear();  // an abandoned step's weight gradients are never applied
    shard_.release(config_.session_id);
  }
  // Restores the back shard from this client's checkpoint of `step`; false with `error` set.
  bool resume(uint64_t step, WireError& error);
  // Split-federated: checkpoints the newest round if it has not been (between steps).
  void save_round();
  // Applies the completed step now and writes its checkpoint; false with `error` set.
  bool checkpoint_now(WireError& error);
  // Checks the tensor, labels and mask of a (micro-)batch of `count` samples into inputs_[slot]:
  // the activations (a view for F32, else decoded into decoded_[slot]) and, when the shard
  // reads one, the mask (masks_[slot]). False with `error` set.
  bool checked_batch(const Frame& frame, const wire::TensorMsg* t, const flatbuffers::Vector<int32_t>* labels,
                     const flatbuffers::Vector<uint8_t>* mask, int64_t count, std::size_t slot, WireError& error);

  BackShardTrainer& shard_;
  Network& back_;
  Optimizer& optimizer_;
  Stage stage_;  // this session's view of the shard: forward -> loss -> backward (pipeline/stage.h)
  CloudSessionConfig config_;
  MessageWriter writer_;
  State state_ = State::AwaitHello;
  uint64_t step_ = 0;
  uint32_t step_samples_ = 0, step_microbatches_ = 0;
  float step_lr_scale_ = 1.0f;
  bool step_checkpoint_ = false;
  std::string client_id_;
  static constexpr float kMaxLrScale = 100.0f;  // a schedule's factor; beyond this is a bug or an attack
  std::vector<bool> seen_;  // micro-batches of the current step already forwarded
  uint32_t seen_count_ = 0;
  bool u_shaped_ = false;           // the middle of a U-shaped split (config_.cut "A,B")
  std::vector<bool> middle_backed_;  // U-shaped: micro-batches whose MiddleGradient was handled
  uint32_t middle_backed_count_ = 0;
  std::vector<Tensor> decoded_grads_;  // U-shaped: per micro-batch, its MiddleGradient decoded
  Tensor batched_grad_;  // batched: the cut's gradient of the last micro-batch, this session's rows
  Network::StateSnapshot state_before_;  // the shard's running statistics before a forward
  std::vector<uint32_t> deferred_;  // micro-batches whose weight gradients wait, in arrival order
  wire::DType dtype_ = wire::DType::F32;  // negotiated in Hello
  std::vector<Tensor> decoded_;           // per micro-batch slot, then one for evaluation
  int64_t mask_tokens_ = 0;               // the mask's tokens when the shard reads one, else 0
  std::vector<Tensor> masks_;             // per slot, as decoded_
  std::vector<std::vector<Tensor>> inputs_;  // per slot: the shard's inputs (activations, mask)
  // The back shard's output for an evaluation chunk, forwarded at most a micro-batch of the
  // cloud's limits (ceil(B / K)) at a time: on the kernels training made, and within what the
  // session's admission counted (a chunk at once took spam-bert's cloud from 570 to 894 MiB).
  const Tensor& eval_forward(std::span<const Tensor> inputs);
  Network::Joined eval_joined_;
  double busy_s_ = 0.0;
  bool step_pending_ = false;  // the step is complete; its update waits for finish_step
  std::atomic<bool> cancelled_{false};
  bool joined_ = false;          // in the federation
  uint64_t trained_samples_ = 0;
  double train_loss_sum_ = 0.0;
  uint64_t submitted_step_ = 0;  // the step of the last FrontWeights
};

}  // namespace tandem
