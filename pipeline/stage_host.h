// One stage served to many independent pipelines at once: the cloud's side of two-party
// training, where every hospital trains its own weights. Each first party that links is a
// session: a StagePeer with a Stage of its own (made by the host's factory) behind an
// EventLink. An executor thread runs its sessions' tasks in the order their messages arrive
// (one queue, as Triton's model instances and vLLM's engine loop run requests): a host has
// one executor or more, each with its own sessions (and, by its factory, its own backend), and
// a new session goes to the executor holding the fewest. Work no neighbour waits for yields to
// the messages of the executor's other sessions (StagePeer::defer_later_work). A hook that
// throws ends that session (or refuses that connection), never the host. A session whose first party
// sends something wrong is refused with the Error on its link and waits for that party to
// link again (from the newest checkpoint both have); a lost link waits the same way; the
// other sessions go on meanwhile. Transport-free: the transport reports connections,
// messages and closes from any thread, and the host sends through the transport's function.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/wire/frame.h"
#include "pipeline/event_link.h"
#include "pipeline/schedule.h"
#include "pipeline/stage.h"
#include "pipeline/stage_peer.h"
#include "pipeline/task.h"

namespace tandem {

// What one session trains: its own network, optimizer and Stage (and whatever they need, a
// backend). Made by the host's factory when a first party first links.
class HostedStage {
 public:
  virtual ~HostedStage() = default;
  virtual Stage& stage() = 0;
};

struct StageHostOptions {
  const PipelineSchedule* schedule = nullptr;  // not owned
  StagePlan plan;  // the stage every session runs: the last of its plan (the loss), not the first
  // The first parties it serves (certificate names); another is refused.
  std::vector<std::string> identities;
  std::size_t max_sessions = 64;  // sessions held at once; more are refused Busy
  std::size_t executors = 1;      // executor threads (tandem stage: one a session by default)
  std::size_t max_queued = 64;    // frames a session may have waiting; more end it (OutOfWindow)
};

struct StageHostHooks {
  // A session's stage at step 0, to run on executor `executor` (only that executor's thread
  // uses it: give each executor its own backend).
  std::function<std::unique_ptr<HostedStage>(const std::string& identity, std::size_t executor)> make;
  // The steps a session has a checkpoint of (step 0, the stage as made, always counts).
  std::function<std::vector<uint64_t>(const std::string& identity, HostedStage& stage)> checkpoints;
  // Puts the session's stage back to its checkpoint of `step` (0: as made), before it trains on.
  std::function<void(const std::string& identity, uint64_t step, HostedStage& stage)> restore;
  // A step that asked for a checkpoint is done; the stage has trained `step` steps. None: the
  // sessions keep none, and a first party that asks for one is refused.
  std::function<void(const std::string& identity, uint64_t step, HostedStage& stage)> save;
  // A session ended: its first party finished its run (`error` empty: its stage is trained,
  // to export, and the party hears Bye once this returns; if it throws, the party is told why
  // and may link again), or its link was lost or refused (`error` says why; the session waits
  // for the party to link again).
  // `steps`: the steps it has trained.
  std::function<void(const std::string& identity, const std::string& error, HostedStage& stage, uint64_t steps)> ended;
};

class StageHost {
 public:
  // (connection, bytes, close after sending)
  using Send = std::function<void(uint64_t connection, std::span<const uint8_t> bytes, bool close_after)>;
  StageHost(StageHostOptions options, StageHostHooks hooks, Send send);
  ~StageHost();  // stops the executor; the sessions' tasks are dropped where they wait
  StageHost(const StageHost&) = delete;
  StageHost& operator=(const StageHost&) = delete;

  // Before any connection: `identity` ended its run (at `steps`) under an earlier process of
  // this host (its record survived a crash); it counts as finished unless it links again.
  void mark_finished(const std::string& identity, uint64_t steps);

  // The transport's events, from any thread. `identity`: the name the connection proved (its
  // client certificate's).
  void connected(uint64_t connection, const std::string& identity);
  void received(uint64_t connection, Frame frame);
  void closed(uint64_t connection, const std::string& why);

  struct SessionState {
    std::string identity;
    bool linked = false;     // a connection serves it now
    bool finished = false;   // its first party ended its run (Bye)
    uint64_t steps = 0;      // the step it trains next
    uint64_t runs = 0;       // times it linked (1 + the times it came back)
    double busy_s = 0, idle_s = 0;  // its stage's compute, and its peer's wait on the link
  };
  std::vector<SessionState> sessions() const;
  // Whether every identity has finished its run (for a host that serves one run each).
  bool all_finished() const;
  // Seconds each executor ran tasks (its sessions together), by executor.
  std::vector<double> executor_busy_s() const;

 private:
  struct Session;
  struct Executor;
  struct Event {
    // Busy: a named party beyond max_sessions, refused by the executor (it holds no slot).
    enum class Kind { Connected, Busy, Message, Closed, Stop } kind;
    uint64_t connection = 0;
    std::string text;  // Connected: identity; Closed: why
    Frame frame;
  };
  void push(std::size_t executor, Event e);
  std::string busy_why() const;  // the Busy refusal's text
  void run(Executor& x);
  void on_connected(Executor& x, uint64_t connection, const std::string& identity);
  void on_message(Executor& x, uint64_t connection, Frame frame);
  void on_closed(Executor& x, uint64_t connection, const std::string& why);
  void start(Session& s);   // a new run of its task (connect, follow until Bye)
  void settle(Session& s);  // after its task ran: whether it ended, and how
  bool finished_locked() const;  // all_finished's, with mu_ held
  static Task<> serve(Session& s);

  StageHostOptions options_;
  StageHostHooks hooks_;
  Send send_;
  std::vector<std::unique_ptr<Executor>> executors_;
  mutable std::mutex mu_;  // the routes, the snapshot and the executors' busy time
  // A named party's session: its executor. A party holds its slot (of max_sessions) from its
  // first connection on, taken here under mu_, so two executors cannot both take the last.
  std::map<std::string, std::size_t> executor_of_;
  std::map<uint64_t, std::size_t> route_;                // a connection: its executor
  std::vector<SessionState> snapshot_;  // for sessions(), refreshed by the executors
};

}  // namespace tandem
