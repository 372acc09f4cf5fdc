// The edge's whole training run driven by events instead of blocking waits, for a page's
// event loop (the browser edge) or any single-threaded host: open -> Hello, each message ->
// the next action, progress reported as JSON lines; in a split-federated cloud it sends its
// front shard every round and takes the average. Transport-free, so tested natively.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/model_spec.h"
#include "core/network.h"
#include "core/optimizer.h"
#include "edge/session/edge_session.h"

namespace tandem {

struct EventEdgeConfig {
  std::string cut;  // empty: the spec's default cut
  std::string client_id = "browser";
  std::string token;  // enrolment token (edges without a client certificate)
  uint32_t batch = 32, microbatches = 4;
  int64_t steps = 50;
  OptimizerOptions optimizer;
  uint64_t seed = 1;
  std::string backend = "portable";
  std::vector<wire::DType> dtypes = {wire::DType::F32};
  int64_t eval_samples = 0;  // test samples evaluated at the end (0: all given)
  // In a federation: the front updated once a round on the summed gradients (EdgeSession::
  // FrontUpdates::PerRound), else every step.
  bool front_updates_per_round = false;
};

class EventEdge {
 public:
  using Send = std::function<void(std::span<const uint8_t>)>;
  // One JSON object per event: connected, welcome, step, round (an average taken), evaluated,
  // done, error.
  using Emit = std::function<void(const std::string& json)>;

  EventEdge(const ModelSpec& spec, EventEdgeConfig config, Send send, Emit emit);
  ~EventEdge();
  EventEdge(const EventEdge&) = delete;
  EventEdge& operator=(const EventEdge&) = delete;

  // Images as 8-bit grey pixels [n][h][w] (scaled to [0, 1] here) and labels in [0, classes).
  // Throws Error when they do not fit the model's input.
  void set_data(bool test, const uint8_t* pixels, const int32_t* labels, int64_t n, int64_t h, int64_t w);

  void on_open();
  // false once the run has ended (done or failed): the link should close.
  bool on_message(const Frame& frame);
  void on_closed(const std::string& why);
  bool finished() const { return state_ == State::Done || state_ == State::Failed; }
  bool failed() const { return state_ == State::Failed; }
  int64_t steps_done() const { return steps_done_; }
  const Network& front() const { return *front_; }

 private:
  enum class State { Idle, AwaitWelcome, Training, AwaitAverage, Evaluating, Done, Failed };
  struct Data {
    Tensor images;  // [n, h, w, 1] in [0, 1]
    std::vector<int32_t> labels;
  };
  void start_step();
  void send_front(bool final);
  void start_eval();
  void send_eval_batch();
  void finish(const std::string& json);
  bool fail_with(const std::string& text);
  double since(std::chrono::steady_clock::time_point t) const;

  EventEdgeConfig config_;
  Send send_;
  Emit emit_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Network> front_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<EdgeSession> session_;
  Shape input_;  // one sample's
  int32_t classes_ = 10;
  Data train_, test_;
  State state_ = State::Idle;
  int64_t steps_done_ = 0, epoch_ = 0, cursor_ = 0, samples_done_ = 0;
  uint64_t samples_since_round_ = 0;
  bool final_round_ = false;  // the average awaited is the run's last: evaluation follows
  std::vector<int64_t> order_;
  Tensor batch_images_;
  std::vector<int32_t> batch_labels_;
  int64_t eval_next_ = 0, eval_end_ = 0, eval_correct_ = 0, eval_seen_ = 0;
  double first_loss_ = -1.0, last_loss_ = 0.0, busy_s_ = 0.0;
  std::chrono::steady_clock::time_point started_;
};

}  // namespace tandem
