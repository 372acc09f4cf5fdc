#include "edge/agent/run_report.h"

#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace tandem {
namespace {

}  // namespace

RunReport::RunReport(const EdgeTrainOptions& options) : o_(options) {
  if (o_.metrics_json.empty()) return;
  metrics_.open(o_.metrics_json, std::ios::app);
  if (!metrics_) fail("edge", cat("cannot write --metrics-json ", o_.metrics_json));
}

void RunReport::attach(const EventEdge& edge, const CloudLink& link, uint32_t microbatches) {
  edge_ = &edge;
  link_ = &link;
  microbatches_ = microbatches;
}

void RunReport::detach() {
  if (link_) {
    carried_up_ += link_->bytes_up();
    carried_down_ += link_->bytes_down();
    carried_idle_ += link_->idle_seconds();
  }
  link_ = nullptr;
  edge_ = nullptr;
  bar_.reset();
}

void RunReport::reconnected(uint64_t redone) {
  ++reconnects_;
  steps_redone_ += redone;
  std::fprintf(stderr, "reconnection %d: %llu step%s to train again (%llu over the run)\n", reconnects_,
               static_cast<unsigned long long>(redone), redone == 1 ? "" : "s",
               static_cast<unsigned long long>(steps_redone_));
}

uint64_t RunReport::up() const { return carried_up_ + (link_ ? link_->bytes_up() : 0); }
uint64_t RunReport::down() const { return carried_down_ + (link_ ? link_->bytes_down() : 0); }
double RunReport::idle() const { return carried_idle_ + (link_ ? link_->idle_seconds() : 0.0); }

void RunReport::line(const std::string& json) {
  std::printf("%s\n", json.c_str());
  std::fflush(stdout);
  if (metrics_) metrics_ << json << "\n" << std::flush;
}

