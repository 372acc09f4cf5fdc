// What the native agent shows of a run from the edge driver's events: the connection's lines
// on stderr, a progress bar per epoch, and one JSON line of metrics per epoch on stdout and
// in --metrics-json (with the link's bytes and waiting time, which only the agent sees).
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "cli/progress.h"
#include "edge/agent/cloud_link.h"
#include "edge/agent/edge_agent.h"
#include "edge/session/event_edge.h"

namespace tandem {

class RunReport {
 public:
  // Throws Error when --metrics-json cannot be written.
  explicit RunReport(const EdgeTrainOptions& options);
  // The run and its link, once they exist (events before then are not reported).
  void attach(const EventEdge& edge, const CloudLink& link, uint32_t microbatches);
  // Before the link (or the run's driver) goes: its counters carry over to the next link.
  void detach();
  // The agent connected again after a drop and resumed `redone` steps before where it was:
  // said on stderr and counted in the metrics (reconnects, steps_redone).
  void reconnected(uint64_t redone);
  void on_event(const EdgeEvent& e);

  double accuracy() const { return accuracy_; }

 private:
  using Clock = std::chrono::steady_clock;
  void line(const std::string& json);
  // The run's bytes each way and time waiting on the cloud, over every link it has had.
  uint64_t up() const;
  uint64_t down() const;
  double idle() const;

  const EdgeTrainOptions& o_;
  const EventEdge* edge_ = nullptr;
  const CloudLink* link_ = nullptr;
  uint32_t microbatches_ = 0;
  std::ofstream metrics_;
  std::unique_ptr<ProgressBar> bar_;
  // The epoch under way: where it started (samples, time, link counters) and its losses.
  int64_t first_ = 0, trained_ = 0;
  double loss_sum_ = 0.0, mean_loss_ = 0.0, seconds_ = 0.0, idle0_ = 0.0, train_idle_ = 0.0, cloud_busy_before_ = 0.0;
  double epsilon_ = -1.0;  // DP spent on the cut by the epoch's end (< 0: no DP)
  double dcor_ = -1.0;            // NoPeek: the epoch's distance correlation (< 0: off)
  double tokens_per_sample_ = -1.0;  // length buckets: the epoch's mean tokens a sample (< 0: none)
  double first_grad_ms_ = -1.0;  // the epoch's median time to a step's first gradient (< 0: none)
  double accuracy_ = 0.0;
  uint64_t up0_ = 0, down0_ = 0, train_up_ = 0, train_down_ = 0;
  uint64_t carried_up_ = 0, carried_down_ = 0;  // earlier links'
  double carried_idle_ = 0.0;
  int reconnects_ = 0;
  uint64_t steps_redone_ = 0;
  Clock::time_point t0_;
};

}  // namespace tandem
