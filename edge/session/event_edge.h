// The edge's side of the protocol, the only one: a whole training run driven by events
// (open -> Hello, each message -> the next action) over an EdgeSession, for the browser's
// event loop and for the native agent, which pumps it with blocking reads. It reads batches
// epoch by epoch, runs K micro-batches a step, joins a federation's rounds, evaluates
// through the cloud, checkpoints, and ends on the cloud's Error with its text.
// Transport-free, so tested natively.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/checkpoint/checkpoint.h"
#include "core/model_spec.h"
#include "core/network.h"
#include "core/optimizer.h"
#include "core/schedule.h"
#include "core/privacy/cut_noise.h"
#include "core/privacy/release_count.h"
#include "core/wire/egress_audit.h"
#include "edge/session/edge_session.h"

namespace tandem {

// Where a run keeps its front shard's checkpoints (the agent: an encrypted folder). The
// position is CheckpointMeta's step, epoch and cursor. `model`: the edge's networks, the
// front and, in a U-shaped run, the tail (saved as one; core/checkpoint). Implementations
// throw Error.
class EdgeCheckpointer {
 public:
  virtual ~EdgeCheckpointer() = default;
  // Restores the newest checkpoint into front and optimizer; its position, none afresh.
  virtual std::optional<CheckpointMeta> resume(const std::array<uint8_t, 32>& model_hash,
                                               std::span<Network* const> model, Optimizer& optimizer) = 0;
  // Whether the step ending at `step_after` (an epoch's last when `epoch_end`) is saved.
  virtual bool due(uint64_t step_after, bool epoch_end) const = 0;
  virtual void save(const CheckpointMeta& position, std::span<Network* const> model, Optimizer& optimizer) = 0;
};

// What the edge does to what it sends, for privacy (README, "What leaves the edge"); the same
// for tandem-edge's --dp-* and --nopeek and the browser's TandemEdge.create({privacy}).
struct EdgePrivacy {
  // Differential privacy on the cut (dp_clip > 0): each sample's activations, in training and
  // evaluation, clipped to L2 norm dp_clip and noised with N(0, (dp_noise * dp_clip)^2)
  // (core/privacy/cut_noise.h). Epsilon at dp_delta for the training set is accounted (RDP of
  // the sampled Gaussian mechanism, sampling rate batch / training samples, one release a
  // step) and reported with each step, epoch and the run's end; the run stops before a step
  // that would pass dp_epsilon_budget (0: none). dp_seed 0: the noise (every kind below too)
  // from the OS's entropy.
  float dp_clip = 0.0f, dp_noise = 0.0f;
  double dp_delta = 1e-5, dp_epsilon_budget = 0.0;
  uint64_t dp_seed = 0;
  // False: evaluation batches leave without noise (the guarantee covers the training set
  // only; the cloud then sees the evaluation set's activations as they are).
  bool dp_noise_evaluation = true;
  // NoPeek (core/privacy/nopeek.h): alpha times the distance correlation between a step's
  // inputs and its cut activations joins the front's loss; the step's and the epoch's
  // correlation are reported (dcor). 0: none.
  float nopeek = 0.0f;
  // U-shaped runs only: the gradient the edge sends up (of the middle's output) is computed
  // from the labels. grad_clip > 0 clips each sample's gradient of its own loss (its row,
  // times the batch) to L2 norm grad_clip and adds
  // N(0, (grad_noise * grad_clip)^2) per element, so the cloud learns less of the labels
  // from it (bench/privacy/label_leakage.sh measures how much). No epsilon is claimed: the
  // tail trains on the exact labels, and its weights shape later gradients.
  float grad_clip = 0.0f, grad_noise = 0.0f;
  // U-shaped runs only: label_noise > 0 adds N(0, label_noise^2) to each sample's gradient
  // of its own loss at the logits (p - onehot(y), L2 norm at most sqrt(2) a head) for the
  // gradient sent up; the tail's own weights train on the exact one. The noise sits where the
  // labels enter, so it hides them at less cost than grad_noise (bench/README.md,
  // label_leakage). No epsilon is claimed (the tail's weights, trained on the exact labels,
  // shape later gradients). With either, the loss the edge reports to the cloud is 0.
  // Softmax cross-entropy models only.
  float label_noise = 0.0f;
  // "" when the values are usable, else what is wrong (in the command line's words).
  std::string problem() const;
};

// The most f32 activation bytes one EvalForward carries beyond a training micro-batch's: an
// evaluation chunk of test samples is cut to fit (EventEdge's constructor says why).
inline constexpr int64_t kEvalMessageBytes = int64_t{2} << 20;

struct EventEdgeConfig {
  std::string cut;  // empty: the spec's default cut
  std::string client_id = "browser";
  std::string token;  // enrolment token (edges without a client certificate)
  uint32_t batch = 32, microbatches = 4;
  // The run's length: whole epochs, at most `steps` steps; 0 means no limit of that kind
  // (both 0: only evaluate the starting weights). A batch never spans two epochs.
  int64_t epochs = 0, steps = 50;
  OptimizerOptions optimizer;
  ScheduleOptions schedule;  // total_steps 0: the run's steps
  uint64_t seed = 1;
  std::string backend = "portable";
  int threads = 1;  // the backend's compute threads
  std::vector<wire::DType> dtypes = {wire::DType::F32};
  bool eval_each_epoch = false;  // else only at the end of the run
  // With the spec's length buckets: each epoch's batches grouped by length (group_by_length
  // in data/epoch_order.h), so more micro-batches run at a short bucket. Off by default: it
  // changes the batches, which costs accuracy when length goes with the class.
  bool group_by_length = false;
  // The front computes attention's probabilities again in backward instead of keeping them
  // from forward (Network::set_recompute): a tokens x tokens table a head and micro-batch in
  // flight (spam-bert: 2 MiB a layer and micro-batch of 8 mails) for one more attention
  // forward in each backward. On: an edge is short of memory rather than of time.
  bool recompute = true;
  // The asynchronous pipeline (EdgeSession::set_async): the next step's forwards start
  // before this one's gradients are in, on weights one update old, with weight stashing. A
  // step that ends an epoch, saves a checkpoint or ends the run waits for the one before it
  // (so evaluation, checkpoints and resume see a step boundary). Plain split training only.
  bool async = false;
  int64_t eval_samples = 0;      // test samples evaluated (0: all given)
  int64_t eval_chunk = 500;      // test samples per EvalForward (fewer: kEvalMessageBytes)
  // In a federation: the front updated once a round on the summed gradients (EdgeSession::
  // FrontUpdates::PerRound), else every step; and FedProx's mu.
  bool front_updates_per_round = false;
  float proximal_mu = 0.0f;
  // The front shard's starting weights; none: the whole model's seeded initialisation, as
  // the cloud draws its back shard.
  std::function<void(const Graph& whole, Network& front)> init_front;
  EdgeCheckpointer* checkpoints = nullptr;  // none: no checkpoints
  // Every message is recorded here before it is sent (the run record at on_open; the
  // summary is the owner's EgressAudit::finish).
  EgressAudit* audit = nullptr;
  EdgePrivacy privacy;  // noise on the cut and NoPeek: none by default
  // Where the noised releases of the training set are counted (durably: tandem-edge keeps
  // them in its checkpoint folder, ports/files/release_ledger.h), replays after a lost link or
  // a restart included: epsilon and the budget follow the releases, not the steps. None: the
  // edge counts them itself, for this process only.
  ReleaseCount* releases = nullptr;
  // Each training Forward as it leaves (noise and wire codec applied): its epoch, the
  // training-set indices of its samples in order, and the message's bytes. For tests and
  // benchmarks that study what a cloud receives (tandem-edge --record-sent).
  std::function<void(int64_t epoch, std::span<const int64_t> samples, std::span<const uint8_t> message)> on_training_forward;
};

// What happened, for a page (json()) or a terminal (the fields).
struct EdgeEvent {
  enum class Kind { Connected, Welcome, EpochStarted, Step, Round, EpochTrained, Evaluated, Done, Error, Retry, Reconnect };
  Kind kind = Kind::Connected;
  int64_t epoch = 0;       // EpochStarted, Step, EpochTrained; Evaluated: the epoch just trained (0: none)
  uint64_t step = 0;       // the session's step (Welcome: where it starts)
  int64_t steps_done = 0, steps = 0;  // steps this run has taken, and its limit (0: none)
  int64_t samples = 0;     // Step: its batch; EpochStarted: the set; EpochTrained: trained; Evaluated: evaluated
  int64_t cursor = 0;      // EpochStarted, Step: samples of the epoch consumed
  double loss = 0.0;       // Step: its mean; EpochTrained: the epoch's mean; Done: the last step's
  double first_loss = 0.0, accuracy = -1.0, samples_per_s = 0.0, seconds = 0.0, edge_busy_s = 0.0,
         cloud_busy_s = 0.0;  // accuracy < 0: not evaluated
  uint32_t round = 0, aggregate_every = 0;
  std::string dtype;  // Welcome: the wire dtype the cloud chose
  std::string text;   // Error; Done: why the run stopped early (a privacy budget), if it did; Retry: the refusal
  int attempt = 0, attempts = 0;  // Retry: which retry comes next, of how many (`seconds`: the wait)
  // Reconnect (a lost link; the page's loop says it): attempt, attempts and seconds as Retry's,
  // `text` the link's words, `step` the checkpoint the run goes on from and `steps_done` the
  // steps it trains again.
  double epsilon = -1.0;  // Step, EpochTrained, Done: DP epsilon spent on the cut (< 0: no DP)
  // EpochTrained: the median over its steps of the time from a step's first Forward handed
  // to the transport to its first gradient back (the pipeline's fill; < 0: no step).
  double first_grad_ms = -1.0;
  // Step: its inputs' distance correlation with their cut activations; EpochTrained: the
  // epoch's mean (NoPeek on; < 0: off).
  double dcor = -1.0;
  // EpochTrained: the tokens a training sample ran at on average (its micro-batch's length
  // bucket; < 0: the model has no length buckets).
  double tokens_per_sample = -1.0;
  std::string json() const;
};

// Seconds to wait before retry `attempt` (from 1) after a Busy refusal: doubling from 1 s up
// to 30 s, times a random factor in [0.5, 1.5) so that edges refused together do not all come
// back together (tandem-edge --connect-retries, the browser edge's connectRetries).
double busy_backoff_s(int attempt);

class EventEdge {
 public:
  using Send = std::function<void(std::span<const uint8_t>)>;
  using Emit = std::function<void(const EdgeEvent&)>;

