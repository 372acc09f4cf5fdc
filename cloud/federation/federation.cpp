#include "cloud/federation/federation.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "core/federated_average.h"

namespace tandem {
namespace {
std::string fixed3(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}
}  // namespace

Federation::Federation(NamedTensors front, const FederationOptions& options, Send send)
    : current_(std::move(front)), options_(options), send_(std::move(send)) {
  if (options_.aggregate_every < 1) fail("federation", "aggregate_every must be >= 1");
  if (options_.min_edges < 1) fail("federation", "min_edges must be >= 1");
  if (!(options_.deadline_s > 0.0)) fail("federation", "the round deadline must be > 0 seconds");
  for (auto& [name, t] : current_) t = t.clone();
}

uint32_t Federation::round() {
  std::lock_guard<std::mutex> lock(mutex_);
  return round_;
}

std::vector<uint8_t> Federation::join(uint64_t connection, const std::string& client) {
  std::lock_guard<std::mutex> lock(mutex_);
  edges_[connection].info.client = client;
  if (round_ == 0) return {};
  const auto bytes = writer_.aggregated(round_, 0, 0, current_);
  return {bytes.begin(), bytes.end()};
}

void Federation::restore(uint32_t round, NamedTensors average) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (average.size() != current_.size()) fail("federation", "the restored average has other tensors");
  for (std::size_t k = 0; k < current_.size(); ++k) {
    if (average[k].first != current_[k].first || average[k].second.shape() != current_[k].second.shape())
      fail("federation", cat("the restored average's ", average[k].first, " does not fit the front shard"));
    current_[k].second = average[k].second.clone();
  }
  round_ = saved_round_ = round;
}

std::optional<std::pair<uint32_t, NamedTensors>> Federation::take_unsaved_round() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (round_ == saved_round_) return std::nullopt;
  saved_round_ = round_;
  NamedTensors copy;
  for (const auto& [name, t] : current_) copy.emplace_back(name, t.clone());
  return std::make_pair(round_, std::move(copy));
}

void Federation::leave(uint64_t connection) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (edges_.erase(connection) == 0) return;
  if (!all_sent() || !at_boundary()) return;
  try {
    close_round("the others left");
  } catch (const std::exception& e) {  // (a session's end must not throw)
    std::fprintf(stderr, "tandem-cloud: the round could not close as an edge left: %s\n", e.what());
  }
}

bool Federation::submit(uint64_t connection, const Frame& frame, const wire::FrontWeights& w, uint64_t max_samples,
                        WireError& error) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = edges_.find(connection);
  if (it == edges_.end()) {
    error = {wire::ErrorCode::UnexpectedMessage, "FrontWeights from an edge that has not joined"};
    return false;
  }
  Edge& edge = it->second;
  if (edge.submitted) {
    error = {wire::ErrorCode::OutOfWindow, cat("a second FrontWeights in round ", round_ + 1)};
    return false;
  }
  if (w.samples() > max_samples) {
    error = {wire::ErrorCode::BadTensor,
             cat("FrontWeights claims ", w.samples(), " samples, more than the ", max_samples, " of a round")};
    return false;
  }
  std::vector<Tensor> views;
  if (!read_named_tensors(frame, w.tensors(), current_, views, error)) return false;
  edge.weights.clear();
  for (const Tensor& v : views) edge.weights.push_back(v.clone());  // the frame goes away
  edge.submitted = true;
  edge.final = w.final();
  edge.straggler = false;
  edge.round_samples = w.samples();
  edge.info.samples += w.samples();
  if (!first_submission_) first_submission_ = Clock::now();
  if (all_sent() && at_boundary()) close_round("every edge sent");
  return true;
}

bool Federation::at_boundary() const {
  // Replicas: a round whose fronts are all final ones (runs that ended mid-round) closes at the
  // set's boundary, which another replica's edges reach, or all together once none trains:
  // replica_round, from the replica's driver.
  if (!on_ready_) return true;
  return std::any_of(edges_.begin(), edges_.end(), [](const auto& e) { return e.second.submitted && !e.second.final; });
}

