// Many edges, one batch: on a federation's shared back shard, the edge steps one update sums
// (a window of `window` steps) run together, and the micro-batches their sessions hand in
// together are one forward and backward on the shard, the cut's gradient split back by rows.
// The update equals those steps run one after another in turns (BackShardTurns) summing
// `window` steps: every step of a window sees the same weights, and weight gradients are sums
// over rows either way. Batch norm's batch statistics and dropout's masks then cover the
// combined batch, as they would a bigger batch. The weight gradients always wait until the
// cut's gradients are handed back (zero-bubble's split of backward), running while the next
// batch gathers. Thread-safe: each session's thread calls it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include "core/network.h"
#include "core/optimizer.h"
#include "core/wire/frame.h"
#include "pipeline/stage.h"

namespace tandem {

// One session's micro-batch, handed to BackShardBatches::run.
struct BatchedMicrobatch {
  enum class Outcome { Trained, NonFiniteLoss, NonFiniteGradient, Evicted, Closed, Failed };
  std::span<const Tensor> inputs;   // the cut's activations [n, ...], and the mask when the shard reads one
  const int32_t* labels = nullptr;  // n of them
  float loss_scale = 1.0f;          // the step's 1 / samples
  Tensor* grad = nullptr;           // out: the cut's gradient for these n rows, shaped like inputs[0]
  double loss = 0.0;                // out: the loss of these rows (times loss_scale)
  uint64_t weight_version = 0;      // out: the optimizer steps behind the weights it ran with
  double compute_s = 0.0;           // out: its share (by rows) of its batch's compute time
  Outcome outcome = Outcome::Trained;
  std::string failure;  // Outcome::Failed: what the cloud failed at
};

class BackShardBatches {
 public:
  using Clock = std::chrono::steady_clock;
  // `gather_s`: how long a micro-batch waits for those of the window's other steps before its
  // batch runs without them; `timeout_s`: a step quiet that long while others wait loses its slot.
  // `quorum`: the first window opens once that many sessions have begun a step (or
  // `timeout_s` after the first did), so it holds a step of each rather than several of the
  // first to arrive.
  BackShardBatches(Network& net, Optimizer& optimizer, uint32_t window, double gather_s, double timeout_s,
                   uint32_t quorum = 1);

  // `owner`'s step of `microbatches` micro-batches takes a slot of the open window, waiting
  // while the window is full (its update not yet applied). Zeroes the gradients when it opens
  // the window. false: `cancelled` turned true while waiting.
  bool begin_step(uint64_t owner, uint32_t microbatches, const std::atomic<bool>& cancelled);
  // Trains one micro-batch of `owner`'s open step within a batch; blocks until that batch
  // ran. false with mb.outcome set when these rows were not trained (the others in the batch
  // were; rows with a non-finite loss or gradient reach no weight).
  bool run(uint64_t owner, BatchedMicrobatch& mb, const std::atomic<bool>& cancelled);
  // `owner`'s step is complete. The window's last step applies the update (the mean of the
  // window's steps, times this step's lr_scale), runs `between_updates`, and opens a new
  // window. false when `owner` lost its slot (evicted). (Replica windows: drive() applies the
  // update, at the mean of the set's steps' lr scales, and keeps rounds itself.)
  bool finish_step(uint64_t owner, float lr_scale, const std::function<void()>& between_updates);
  bool step_open(uint64_t owner) const;
  // An evaluation batch: the shard to itself until end_eval (or release).
  bool begin_eval(uint64_t owner, const std::atomic<bool>& cancelled);
  void end_eval(uint64_t owner);
  // The session closed: an open step gives its slot up (its micro-batches that already ran
  // stay in the window's sum, as a step abandoned in turns leaves its own).
  void release(uint64_t owner);
  bool was_evicted(uint64_t owner);
  uint64_t updates() const;
  // The shard's stage: replicas of the shard keep in step through its UpdateSync
  // (pipeline/replicas.h), which sums their windows' gradients and counts their steps.
  Stage& stage() { return stage_; }

  // Replicas of the shard (the stage's UpdateSync is a ReplicaSync): a window holds one step
  // of each session admitted, however many there are (none, too), so every replica makes one
  // update a step of its edges and the set's updates stay in step whatever the edges'
  // placement. A session joining is admitted at a round's boundary (round_boundary), so its
  // steps and its rounds are the set's. The updates run on drive()'s thread, which also takes
  // part in the set's collectives while this replica has no session (`idle`). `hold_s`: at
  // the set's start, how long the first update waits for this replica's first sessions.
  void set_replica_windows(double hold_s);
  bool replica_windows() const { return replica_; }
  // Replica windows: `owner` (a session saying Hello) waits until it is admitted, at the set's
  // next round boundary (at once while the set is at one). false: `cancelled` turned true.
  bool admit(uint64_t owner, const std::atomic<bool>& cancelled);
  // Replica windows: `owner` has stepped its last (its run's final front is in): the windows
  // go on without it.
  void retire(uint64_t owner);
  enum class IdleTurn { Nothing, Update, Round };
  struct Drive {
    std::function<IdleTurn()> idle;     // one collective with nothing to hand in
    std::function<void()> round;        // make the round this replica's edges are ready for, with the set
    std::function<void()> after_round;  // after the update that follows a round: keep it, the shard held
  };
  // Runs until `stop`: admits sessions at round boundaries, applies each complete window's
  // update, and, idle, takes part in the others' collectives. Throws what an update throws.
  void drive(const std::atomic<bool>& stop, const Drive& calls);
  // A round closed (on this replica or, idle, on the others): sessions waiting are admitted.
  void round_boundary();
  // This replica's edges have all sent their fronts for a round: drive() makes it, after the
  // update of the window their last steps completed (as every replica orders them).
  void round_ready();
  // The set's summed gradients of `steps` steps at `lr_sum` (idle's update): applied as a window's.
  void apply_idle_update(uint64_t steps, double lr_sum);

