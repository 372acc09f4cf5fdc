#include "pipeline/stage_host.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <thread>
#include <utility>

#include "core/error.h"

namespace tandem {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

struct StageHost::Session {
  StageHost* host = nullptr;
  Executor* executor = nullptr;
  std::string identity;
  std::size_t index = 0;  // in snapshot_
  std::unique_ptr<HostedStage> hosted;
  std::unique_ptr<EventLink> link;
  std::unique_ptr<StagePeer> peer;
  uint64_t connection = 0;  // the connection serving it now (0: none)
  bool finished = false;
  uint64_t runs = 0;
  Task<> task;  // last: destroyed first, while the link and the peer it waits in still exist
};

struct StageHost::Executor {
  std::size_t index = 0;
  std::mutex mu;  // the queue
  std::condition_variable cv;
  std::deque<Event> queue;
  std::atomic<std::size_t> waiting{0};  // queue.size(), read without the lock
  // Sessions' tasks parked before work no neighbour waits for (StagePeer::defer_later_work),
  // resumed in order once the queue is empty. Its thread's only.
  std::deque<std::pair<Session*, co::coroutine_handle<>>> later;
  std::map<std::string, std::unique_ptr<Session>> sessions;  // its own, by identity: its thread's only
  MessageWriter writer;
  double busy_s = 0;  // under the host's mu_
  std::thread thread;
};

StageHost::StageHost(StageHostOptions options, StageHostHooks hooks, Send send)
    : options_(std::move(options)), hooks_(std::move(hooks)), send_(std::move(send)) {
  if (options_.schedule == nullptr) fail("stage", "a stage host needs its plan's schedule");
  if (options_.plan.index == 0 || options_.plan.index + 1 != options_.plan.stages || options_.plan.members != 1)
    fail("stage", cat("a stage host serves the last stage of pipelines with one first party each; stage ",
                      options_.plan.index, " of ", options_.plan.stages, " (", options_.plan.members,
                      " first parties) is not one"));
  if (!hooks_.make) fail("stage", "a stage host needs the factory of its sessions' stages");
  if (options_.identities.empty()) fail("stage", "a stage host serves the first parties it is given: none were");
  if (options_.executors < 1) fail("stage", "a stage host needs an executor or more");
  for (std::size_t e = 0; e < options_.executors; ++e) {
    executors_.push_back(std::make_unique<Executor>());
    executors_.back()->index = e;
  }
  for (auto& x : executors_) x->thread = std::thread([this, p = x.get()] { run(*p); });
}

StageHost::~StageHost() {
  for (std::size_t e = 0; e < executors_.size(); ++e) push(e, Event{Event::Kind::Stop, 0, {}, {}});
  for (auto& x : executors_) x->thread.join();
}

std::string StageHost::busy_why() const {
  return cat("this stage serves ", options_.max_sessions, " sessions at once: try again later");
}

void StageHost::push(std::size_t executor, Event e) {
  Executor& x = *executors_[executor];
  {
    std::lock_guard lock(x.mu);
    x.queue.push_back(std::move(e));
    ++x.waiting;
  }
  x.cv.notify_all();
}

// A named party's session stays on one executor; a new one goes to the executor with the
// fewest, while fewer than max_sessions are held (else the first refuses it Busy, and it
// holds no slot). A stranger is refused by the first.
void StageHost::connected(uint64_t connection, const std::string& identity) {
  std::size_t e = 0;
  Event::Kind kind = Event::Kind::Connected;
  {
    std::lock_guard lock(mu_);
    if (std::find(options_.identities.begin(), options_.identities.end(), identity) != options_.identities.end()) {
      auto it = executor_of_.find(identity);
      if (it != executor_of_.end()) {
        e = it->second;
      } else if (executor_of_.size() >= options_.max_sessions) {
        kind = Event::Kind::Busy;
      } else {
        std::vector<std::size_t> load(executors_.size(), 0);
        for (const auto& [name, x] : executor_of_) ++load[x];
        e = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
        executor_of_[identity] = e;
      }
    }
    route_[connection] = e;
  }
  push(e, Event{kind, connection, identity, {}});
}

void StageHost::received(uint64_t connection, Frame frame) {
  std::size_t e = 0;
  {
    std::lock_guard lock(mu_);
    const auto it = route_.find(connection);
    if (it == route_.end()) return;
    e = it->second;
  }
  push(e, Event{Event::Kind::Message, connection, {}, std::move(frame)});
}

void StageHost::closed(uint64_t connection, const std::string& why) {
  std::size_t e = 0;
  {
    std::lock_guard lock(mu_);
    const auto it = route_.find(connection);
    if (it == route_.end()) return;
    e = it->second;
    route_.erase(it);
  }
  push(e, Event{Event::Kind::Closed, connection, why, {}});
}

void StageHost::run(Executor& x) {
  for (;;) {
    Event e;
    bool idle = false;
    {
      std::unique_lock lock(x.mu);
      x.cv.wait(lock, [&] { return !x.queue.empty() || !x.later.empty(); });
      idle = x.queue.empty();
      if (!idle) {
        e = std::move(x.queue.front());
        x.queue.pop_front();
        --x.waiting;
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (idle) {  // nothing waits: a parked session's later work
      const auto [s, task] = x.later.front();
      x.later.pop_front();
      task.resume();
      settle(*s);
      std::lock_guard lock(mu_);
      x.busy_s += seconds_since(t0);
      continue;
    }
    if (e.kind == Event::Kind::Stop) return;
    try {
      switch (e.kind) {
        case Event::Kind::Connected:
          on_connected(x, e.connection, e.text);
          break;
        case Event::Kind::Busy:
          send_(e.connection,
                x.writer.error(wire::ErrorCode::Busy, busy_why()),
                true);
          break;
        case Event::Kind::Message:
          on_message(x, e.connection, std::move(e.frame));
          break;
        case Event::Kind::Closed:
          on_closed(x, e.connection, e.text);
          break;
        case Event::Kind::Stop:
          break;
      }
    } catch (const std::exception& error) {  // the host's own failure (a hook, memory): that connection ends
      std::fprintf(stderr, "stage host: connection %llu: %s\n", static_cast<unsigned long long>(e.connection),
                   error.what());
      send_(e.connection, x.writer.error(wire::ErrorCode::Internal, cat("the stage host failed: ", error.what())), true);
    }
    std::lock_guard lock(mu_);
    x.busy_s += seconds_since(t0);
  }
}

namespace {
template <class Sessions>
auto* by_connection(Sessions& sessions, uint64_t connection) {
  for (auto& [name, s] : sessions)
    if (connection != 0 && s->connection == connection) return s.get();
  return static_cast<decltype(sessions.begin()->second.get())>(nullptr);
}
}  // namespace

void StageHost::on_connected(Executor& x, uint64_t connection, const std::string& identity) {
  const auto refuse = [&](wire::ErrorCode code, const std::string& why) {
    send_(connection, x.writer.error(code, why), true);
  };
  if (std::find(options_.identities.begin(), options_.identities.end(), identity) == options_.identities.end()) {
    refuse(wire::ErrorCode::Unauthorized, cat("this stage serves the first parties it was given; '", identity,
                                              "' is not one of them"));
    return;
  }
  auto it = x.sessions.find(identity);
  if (it == x.sessions.end()) {  // its slot was taken in connected()
    auto s = std::make_unique<Session>();
    s->host = this;
    s->executor = &x;
    s->identity = identity;
    try {
      s->hosted = hooks_.make(identity, x.index);
    } catch (const std::exception& e) {
      {
        std::lock_guard lock(mu_);
        executor_of_.erase(identity);  // no session: its slot is free again
      }
      refuse(wire::ErrorCode::Internal, cat("this stage could not make the session's stage: ", e.what()));
      return;
    }
    {  // its slot, given back by a session of this party that could not be made meanwhile
      std::lock_guard lock(mu_);
      const auto slot = executor_of_.find(identity);
      if (slot == executor_of_.end()) {
        if (executor_of_.size() >= options_.max_sessions) {
          refuse(wire::ErrorCode::Busy, busy_why());
          return;
        }
        executor_of_[identity] = x.index;
      } else if (slot->second != x.index) {  // a newer link of the party took it elsewhere
        refuse(wire::ErrorCode::Restart, cat("'", identity, "' linked again meanwhile: this link is replaced"));
        return;
      }
    }
    Session* raw = s.get();
    EventLink::Host link_host;
    link_host.send = [this, raw](std::span<const uint8_t> b) {
      if (raw->connection != 0) send_(raw->connection, b, false);
    };
    link_host.send_last = [this, raw](std::span<const uint8_t> b) {
      if (raw->connection != 0) send_(std::exchange(raw->connection, 0), b, true);
    };
    link_host.refuse = [this, raw](const WireError& error) {
      if (raw->connection != 0)
        send_(std::exchange(raw->connection, 0), raw->executor->writer.error(error.code, error.text), true);
    };
    s->link = std::make_unique<EventLink>(std::move(link_host));
    s->peer = std::make_unique<StagePeer>(s->hosted->stage(), *options_.schedule, options_.plan, s->link.get(), nullptr);
    if (hooks_.save)
      s->peer->on_checkpoint([this, raw](uint64_t step) { hooks_.save(raw->identity, step, *raw->hosted); });
    // The run's end is recorded before the first party hears Bye: an end it was told of survives a crash.
    if (hooks_.ended)
      s->peer->on_end([this, raw](uint64_t steps, bool acknowledged) {
        if (!acknowledged) hooks_.ended(raw->identity, "", *raw->hosted, steps);  // a last stage: no more to hear
      });
    s->peer->defer_later_work([&x] { return x.waiting.load() > 0; },
                              [&x, raw](co::coroutine_handle<> task) { x.later.emplace_back(raw, task); });
    {
      std::lock_guard lock(mu_);
      const auto known = std::find_if(snapshot_.begin(), snapshot_.end(),
                                      [&](const SessionState& st) { return st.identity == identity; });
      s->index = static_cast<std::size_t>(known - snapshot_.begin());
      if (known == snapshot_.end()) snapshot_.push_back(SessionState{identity});
    }
    it = x.sessions.emplace(identity, std::move(s)).first;
  }
  Session& s = *it->second;
  // Its task, parked for later work, is about to be replaced: it resumes no more.
  std::erase_if(x.later, [&](const auto& p) { return p.first == &s; });
  if (s.task.valid()) {  // it links again while its run goes on: that link is stale
    if (s.connection != 0)
      send_(std::exchange(s.connection, 0),
            x.writer.error(wire::ErrorCode::Restart, cat("'", identity, "' linked again: this link is replaced")), true);
    s.link->lose(cat("'", identity, "' linked again"));
    settle(s);
    if (s.task.valid()) {  // it was parked for later work, not waiting on the link: dropped
      s.task = Task<>();
      if (hooks_.ended) hooks_.ended(s.identity, cat("'", identity, "' linked again"), *s.hosted, s.peer->next_step());
    }
  }
  s.connection = connection;
  s.link->reopen();
  start(s);
}

void StageHost::on_message(Executor& x, uint64_t connection, Frame frame) {
  Session* s = by_connection(x.sessions, connection);
  if (s == nullptr) return;  // a connection already replaced or refused: what it still sends is dropped
  if (s->link->queued() >= options_.max_queued) {  // far ahead of what its stage has taken
    const std::string why = cat("'", s->identity, "' sent ", s->link->queued() + 1, " messages ahead of its stage (at most ",
                                options_.max_queued, ")");
    send_(std::exchange(s->connection, 0), x.writer.error(wire::ErrorCode::OutOfWindow, why), true);
    s->link->lose(why);
    settle(*s);
    return;
  }
  s->link->deliver(std::move(frame));
  settle(*s);
}

void StageHost::on_closed(Executor& x, uint64_t connection, const std::string& why) {
  Session* s = by_connection(x.sessions, connection);
  if (s == nullptr) return;
  s->connection = 0;
  s->link->lose(why.empty() ? std::string("the first party closed its link") : why);
  settle(*s);
}

Task<> StageHost::serve(Session& s) {
  StageHost& host = *s.host;
  const std::vector<uint64_t> have =
      host.hooks_.checkpoints ? host.hooks_.checkpoints(s.identity, *s.hosted) : std::vector<uint64_t>{};
  const uint64_t start = co_await s.peer->connect_async(have);
  if (s.peer->ended()) co_return;  // its run ended here before: answered Bye, nothing to train
  if (host.hooks_.restore) host.hooks_.restore(s.identity, start, *s.hosted);
  StepStats stats;
  for (;;) {
    const bool more = co_await s.peer->follow_step_async(stats);
    if (!more) break;
  }
}

void StageHost::start(Session& s) {
  ++s.runs;
  {
    std::lock_guard lock(mu_);
    const SessionState& st = snapshot_[s.index];
    // A party whose run ended here (this process or one before, mark_finished) links again:
    // it hears Bye at its StageHello, and finds out that its run is over.
    if (st.finished) s.peer->set_ended(st.steps, true);
  }
  s.finished = false;
  s.peer->reset();  // a step in flight when the last run ended is dropped
  s.task = serve(s);
  s.task.start();
  settle(s);
}

void StageHost::settle(Session& s) {
  if (s.task.valid() && s.task.done()) {
    std::string error;
    try {
      s.task.result();
    } catch (const std::exception& e) {
      error = e.what();
    }
    s.task = Task<>();
    if (error.empty()) {
      s.finished = true;
    } else {
      s.peer->reset();
      if (s.connection != 0)  // the link is still up (the party asked to start again): close it
        send_(std::exchange(s.connection, 0),
              s.executor->writer.error(wire::ErrorCode::Restart,
                                       cat("link again to go on from the newest checkpoint: ", error)),
              true);
    }
    if (hooks_.ended && !error.empty()) {  // a run that ended well was recorded before its Bye (on_end)
      try {
        hooks_.ended(s.identity, error, *s.hosted, s.peer->next_step());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "stage host: at the end of '%s''s run: %s\n", s.identity.c_str(), e.what());
      }
    }
  }
  std::lock_guard lock(mu_);
  SessionState& st = snapshot_[s.index];
  st.linked = s.connection != 0;
  st.finished = s.finished;
  st.steps = s.peer->next_step();
  st.runs = s.runs;
  st.busy_s = s.hosted->stage().busy_s();
  st.idle_s = s.peer->idle_s();
}

void StageHost::mark_finished(const std::string& identity, uint64_t steps) {
  std::lock_guard lock(mu_);
  if (std::find(options_.identities.begin(), options_.identities.end(), identity) == options_.identities.end())
    fail("stage", cat("'", identity, "' is not among the first parties this host serves"));
  SessionState st{identity};
  st.finished = true;
  st.steps = steps;
  snapshot_.push_back(st);
}

std::vector<StageHost::SessionState> StageHost::sessions() const {
  std::lock_guard lock(mu_);
  return snapshot_;
}

bool StageHost::finished_locked() const {
  for (const std::string& id : options_.identities) {
    const auto it = std::find_if(snapshot_.begin(), snapshot_.end(), [&](const SessionState& s) { return s.identity == id; });
    if (it == snapshot_.end() || !it->finished) return false;
  }
  return true;
}

bool StageHost::all_finished() const {
  std::lock_guard lock(mu_);
  return finished_locked();
}

std::vector<double> StageHost::executor_busy_s() const {
  std::lock_guard lock(mu_);
  std::vector<double> out;
  for (const auto& x : executors_) out.push_back(x->busy_s);
  return out;
}

}  // namespace tandem