void RunReport::on_event(const EdgeEvent& e) {
  if (edge_ == nullptr || link_ == nullptr) return;
  const EdgeSession& session = edge_->session();
  using K = EdgeEvent::Kind;
  switch (e.kind) {
    case K::Connected:
      return;
    case K::Done:
      if (!e.text.empty()) std::fprintf(stderr, "stopped early: %s\n", e.text.c_str());
      if (e.epsilon >= 0)
        std::fprintf(stderr, "differential privacy on the cut: epsilon %s at delta %g over the run\n",
                     std::isinf(e.epsilon) ? "unbounded (no noise)" : fixed(e.epsilon, 3).c_str(), o_.privacy.dp_delta);
      return;
    case K::Welcome:
      std::fprintf(stderr,
                   "connected to wss://%s:%d, model %s cut at '%s', front on %s, %u micro-batches a step, %s on the "
                   "wire\n",
                   link_ ? link_->host().c_str() : o_.host.c_str(), link_ ? link_->port() : o_.port, edge_->model_name().c_str(), edge_->cut().c_str(), o_.backend.c_str(),
                   microbatches_, e.dtype.c_str());
      // Split-federated: the newest average first (a late or returning edge), then one every
      // aggregate_every steps and one after the last step.
      if (e.aggregate_every > 0)
        std::fprintf(stderr, "split-federated: front shards averaged every %u steps, the front updated %s\n",
                     e.aggregate_every, o_.front_updates_per_round ? "once a round" : "every step");
      else if (o_.front_updates_per_round)
        std::fprintf(stderr, "--front-updates round: this cloud does not federate, so the front updates every step\n");
      return;
    case K::Round:
      if (e.steps_done == 0)
        std::fprintf(stderr, "joined at round %u: continuing from the newest average\n", e.round);
      return;
    case K::EpochStarted:
      bar_ = std::make_unique<ProgressBar>(cat("epoch ", e.epoch, "/", o_.epochs), e.samples);
      first_ = e.cursor;
      loss_sum_ = 0.0;
      t0_ = Clock::now();
      up0_ = up();
      down0_ = down();
      idle0_ = idle();
      return;
    case K::Step:
      loss_sum_ += e.loss * static_cast<double>(e.samples);
      if (bar_) bar_->update(e.cursor, cat("loss ", fixed(loss_sum_ / static_cast<double>(e.cursor - first_), 4)));
      return;
    case K::EpochTrained:
      trained_ = e.samples;
      mean_loss_ = e.loss;
      epsilon_ = e.epsilon;
      first_grad_ms_ = e.first_grad_ms;
      dcor_ = e.dcor;
      tokens_per_sample_ = e.tokens_per_sample;
      seconds_ = std::chrono::duration<double>(Clock::now() - t0_).count();
      train_up_ = up() - up0_;
      train_down_ = down() - down0_;
      train_idle_ = idle() - idle0_;  // training's alone, as seconds_ is
      if (bar_) bar_->finish(cat("loss ", fixed(mean_loss_, 4)));
      bar_.reset();
      return;
    case K::Evaluated: {
      accuracy_ = e.accuracy;
      const double epoch_cloud = e.cloud_busy_s - cloud_busy_before_;
      cloud_busy_before_ = e.cloud_busy_s;
      if (e.epoch == 0) {  // not after an epoch: the starting weights (--epochs 0)
        if (o_.epochs == 0)
          line(cat("{\"epoch\":0,\"step\":", e.step, ",\"test_accuracy\":", fixed(e.accuracy, 5), "}"));
        return;
      }
      const double idle = train_idle_;
      const int64_t steps = std::max<int64_t>(1, (trained_ + o_.batch - 1) / o_.batch);
      line(cat("{\"epoch\":", e.epoch, ",\"samples\":", trained_, ",\"seconds\":", fixed(seconds_, 3),
               ",\"samples_per_s\":", fixed(static_cast<double>(trained_) / seconds_, 1),
               ",\"train_loss\":", fixed(mean_loss_, 5), ",\"test_accuracy\":", fixed(e.accuracy, 5),
               ",\"lr\":", fixed(edge_->optimizer().lr(), 6), ",\"wire_dtype\":\"", dtype_name(session.dtype()),
               "\",\"pipeline\":\"", o_.async ? "async" : "sync", "\",\"steps\":", steps, ",\"step\":", e.step, ",\"round\":", e.round,
               ",\"rounds_joined\":", session.rounds_joined(), ",\"bytes_up\":", up() - up0_,
               ",\"bytes_down\":", down() - down0_, ",\"train_bytes_up\":", train_up_,
               ",\"train_bytes_down\":", train_down_, ",\"edge_busy_s\":", fixed(seconds_ - idle, 3),
               ",\"edge_idle_s\":", fixed(idle, 3), ",\"edge_idle_fraction\":", fixed(idle / std::max(seconds_, 1e-9), 4),
               first_grad_ms_ < 0 ? "" : cat(",\"first_grad_ms\":", fixed(first_grad_ms_, 3)),
               ",\"cloud_busy_s\":", fixed(epoch_cloud, 3),
               ",\"cloud_idle_s\":", fixed(std::max(0.0, seconds_ - epoch_cloud), 3),
               // Per step, what the planner predicts (tandem plan): each side's idle time.
               ",\"edge_idle_ms_per_step\":", fixed(idle / static_cast<double>(steps) * 1e3, 3),
               ",\"cloud_idle_ms_per_step\":", fixed(std::max(0.0, seconds_ - epoch_cloud) / static_cast<double>(steps) * 1e3, 3),
               ",\"reconnects\":", reconnects_, ",\"steps_redone\":", steps_redone_,
               dcor_ < 0 ? "" : cat(",\"nopeek_dcor\":", fixed(dcor_, 4)),
               tokens_per_sample_ < 0 ? "" : cat(",\"tokens_per_sample\":", fixed(tokens_per_sample_, 1)),
               epsilon_ < 0 ? "" : std::isinf(epsilon_) ? ",\"dp_epsilon\":null" : cat(",\"dp_epsilon\":", fixed(epsilon_, 4)),
               "}"));
      return;
    }
    case K::Error:
      if (bar_) std::fprintf(stderr, "\n");
      std::fprintf(stderr, "tandem-edge: %s\n", e.text.c_str());
      return;
    case K::Retry:  // (tandem-edge's own loop prints its retries and reconnections: edge_agent.cpp)
    case K::Reconnect:
      return;
  }
}

}  // namespace tandem