  struct Stats {
    uint64_t batches = 0, microbatches = 0;  // shard batches run, and the micro-batches in them
    uint32_t largest = 0;                    // the most micro-batches one batch held
  };
  Stats stats() const;

 private:
  struct Member {  // a session that has stepped on the shard, until it is released
    bool open = false;       // its step holds a slot of the window
    uint32_t remaining = 0;  // micro-batches its open step has yet to hand in
    static constexpr uint64_t kNever = UINT64_MAX;
    uint64_t window = kNever;      // the last window it took a slot of
    bool in_batch = false;         // its micro-batch is in the batch computing now
    Clock::time_point last;  // its last sign of life
    bool admitted = false;   // replica windows: its steps are in the windows
    bool retired = false;    // ... no more: it stepped its last
  };
  struct Pending {
    uint64_t owner;
    BatchedMicrobatch* mb;
    Clock::time_point at;
    bool taken = false, done = false;
  };
  // With mutex_ held: micro-batches the batch should wait for (open steps with micro-batches
  // to come, and idle sessions that may still take the window's free slots).
  std::size_t expected() const;
  bool ready(Clock::time_point now) const;
  // With `lock` held on entry and exit: runs a batch of pending micro-batches of one shape.
  void lead(std::unique_lock<std::mutex>& lock);
  // The shard's work, without the lock; `seconds`: its compute time.
  void compute(const std::vector<Pending*>& batch, double& seconds);
  // The members' inputs joined row after row (in joined_).
  std::span<const Tensor> joined(const std::vector<Pending*>& members);
  // Forward, each member's loss and (with `backward`) the cut's gradient into `grad`: true
  // when every row is finite. Else the failing members' outcomes are set and nothing of the
  // pass is left in the gradients.
  bool passes(const std::vector<Pending*>& members, bool backward, Tensor* grad);
  void restore_unsplit();  // the unsplit layers' gradients as before the last backward
  // The layers' non-trained state (batch norm's running statistics) as the batch found it.
  void save_buffers();
  void restore_buffers();
  void evict_quiet(Clock::time_point now);
  void apply_deferred_weights();
  // Replica windows, with mutex_ held: every admitted session finished its step of this window.
  bool window_complete() const;
  // ... its update (the lock released while the replicas sum), and the next window.
  void replica_update(std::unique_lock<std::mutex>& lock);
  // The optimizer's step on gradients summed over `steps` steps (lr scale: their mean, over
  // the steps); false when there were none.
  bool apply_summed(uint64_t steps, double lr_sum);
  void next_window(bool applied);  // with mutex_ held

  Network& net_;
  Optimizer& optimizer_;
  Stage stage_;  // the shard's forward, loss and backward (pipeline/stage.h)
  const uint32_t window_;
  const uint32_t quorum_;
  std::optional<Clock::time_point> first_arrival_;  // the first session's first begin_step
  const Clock::duration gather_, timeout_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<uint64_t, Member> members_;
  std::set<uint64_t> evicted_;
  std::deque<Pending*> pending_;
  uint32_t taken_ = 0, finished_ = 0;  // the window's slots taken, and steps finished
  uint64_t window_id_ = 0;             // windows opened before this one
  bool busy_ = false;                  // a batch, an update or an evaluation uses the network
  uint64_t eval_owner_ = 0;
  bool weights_pending_ = false;  // the last batch's weight gradients (input gradients first)
  bool weights_failed_ = false;   // ... failed while a batch gathered: its leader reports it
  uint64_t updates_ = 0;
  // Replica windows (set_replica_windows).
  bool replica_ = false;
  Clock::duration hold_{};
  bool at_boundary_ = true;   // no update since the last round closed: sessions may be admitted
  bool round_closed_ = false;  // ... and that round is not yet kept
  bool updated_since_round_ = false;  // an update was applied since it closed (then it is kept)
  bool ever_admitted_ = false;
  bool fresh_ = true;  // the set had made no update when this replica began
  bool round_ready_ = false;  // round_ready() called: drive() makes the round
  double lr_sum_ = 0.0;  // the window's finished steps' learning-rate scales
  Stats stats_;
  std::vector<Tensor> joined_buffers_, joined_;  // the batch's joined inputs: storage kept, and views of it
  Tensor dlogits_;
  std::vector<Tensor> unsplit_saved_;  // Network::unsplit_params' gradients before a backward
  bool unsplit_dirty_ = false;         // a backward has added to them since
  Network::StateSnapshot state_saved_;  // Network::buffers and counters before the batch
  bool buffers_saved_ = false;  // ... saved by the batch computing now
};

}  // namespace tandem