bool Federation::all_sent() const {
  uint32_t sent = 0;
  for (const auto& [c, e] : edges_) {
    if (!e.submitted && !e.straggler) return false;
    sent += e.submitted ? 1 : 0;
  }
  // Fewer than min_edges: the deadline decides. (Replicas: every edge a replica admitted is in
  // the set's step, however few; the first window held for min_edges at the start.)
  return sent > 0 && (on_ready_ || sent >= options_.min_edges);
}

void Federation::tick(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Replicas close a round only when every edge of theirs has sent (all_sent): a round closed
  // by a deadline here would make its all-sum while another replica makes an update's.
  if (on_ready_) return;
  if (!first_submission_ || std::chrono::duration<double>(now - *first_submission_).count() < options_.deadline_s)
    return;
  uint32_t sent = 0, present = 0;
  for (const auto& [c, e] : edges_) {
    sent += e.submitted ? 1 : 0;
    present += e.straggler ? 0 : 1;
  }
  if (sent == 0 || sent < std::min(options_.min_edges, present)) return;
  for (auto& [c, e] : edges_) e.straggler = e.straggler || !e.submitted;
  close_round("deadline");
}

void Federation::close_round(const char* why) {
  const std::vector<Edge*> in = submitted();
  if (in.empty()) return;
  if (on_ready_) {  // replicas: the driver makes the round with the set (replica_round)
    if (!ready_) {
      ready_ = true;
      on_ready_();
    }
    return;
  }
  // Weighted by samples (equal weights if every edge reports 0), summed in double.
  std::vector<const std::vector<Tensor>*> parts;
  std::vector<uint64_t> part_samples;
  for (Edge* e : in) {
    parts.push_back(&e->weights);
    part_samples.push_back(e->round_samples);
  }
  std::vector<Tensor> out;
  for (auto& [name, t] : current_) out.push_back(t);  // views of the average's storage
  federated_average(parts, part_samples, out);
  finish_round(in, why);
}

void Federation::finish_round(const std::vector<Edge*>& in, const char* why) {
  uint64_t samples = 0;
  for (const Edge* e : in) samples += e->round_samples;
  ready_ = false;
  ++round_;
  const auto bytes = writer_.aggregated(round_, static_cast<uint32_t>(in.size()), samples, current_);
  std::string who;
  for (auto& [c, e] : edges_)
    if (e.submitted) {
      send_(c, bytes);
      who += cat(who.empty() ? "" : ",", "\"", e.info.client, "\"");
      ++e.info.rounds_joined;
      e.submitted = e.final = false;
      e.weights.clear();
    }
  const double waited =
      first_submission_ ? std::chrono::duration<double>(Clock::now() - *first_submission_).count() : 0.0;
  first_submission_.reset();
  if (in.empty())  // a replica with no edge in this round takes the set's average
    std::printf("round %u: no edge of this replica's in it; the set's average taken\n", round_);
  else
    std::printf("round %u: %zu of %zu edges, %llu samples (%s, waited %.2f s)\n", round_, in.size(), edges_.size(),
                static_cast<unsigned long long>(samples), why, waited);
  std::fflush(stdout);
  if (metrics_)
    metrics_(cat("{\"round\":", round_, ",\"edges\":[", who, "],\"connected\":", edges_.size(), ",\"samples\":",
                 samples, ",\"closed_by\":\"", why, "\",\"waited_s\":", fixed3(waited), "}"));
  if (on_close_) on_close_();
}

std::size_t Federation::round_values() const {
  std::size_t n = 1;
  for (const auto& [name, t] : current_) n += static_cast<std::size_t>(t.numel());
  return n;
}

std::vector<Federation::Edge*> Federation::submitted() {
  std::vector<Edge*> in;
  for (auto& [c, e] : edges_)
    if (e.submitted) in.push_back(&e);
  return in;
}