  EventEdge(const ModelSpec& spec, EventEdgeConfig config, Send send, Emit emit);
  ~EventEdge();
  EventEdge(const EventEdge&) = delete;
  EventEdge& operator=(const EventEdge&) = delete;

  // Images as 8-bit grey pixels [n][h][w] (scaled to [0, 1] here) and labels in [0, classes).
  // Throws Error when they do not fit the model's input.
  void set_data(bool test, const uint8_t* pixels, const int32_t* labels, int64_t n, int64_t h, int64_t w);
  // Images [n, ...] in [0, 1] of the model's input size, and their labels.
  void set_data(bool test, Tensor images, std::vector<int32_t> labels);
  // Every input of the model (in its spec's order: ids, mask, boxes, pixels...), each [n, ...]
  // with its spec's per-sample shape, and their labels; ids and coordinates integers, masks
  // 0 or 1 (checked here: an Error names the input and the element).
  void set_data(bool test, std::vector<Tensor> inputs, std::vector<int32_t> labels);

  // Hello (again after a Busy refusal, on a new link).
  void on_open();
  // false once the run has ended (done or failed) or the cloud was busy: the link should close.
  bool on_message(const Frame& frame);
  void on_closed(const std::string& why);
  // Its owner ends the run (the page's stop): fails it with `why`, whatever the link said.
  void stop(const std::string& why);
  bool finished() const { return state_ == State::Done || state_ == State::Failed; }
  // The cloud's reason when it answered the Hello with a Busy Error (its bounds on
  // connections: "try again later"): the run has not started and on_open may be called again
  // on a new link; on_closed then fails the run with this reason. Empty otherwise.
  const std::string& busy() const { return busy_; }
  bool failed() const { return state_ == State::Failed; }
  // Whether on_open has sent this run's Hello (false again after a Busy refusal).
  bool said_hello() const { return state_ != State::Idle; }
  // The message the run waits for (a blocking pump names it when none comes).
  const char* awaiting() const;
  int64_t steps_done() const { return steps_done_; }
  // Where training stands: step, epoch (from 1) and samples of it consumed.
  const CheckpointMeta& position() const { return position_; }
  bool resumed() const { return resumed_; }
  const Network& front() const { return *front_; }
  const Network* tail() const { return tail_.get(); }  // U-shaped runs only
  const Optimizer& optimizer() const { return *optimizer_; }
  const EdgeSession& session() const { return *session_; }
  const std::string& cut() const { return config_.cut; }
  const std::string& model_name() const { return model_name_; }

