#include "pipeline/event_link.h"

#include <utility>

#include "core/error.h"

namespace tandem {

EventLink::EventLink(Host host) : host_(std::move(host)) {
  if (!host_.send || !host_.refuse) fail("stage", "an event link needs the host's send and refuse");
}

void EventLink::resume() {
  if (!waiting_) return;
  // Cleared first: the task may wait on this link again before resume() returns.
  std::exchange(waiting_, {}).resume();
}

void EventLink::deliver(Frame frame) {
  queue_.push_back(std::move(frame));
  resume();
}

void EventLink::lose(const std::string& why) {
  lost_ = true;
  why_ = why;
  resume();
}

void EventLink::reopen() {
  if (waiting_) fail("stage", "an event link reopened while a task waits on it: lose() it first");
  queue_.clear();
  lost_ = false;
  why_.clear();
}

void EventLink::open() {
  if (host_.open) host_.open();
}

void EventLink::send_last(std::span<const uint8_t> bytes) {
  if (host_.send_last) host_.send_last(bytes);
  else host_.send(bytes);
}

Frame EventLink::receive(const char* awaiting) {
  if (!queue_.empty()) {
    Frame frame = std::move(queue_.front());
    queue_.pop_front();
    return frame;
  }
  if (lost_) throw LinkLost(cat("[stage] the link closed while awaiting ", awaiting, ": ", why_));
  fail("stage", cat("receive of ", awaiting, " on an event link with nothing delivered: await the peer's task"));
}

void EventLink::refuse(const WireError& error) {
  host_.refuse(error);
  lost_ = true;
  why_ = cat("refused: ", error.text);
}

void EventLink::resume_when_ready(co::coroutine_handle<> task) {
  if (waiting_) fail("stage", "two tasks wait on one event link: a peer runs one task at a time");
  waiting_ = task;
}

}  // namespace tandem