std::vector<float> Federation::round_sums(const std::vector<Edge*>& in) const {
  // This replica's edges' fronts times their samples, and the samples, summed over every
  // replica's (a replica whose edges report 0 samples weighs each edge as 1).
  std::vector<float> sums(round_values(), 0.0f);
  uint64_t samples = 0;
  for (const Edge* e : in) samples += e->round_samples;
  const bool counted = samples > 0;
  std::vector<double> acc;
  std::size_t at = 0, k = 0;
  for (const auto& [name, t] : current_) {
    acc.assign(static_cast<std::size_t>(t.numel()), 0.0);
    for (const Edge* e : in) {
      const double w = counted ? static_cast<double>(e->round_samples) : 1.0;
      const float* v = e->weights[k].data();
      for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += w * v[i];
    }
    for (std::size_t i = 0; i < acc.size(); ++i) sums[at + i] = static_cast<float>(acc[i]);
    at += acc.size();
    ++k;
  }
  sums[at] = counted ? static_cast<float>(samples) : static_cast<float>(in.size());
  return sums;
}

void Federation::take_sums(std::span<const float> sums) {
  const float total = sums[sums.size() - 1];
  if (!(total > 0)) return;  // (no replica had a front in it: the average stays)
  std::size_t at = 0;
  for (auto& [name, t] : current_) {
    float* v = t.data();
    for (int64_t i = 0; i < t.numel(); ++i) v[i] = sums[at + static_cast<std::size_t>(i)] / total;
    at += static_cast<std::size_t>(t.numel());
  }
}

bool Federation::round_pending() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::any_of(edges_.begin(), edges_.end(), [](const auto& e) { return e.second.submitted; });
}

bool Federation::round_ready() {
  std::lock_guard<std::mutex> lock(mutex_);
  return ready_;
}

std::vector<float> Federation::replica_round_values() {
  std::lock_guard<std::mutex> lock(mutex_);
  return round_sums(submitted());
}

void Federation::replica_round(std::span<const float> sums, uint64_t round) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::size_t n = round_values();
  if (sums.size() != n)
    fail("federation", cat("the replica set's round ", round, " sums ", sums.size(), " values, where this replica's "
                           "front and weight are ", n, ": every replica must serve the same model"));
  if (round != static_cast<uint64_t>(round_) + 1)
    fail("federation", cat("the replica set is out of step: it closes round ", round, " where this replica closed ",
                           round_));
  take_sums(sums);
  finish_round(submitted(), "the replica set");
}

std::vector<float> Federation::state() {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_locked();
}

void Federation::set_state(std::span<const float> values) {
  std::lock_guard<std::mutex> lock(mutex_);
  set_state_locked(values);
}

std::vector<float> Federation::state_locked() const {
  std::vector<float> out{static_cast<float>(round_)};
  for (const auto& [name, t] : current_) out.insert(out.end(), t.data(), t.data() + t.numel());
  return out;
}

void Federation::set_state_locked(std::span<const float> values) {
  std::size_t n = 1;
  for (const auto& [name, t] : current_) n += static_cast<std::size_t>(t.numel());
  if (values.size() != n) fail("federation", cat("a replica's federation state of ", values.size(), " values, not ", n));
  round_ = saved_round_ = static_cast<uint32_t>(values[0]);
  std::size_t at = 1;
  for (auto& [name, t] : current_) {
    std::copy_n(values.data() + at, t.numel(), t.data());
    at += static_cast<std::size_t>(t.numel());
  }
}

std::optional<FederatedEdge> Federation::edge(uint64_t connection) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = edges_.find(connection);
  if (it == edges_.end()) return std::nullopt;
  return it->second.info;
}

std::vector<FederatedEdge> Federation::edges() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<FederatedEdge> out;
  for (const auto& [c, e] : edges_) out.push_back(e.info);
  return out;
}

}  // namespace tandem