 private:
  enum class State { Idle, AwaitWelcome, Training, AwaitAverage, Evaluating, Done, Failed };
  enum class AfterAverage { Continue, EndEpoch, Finish };
  struct Data {
    std::vector<Tensor> inputs;  // each [n, ...], the model's inputs in order
    std::vector<int32_t> labels;
    bool given() const { return !inputs.empty(); }
    int64_t count() const { return inputs.empty() ? 0 : inputs[0].shape()[0]; }
  };
  bool run_over() const;
  double epsilon_after(uint64_t releases) const;  // -1 without DP
  uint64_t releases() const { return config_.releases ? config_.releases->releases() : releases_; }
  uint64_t releases_ = 0;  // without config_.releases
  bool budget_spent() const;  // the next step would pass the privacy budget
  void start_step();
  void after_step(bool epoch_end);
  void end_epoch();
  void finish_run();
  void proceed();  // the next step, or the run's end
  void send_front(bool final, AfterAverage then);
  void start_eval(bool final);
  void send_eval_batch();
  void say_goodbye();  // Bye, and the run is done
  EdgeEvent event(EdgeEvent::Kind kind) const;
  void emit(const EdgeEvent& e) { emit_(e); }
  bool fail_with(const std::string& text);
  double since(std::chrono::steady_clock::time_point t) const;

