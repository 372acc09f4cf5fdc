// A link to a neighbouring stage driven by its host's events, for a stage peer that has no
// thread of its own: the browser's event loop, or one executor serving many sessions. The host
// hands the link what arrives (deliver) and says when it closes (lose); a peer's task that
// waits on the link (StagePeer's `..._async` calls, pipeline/task.h) resumes within that call,
// runs until it needs another message, and returns. What the peer sends goes out through the
// host's functions. Single-threaded: deliver and lose from the host's loop, never from within
// one of its send functions (a task would resume inside another's send).
#pragma once

#include "pipeline/coroutine.h"
#include <deque>
#include <functional>
#include <span>
#include <string>

#include "pipeline/stage_peer.h"

namespace tandem {

class EventLink final : public StageLink {
 public:
  struct Host {
    std::function<void(std::span<const uint8_t>)> send;       // a message to the neighbour
    std::function<void(std::span<const uint8_t>)> send_last;  // ... after which the link closes (none: send)
    std::function<void(const WireError&)> refuse;             // Error to the neighbour, then close
    std::function<void()> open;                                // connect, when this end connects (none: nothing)
  };
  explicit EventLink(Host host);

  // The host's events. A message from the neighbour (already collected whole, within the size
  // cap); the task waiting on this link, if one is, goes on.
  void deliver(Frame frame);
  // The link closed or stayed silent too long: a waiting task, and every receive after the
  // messages already delivered, ends in LinkLost naming `why`.
  void lose(const std::string& why);
  // A new connection in place of a lost one: what was delivered before, and the loss, are
  // forgotten (no task may wait on the link).
  void reopen();
  bool waiting() const { return static_cast<bool>(waiting_); }  // a task waits on this link
  std::size_t queued() const { return queue_.size(); }           // delivered, not yet read

  void open() override;
  void send(std::span<const uint8_t> bytes) override { host_.send(bytes); }
  void send_last(std::span<const uint8_t> bytes) override;
  Frame receive(const char* awaiting) override;
  void refuse(const WireError& error) override;
  bool ready() override { return !queue_.empty() || lost_; }
  void resume_when_ready(co::coroutine_handle<> task) override;
  void forget(co::coroutine_handle<> task) override {
    if (waiting_ == task) waiting_ = {};
  }

 private:
  void resume();
  Host host_;
  std::deque<Frame> queue_;
  bool lost_ = false;
  std::string why_;
  co::coroutine_handle<> waiting_;
};

}  // namespace tandem
