// A link between two stage peers in one process (pipeline/stage_peer.h): what one end sends
// the other receives, copied into a frame, as over a network. For the stage peer's tests and
// the fuzzers' seeds.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "pipeline/stage_peer.h"

namespace tandem::test {

class MemoryLink final : public StageLink {
 public:
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::vector<uint8_t>> messages;
    bool closed = false;
  };
  MemoryLink(std::shared_ptr<Queue> in, std::shared_ptr<Queue> out) : in_(std::move(in)), out_(std::move(out)) {}
  // Both ends of a new link.
  static std::pair<std::unique_ptr<MemoryLink>, std::unique_ptr<MemoryLink>> pair() {
    auto a = std::make_shared<Queue>(), b = std::make_shared<Queue>();
    return {std::make_unique<MemoryLink>(a, b), std::make_unique<MemoryLink>(b, a)};
  }

  void send(std::span<const uint8_t> bytes) override {
    std::lock_guard lock(out_->mu);
    ++sent;
    if (out_->closed) return;
    out_->messages.emplace_back(bytes.begin(), bytes.end());
    out_->cv.notify_all();
  }
  // Throws LinkLost when the link is closed, or silent for 30 s.
  Frame receive(const char* awaiting) override {
    std::unique_lock lock(in_->mu);
    if (!in_->cv.wait_for(lock, std::chrono::seconds(30), [&] { return !in_->messages.empty() || in_->closed; }))
      throw LinkLost(cat("no ", awaiting, " within 30 s"));
    if (in_->messages.empty()) throw LinkLost(cat("the link closed while awaiting ", awaiting));
    const std::vector<uint8_t> bytes = std::move(in_->messages.front());
    in_->messages.pop_front();
    if (on_receive) on_receive(bytes);
    return Frame::copy_of(bytes.data(), bytes.size());
  }
  void refuse(const WireError& error) override {
    refused = error;
    close();
  }
  void close() {
    for (Queue* q : {in_.get(), out_.get()}) {
      std::lock_guard lock(q->mu);
      q->closed = true;
      q->cv.notify_all();
    }
  }
  WireError refused;  // the last refusal
  std::atomic<uint64_t> sent{0};  // messages this end sent
  std::function<void(const std::vector<uint8_t>&)> on_receive;  // sees every message that arrives

 private:
  std::shared_ptr<Queue> in_, out_;
};

}  // namespace tandem::test