  EventEdgeConfig config_;
  Send send_;
  Emit emit_;
  std::string model_name_;
  std::string busy_;  // busy()
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Network> front_;
  std::unique_ptr<Network> tail_;      // U-shaped runs: from the second cut to the loss
  std::vector<Network*> model_;        // front (and tail): what checkpoints hold
  std::unique_ptr<CutNoise> grad_noise_;  // U-shaped: on the gradient sent up (EdgePrivacy::grad_clip)
  std::unique_ptr<CutNoise> label_noise_;  // U-shaped: on the loss gradient (EdgePrivacy::label_noise)
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<EdgeSession> session_;
  std::unique_ptr<CutNoise> noise_;
  std::vector<GraphInput> inputs_;  // the model's, one sample's shapes
  int32_t classes_ = 10;
  Data train_, test_;
  State state_ = State::Idle;
  AfterAverage after_average_ = AfterAverage::Continue;
  CheckpointMeta position_;
  ScheduleOptions schedule_;  // with the run's length
  bool resumed_ = false, epoch_open_ = false, final_eval_ = false, audit_begun_ = false;
  int64_t steps_done_ = 0, epoch_first_ = 0, just_ended_epoch_ = 0;
  uint64_t samples_since_round_ = 0;
  double epoch_loss_sum_ = 0.0;
  std::chrono::steady_clock::time_point epoch_started_;
  // Per step in flight (by its number's parity: the asynchronous schedule has two): its batch,
  // whether it saves a checkpoint, when its first Forward went out, and whether its first
  // gradient is still to come.
  struct Batch {
    std::vector<Tensor> inputs;
    std::vector<int32_t> labels;
    bool saves = false;
    std::chrono::steady_clock::time_point sent;
    bool awaiting_first_grad = false;
  };
  Batch batches_[2];
  Batch& batch_of(uint64_t step) { return batches_[step % 2]; }
  // Asynchronous: starts the step after the one in flight, unless that one must end first.
  void start_ahead();
  std::vector<double> first_grad_s_;  // this epoch's steps
  double epoch_dcor_sum_ = 0.0;       // NoPeek: each step's correlation times its samples
  std::vector<int64_t> order_;
  // With length buckets: the mask input (or -1), and with group_by_length each training
  // sample's length (its last kept token), by which each epoch's batches are grouped.
  int mask_input_ = -1;
  std::vector<int32_t> train_lengths_;
  std::vector<int32_t> test_lengths_;   // with length buckets: each test sample's
  std::vector<int64_t> eval_order_;     // with length buckets: the evaluated samples, longest first
  std::vector<Tensor> eval_gathered_;   // per input: a chunk gathered in eval_order_
  std::vector<int32_t> eval_labels_;    // and its labels
  static std::vector<int32_t> sequence_lengths(const Tensor& mask);
  int64_t epoch_tokens_first_ = 0;  // session_->tokens_run() when the epoch started
  std::vector<Tensor> eval_inputs_;
  int64_t eval_chunk_ = 1;  // config_.eval_chunk within kEvalMessageBytes
  int64_t eval_next_ = 0, eval_end_ = 0, eval_correct_ = 0, eval_seen_ = 0, samples_done_ = 0;
  double first_loss_ = -1.0, last_loss_ = 0.0, busy_s_ = 0.0, cloud_busy_s_ = 0.0, accuracy_ = -1.0;
  std::chrono::steady_clock::time_point started_;
};

}  // namespace tandem
