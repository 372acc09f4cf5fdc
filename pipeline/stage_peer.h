// One stage of a pipeline whose stages are parties on different machines: the protocol's
// state machine for that stage, free of transport. It faces an upstream link (the stage
// before, which sends Activations and takes Gradients) and a downstream link (the stage
// after), runs its schedule's actions for each step in order, waiting on a link only for
// what an action needs, and applies its optimizer once a step: the N stages together give
// the weights of whole-model training, as the in-process pipeline does. The first stage
// holds the data and announces each step with its Activations; the last holds the loss and
// reads the labels that travel with them. Everything a neighbour sends is verified and
// checked against the plan and the step before it is used; a message that fails is answered
// with an Error on that link, which then closes, and the run ends with an Error naming it.
#pragma once

#include <array>
#include "pipeline/coroutine.h"
#include <functional>
#include <optional>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/length_buckets.h"
#include "core/microbatch.h"
#include "core/wire/frame.h"
#include "core/wire/messages.h"
#include "pipeline/link_filter.h"
#include "pipeline/local_pipeline.h"
#include "pipeline/schedule.h"
#include "pipeline/stage.h"
#include "pipeline/task.h"

namespace tandem {

// A link to a neighbouring stage was lost (closed, silent, or the neighbour said the pipeline
// starts again): the host tears its links down, connects again and resumes from the newest
// checkpoint every stage has (StagePeer::connect). Other Errors end the run.
class LinkLost : public Error {
 public:
  using Error::Error;
};

// The stage after answered Busy (a cloud at its bound on sessions or memory): a lost link,
// to link again after a while.
class LinkBusy : public LinkLost {
 public:
  using LinkLost::LinkLost;
};

// The stage after could not be reached at all (StageLink::open gave up): after a run whose
// end this stage recorded, that party has ended too (StagePeer::set_ended).
class LinkUnreachable : public Error {
 public:
  using Error::Error;
};

// A link to a neighbouring stage, as a transport gives it (a TLS WebSocket in tandem stage,
// memory in tests).
class StageLink {
 public:
  virtual ~StageLink() = default;
  // Makes the connection, when this end makes it (the downstream link), before the first
  // send: a stage links down only once the stage before has linked to it. Throws
  // LinkUnreachable when the party there cannot be reached.
  virtual void open() {}
  virtual void send(std::span<const uint8_t> bytes) = 0;
  // The link's last message (Bye): sent, then the link closes once it is out.
  virtual void send_last(std::span<const uint8_t> bytes) { send(bytes); }
  // The neighbour's next message (raw: the peer verifies it); throws LinkLost naming
  // `awaiting` when the link closes or stays silent.
  virtual Frame receive(const char* awaiting) = 0;
  // Answers peer data that failed a check: sends Error{code, text} and closes the link.
  virtual void refuse(const WireError& error) = 0;
  // A link driven by events (pipeline/event_link.h) has a message, or has closed, only after
  // its host delivers one: ready() says whether receive() would answer now, and a peer that
  // must wait parks its task with resume_when_ready, which the delivery resumes. A link that
  // blocks in receive() is always ready.
  virtual bool ready() { return true; }
  virtual void resume_when_ready(co::coroutine_handle<> task);
  // The waiting task was destroyed (its host gave up on it): resume it no more.
  virtual void forget(co::coroutine_handle<> task) { (void)task; }
};

// What every stage of a pipeline agrees on, and which of them this one is.
struct StagePlan {
  uint32_t index = 0, stages = 1;
  std::array<uint8_t, 32> hash{};  // plan_hash(): the plan's shape, the same at every stage
  // SHA-256 of the run's other terms (run_terms: the optimizer's, the seed...), the same at
  // every stage unless own_terms; all zero: none.
  std::array<uint8_t, 32> terms{};
  // The whole plan: hash, terms, schedule, batch, K and dtype together (run_hash()), for what a
  // party keeps of this run (checkpoints, end records, its egress log): another run's is refused.
  std::array<uint8_t, 32> run{};
  uint32_t batch = 0, microbatches = 0;  // the most samples and micro-batches a step may have
  int32_t classes = 0;  // labels range over [0, classes)
  // Whether the first stage's mask input travels down the chain (a later stage reads it):
  // the first stage's input index, or -1; later stages get the width from mask_tokens.
  int mask_input = -1;
  int64_t mask_tokens = 0;
  // How activations and gradients travel (core/wire/tensor_codec.h): f32, or f16, bf16 or i8
  // to halve or quarter the bytes. The stage before offers its own in its StageHello; the
  // stage after takes it when it is one of `accepts` (empty: `dtype` alone), and both ends of
  // the link then use it both ways.
  wire::DType dtype = wire::DType::F32;
  std::vector<wire::DType> accepts;
  // A stage serving parties that each train a model of their own (later-stages = "own", a
  // cloud's sessions): the party before says its own terms. It may plan a smaller batch and
  // fewer micro-batches than this stage's (`batch` and `microbatches` are then the most it
  // takes) and other run terms (its optimizer is its own). Elsewhere every stage's are equal.
  bool own_terms = false;
  // Whether the labels travel down the chain with the activations. When not, the loss stage
  // runs where the data is (the first party's machine) and reads them there (labels_from):
  // no other party ever receives one.
  bool labels_travel = true;
  // Several first parties sharing the stages after the first (federation along the chain):
  // `members` first stages, each a party with its own data and its own weights, take turns,
  // member m leading the steps g with g mod members = m; the later stages train every step
  // in that one order, so a run and its restart from a checkpoint give the same weights. A
  // round is `members` steps, one a member; checkpoints are taken at rounds' ends. `member`
  // is which first stage this is (0 elsewhere).
  uint32_t members = 1, member = 0;
  // FedAvg of the members' first stages after every `average_every`-th round (0: never):
  // each member sends its weights to the shared stage (FrontWeights), which averages them,
  // each member counting once (they train as many steps), and sends the average back
  // (Aggregated) before any member trains on.
  uint32_t average_every = 0;
};

// Several first parties sharing the next stage (StagePlan::members, average_every).
struct FirstParties {
  uint32_t count = 1;
  uint32_t average_every = 0;  // rounds
};

// The plan's shape, what every stage of it shares whoever it serves: SHA-256 over the binary
// model spec and, each after a zero byte, the cut list, the number of stages, where the labels
// are and (when more than one) the first parties' number and averaging. StageHello carries it
// beside the terms it says one by one (the schedule, batch, K, dtypes, run_terms' hash).
std::array<uint8_t, 32> plan_hash(std::span<const uint8_t> spec_binary, const std::string& cuts, uint32_t stages,
                                  bool labels_travel = true, const FirstParties& first = {});
// The checks a stage of `plan` under `schedule` makes of the stage before's StageHello
// (`from_up`; from member `member` of a shared stage) or of the stage after's answer: ok, or
// the refusal naming what differs (the format, the plan, the schedule, the indices, batch and
// K, the run terms, a dtype it takes). A host checks a StageHello with it before it spends
// anything on the session.
WireError stage_hello_problem(const StagePlan& plan, const std::string& schedule, const wire::StageHello& h,
                              bool from_up, uint32_t member = 0);
// The link's dtype a stage of `plan` chooses: the first the stage before offers that it takes.
std::optional<wire::DType> choose_dtype(const StagePlan& plan, const wire::StageHello& h);
// StagePlan::run of a plan under `schedule`.
std::array<uint8_t, 32> run_hash(const StagePlan& plan, const std::string& schedule);
// What a stage of `plan` run under `schedule` says in its StageHello, proposing `resume_step`
// (a first stage also the steps of its epoch): offering the plan's dtype.
StageHelloFields stage_hello_fields(const StagePlan& plan, const std::string& schedule, uint64_t resume_step,
                                    uint64_t epoch_steps = 0);

// Stage `index`'s plan among `stages` (whole.partition(cut_list(cuts))), run under `schedule`
// with at most `batch` samples a step in at most `microbatches`; `members` first parties
// share the later stages (the host sets a first stage's `member`).
StagePlan make_stage_plan(std::span<const uint8_t> spec_binary, const Graph& whole, const std::string& cuts,
                          const std::vector<Graph>& stages, std::size_t index, const PipelineSchedule& schedule,
                          uint32_t batch, uint32_t microbatches, wire::DType dtype = wire::DType::F32,
                          bool labels_travel = true, const std::string& run_terms = "",
                          const FirstParties& first = {});

class StagePeer {
 public:
  // `upstream` is null on the first stage, `downstream` on the last; neither is owned. Under
  // the asynchronous schedule (AsyncStashSchedule) every stage but the last keeps one step in
  // flight: a step's backwards run during the next one, each on the weights its forward used
  // (stashed), and its update after them; the first stage ends it with drain() (Drain down the
  // chain) before an evaluation batch, a change of K and the run's end, and every stage backs
  // a checkpoint step up before it saves, so no checkpoint holds a step in flight.
  StagePeer(Stage& stage, const PipelineSchedule& schedule, const StagePlan& plan, StageLink* upstream,
            StageLink* downstream);
  // The stage after several first stages (a plan of members > 1): `members[m]` is the link to
  // member m. Each step comes from the member whose turn it is and its gradients go back to
  // it; an evaluation batch comes from the member whose turn it is too (its own weights
  // through the shared stages), and a member's Bye passes the turn on: once every member
  // has said Bye the run ends down the chain. A member that trains out of turn, or after
  // another has ended its run, is refused. The asynchronous schedule is refused (its step in
  // flight would cross members).
  StagePeer(Stage& stage, const PipelineSchedule& schedule, const StagePlan& plan,
            std::span<StageLink* const> members, StageLink* downstream);
  ~StagePeer();
  // Each call below that talks to the neighbours comes twice: a blocking one, for a host that
  // gives the peer a thread, and a task (`..._async`, pipeline/task.h) for a host driven by
  // events (a browser's event loop, one executor serving many sessions), which starts it and
  // delivers its links' messages until it is done. The two run the same code; a blocking call
  // on a link that waits for a delivery is an Error. A task's arguments (spans, labels, stats)
  // must outlive it, and a peer runs one task at a time.
  // An Error unless `schedule` can run across parties.
  static void check_schedule(const PipelineSchedule& schedule);
  StagePeer(const StagePeer&) = delete;
  StagePeer& operator=(const StagePeer&) = delete;

  // The links' handshake, down the chain and back: the step to start from. `checkpoints`
  // are the steps this stage has a checkpoint of (ascending; step 0, the initial weights,
  // always counts). The first stage proposes its newest; each stage takes the stage before's
  // proposal (StageHello: plan hash, index and format checked), proposes down the newest of
  // its own at or before it, and answers up what the stage after answered (the last stage:
  // its own). Every stage then holds a checkpoint of the returned step, which the host
  // restores before training on; next_step() is it.
  uint64_t connect(std::span<const uint64_t> checkpoints);
  Task<uint64_t> connect_async(std::span<const uint64_t> checkpoints);
  // This stage recorded the run's end at `step` (its host's end record, written in on_end or,
  // at the first stage, around finish; in an earlier process or this one), `acknowledged`
  // once the Bye came back from the stages after (they recorded theirs). connect() then finds
  // out whether every stage after it has ended too: the last stage has; a stage whose next
  // answers its StageHello with Bye has; and, after an acknowledged end only, one whose next
  // cannot be reached (LinkUnreachable: it ended and went away). If so ended() is true,
  // connect() returns `step`, the stages before are answered Bye, and nothing is trained.
  // Else the record is dropped and the run goes on from the newest checkpoint as after any
  // restart (the steps since are trained again, to the same weights). A stage without a
  // record is refused a Bye in answer to its StageHello.
  void set_ended(uint64_t step, bool acknowledged) {
    ended_step_ = step;
    end_acknowledged_ = acknowledged;
    next_step_ = step;  // until connect() says otherwise
  }
  bool ended() const { return ended_; }
  // Called when connect() finds the run goes on after this stage recorded its end, before the
  // stage before hears its StageHello: the host drops its end record.
  void on_resume(std::function<void()> drop) { resume_ = std::move(drop); }
  // A first stage facing a cloud (tandem-cloud serve): its name and, without a client
  // certificate, its enrolment token, said in its StageHello. next_token() is the fresh token
  // the cloud answered a token with (for the StageHello after a lost link; empty otherwise).
  void set_credentials(std::string client_id, std::string token) {
    client_id_ = std::move(client_id);
    token_ = std::move(token);
  }
  const std::string& next_token() const { return next_token_; }
  // The stage after a first party that came with a token: the token its answer carries.
  void set_answer_token(std::string token) { answer_token_ = std::move(token); }

  // A first stage: how many steps its epoch has, said in its StageHello; a stage shared by
  // several first stages refuses a member whose count differs from the others' (they take
  // turns, a step each).
  void set_epoch_steps(uint64_t steps) { epoch_steps_ = steps; }
  // For a host that runs many peers on one thread (pipeline/stage_host.h): work no neighbour
  // is waiting for (the weight gradients the zero-bubble schedule defers, the update) first
  // lets other peers' messages go: when `others_waiting()` says some wait, the task suspends
  // and `park` gets it, for the host to resume once nothing else waits (as tandem-cloud's
  // sessions run their deferred weight gradients while no message waits). None: it runs on.
  void defer_later_work(std::function<bool()> others_waiting, std::function<void(co::coroutine_handle<>)> park);
  // After a LinkLost: the step in flight is dropped (its deferred weight halves and
  // gradients), ready for connect() on new links.
  void reset();
  // A later stage, at the run's end (the stage before's Bye): `record(steps, false)` makes
  // this stage's end durable (its export, an end record) before Bye goes on down, and
  // `record(steps, true)` says the stages after have recorded theirs (their Bye came back; at
  // once at the last stage), before Bye goes up. What it throws, follow_step throws, and no
  // Bye goes on: the host tells the stage before (an Error, or Restart to train the last
  // steps again).
  void on_end(std::function<void(uint64_t steps, bool acknowledged)> record) { end_ = std::move(record); }
  // Called after the update of a step whose header asks for a checkpoint, with the step
  // count reached (next_step()): the host saves the stage's state there.
  void on_checkpoint(std::function<void(uint64_t)> save) { save_ = std::move(save); }
  // The loss stage of a plan whose labels do not travel: `labels(step)` gives the step's
  // labels, all of its samples in order, from the first party's data.
  void labels_from(std::function<std::span<const int32_t>(uint64_t step)> labels) { labels_ = std::move(labels); }
  // The loss stage of a plan whose labels do not travel, for evaluation batches: the labels
  // of the evaluation set's `count` samples from `begin` on, from the first party's data.
  void evaluation_labels_from(std::function<std::span<const int32_t>(uint64_t begin, uint32_t count)> labels) {
    evaluation_labels_ = std::move(labels);
  }
  // Filters on the links (pipeline/link_filter.h), not owned: the activations sent down pass
  // through `down` in order and their gradients back through it in reverse; the gradients
  // sent up pass through `up` in order. An Error where a link is missing, where a filter
  // that reads a whole step meets a schedule that backs a micro-batch up before the last is sent,
  // or under the asynchronous schedule (its two steps in flight would share a filter's state).
  void set_filters(std::vector<LinkFilter*> down, std::vector<LinkFilter*> up);
  // The stage after several first parties that average (StagePlan::average_every): the first
  // stage's parameters (names and shapes; the values are not read), which every member's
  // FrontWeights must match.
  void set_first_stage(const NamedTensors& params);


  // The first stage: one step of the step's rows (`inputs`, each [samples, ...], and their
  // labels) in header.microbatches micro-batches. Returns the loss and correct predictions
  // the loss stage reported for the steps backed up in this call: this one, or under the
  // asynchronous schedule the step before (none on the first), with this one too when it asks
  // for a checkpoint, and the one in flight first when K changes (it is drained).
  StepStats train_step(const StepHeader& header, std::span<const Tensor> inputs, const int32_t* labels);
  Task<StepStats> train_step_async(StepHeader header, std::span<const Tensor> inputs, const int32_t* labels);
  // The first stage, under the asynchronous schedule: the step in flight backed up at every
  // stage (Drain down the chain) and its update applied; returns its loss and correct count
  // (nothing when no step is in flight, and always under the other schedules).
  StepStats drain();
  Task<StepStats> drain_async();
  bool in_flight() const { return pending_; }
  // A member of several first parties that average, between rounds: its first stage averaged
  // with the others' now (FrontWeights down, the average back), when it trained since the
  // last average; every member calls it at the same round (the run's end). False when there
  // was nothing to average.
  bool average();
  Task<bool> average_async();
  uint32_t averages() const { return averages_; }  // the averages taken (counted from the start)
  // The first stage, between steps: one batch of the evaluation set (`inputs`, each
  // [samples, ...], at most the plan's batch; their labels; `begin`, its first sample's index
  // in the set) through every stage in evaluation mode. Nothing trains. Returns the loss and
  // correct predictions the loss stage reported.
  StepStats evaluate(std::span<const Tensor> inputs, const int32_t* labels, uint64_t begin);
  Task<StepStats> evaluate_async(std::span<const Tensor> inputs, const int32_t* labels, uint64_t begin);
  // A later stage: the next step or evaluation batch, as the stage before announces it (a Drain
  // on the way is passed on and run). False when the stage before ended the run: this stage's
  // on_end ran, its Bye went down the chain, every later stage recorded its end (their Bye
  // came back), and its Bye went up.
  bool follow_step(StepStats& stats);
  Task<bool> follow_step_async(StepStats& stats);
  // Whether what follow_step last ran was an evaluation batch.
  bool evaluated() const { return evaluated_; }
  // The first stage: the run is over; Bye goes down the chain, and it returns once Bye comes
  // back: every later stage has recorded its end (on_end). One of several first parties waits
  // too for every member to end its run. A link lost before throws LinkLost, and the run
  // starts again from the newest checkpoint (the steps since are trained again, to the same
  // weights), so a stage that crashed before recording its end loses nothing.
  void finish(const std::string& reason);
  Task<> finish_async(std::string reason);

  // The step this stage trains next: the first stage's own next (a member's next turn).
  uint64_t next_step() const { return next_step_; }
  // The steps this stage's party has led or trained: a member's count of its own turns.
  uint64_t own_steps() const { return first() ? next_step_ / plan_.members : next_step_; }
  uint64_t weight_version() const { return version_; }
  // Seconds waiting on a link for what an action needed, since construction.
  double idle_s() const { return idle_s_; }

 private:
  struct Slot;  // one micro-batch's messages
  std::function<bool()> others_waiting_;
  std::function<void(co::coroutine_handle<>)> park_;
  // co_await LaterWork{*this}: yields to other peers' messages when the host asks (above).
  struct LaterWork {
    StagePeer& peer;
    bool await_ready() const { return !peer.others_waiting_ || !peer.others_waiting_(); }
    void await_suspend(co::coroutine_handle<> task) const { peer.park_(task); }
    void await_resume() const {}
  };
  enum class Upstream { Activations, Drain, Bye, Averaged };  // what the stage before sent
  bool first() const { return plan_.index == 0; }
  bool shared() const { return plan_.index == 1 && plan_.members > 1; }  // after several first stages
  // The step a checkpoint after step `step` is labelled with: the end of its round (members
  // keep their weights from their turn to the round's end).
  uint64_t checkpoint_label(uint64_t step) const { return (step / plan_.members + 1) * plan_.members; }
  // The shared stage: the step an evaluation batch from the member whose turn it is names
  // (that member's next), and the one it passes down as (this stage's next).
  uint64_t turn_step() const {
    return next_step_ + (turn_ + plan_.members - next_step_ % plan_.members) % plan_.members;
  }
  StepHeader down_header(const StepHeader& h) const;
  void pass_turn();  // the shared stage: to the next member still in the run
  // Whether the round of `step` ends with an average (at a member: after its turn in it; at
  // the shared stage: after the round's last step).
  bool average_due(uint64_t step) const;
  Task<> send_average(bool final);  // a member: FrontWeights down, the average back
  // The shared stage: every member's FrontWeights (member 0's already in `first`, when it
  // came unasked at the run's end), averaged, and the average to each.
  Task<> collect_average(Frame first, bool final);
  NamedTensors first_params_;     // the shared stage: the first stage's names and shapes
  std::vector<Tensor> average_;   // the shared stage: the average's storage
  uint32_t averages_ = 0;         // averages taken since step 0
  uint64_t epoch_steps_ = 0;      // a first stage's, for its StageHello
  uint64_t since_average_ = 0;    // a member: samples trained since the last average
  bool trained_since_average_ = false;
  bool last() const { return plan_.index + 1 == plan_.stages; }
  // The slot (and network slot) of a step's micro-batch: asynchronous steps alternate between
  // two sets, so the step in flight keeps its own while the next one forwards.
  uint32_t slot_of(uint64_t step, uint32_t mb) const {
    return async_ ? static_cast<uint32_t>(step & 1) * plan_.microbatches + mb : mb;
  }
  Task<> run_step(const StepHeader& header, std::span<const Tensor> first_inputs, const int32_t* first_labels,
                  StepStats& stats);
  // Waits for a slot's Activations (from upstream) or Gradients (from downstream).
  Task<Slot*> activations(uint32_t slot);
  Task<Slot*> gradients(uint32_t slot);
  // Reads one message from the stage before: Activations into their slot, a Drain or Bye.
  Task<Upstream> take_from_upstream(const char* awaiting);
  Task<> take_from_downstream(const char* awaiting);
  Task<> end_acknowledged(const char* awaiting);  // the Bye back from the stage after
  Task<> end_run();  // a later stage, at the stage before's Bye

  [[noreturn]] void refuse(StageLink& link, const char* neighbour, WireError error);
  const wire::Message* verified(StageLink& link, const char* neighbour, const Frame& frame);
  // A StageHello from the stage before (member `member` of it) or, `from_up` false, after.
  const wire::StageHello& hello_from(StageLink& link, const char* neighbour, const Frame& frame, bool from_up,
                                     uint32_t member = 0);
  bool check_header(const wire::Activations& a, WireError& error);
  WireError label_range_error(const int32_t* labels, int64_t count) const;
  bool check_activations(const Frame& frame, const wire::Activations& a, Slot& slot, WireError& error);

  Stage& stage_;
  const PipelineSchedule& schedule_;
  StagePlan plan_;
  // The links' dtypes, chosen at connect: the stage after's answer (down), and this stage's
  // choice among the stage before's offer (up; every member of a shared stage must offer it).
  wire::DType down_dtype_ = wire::DType::F32, up_dtype_ = wire::DType::F32;
  std::string client_id_, token_, next_token_, answer_token_;  // set_credentials, set_answer_token
  StageHelloFields hello_fields(uint64_t resume_step) const;  // what this stage says
  void check_answer(const wire::StageHello& h);  // the stage after's: the dtype chosen
  StageLink *up_, *down_;  // up_: the shared stage's, the member whose turn it is
  std::vector<StageLink*> members_;  // the shared stage: a link a member
  uint32_t turn_ = 0;                // the shared stage: the member whose turn it is
  std::vector<bool> gone_;           // the shared stage: members that have said Bye
  bool any_gone_ = false;
  MessageWriter writer_;
  uint64_t next_step_ = 0, version_ = 0;
  StepHeader header_;       // the step in flight
  bool in_step_ = false;    // header_ is fixed (its first Activations arrived)
  std::vector<Slot> slots_;
  std::vector<PipelineAction> actions_;
  int actions_k_ = 0;
  std::vector<LengthCut> cuts_;  // the first stage: per micro-batch, its inputs at their length bucket
  std::vector<Tensor> in_;
  double idle_s_ = 0;
  std::function<void(uint64_t)> save_;
  std::function<void(uint64_t, bool)> end_;
  std::function<void()> resume_;
  std::optional<uint64_t> ended_step_;  // set_ended
  bool end_acknowledged_ = false;
  bool ended_ = false;                  // connect found the run ended here and after
  std::function<std::span<const int32_t>(uint64_t)> labels_;
  std::function<std::span<const int32_t>(uint64_t, uint32_t)> evaluation_labels_;
  bool evaluated_ = false;
  Task<> run_evaluation(const StepHeader& header, std::span<const Tensor> first_inputs, const int32_t* first_labels,
                        StepStats& stats);
  std::vector<LinkFilter*> down_filters_, up_filters_;
  bool hides_loss_ = false;  // an up filter keeps the loss and correct count here
  bool whole_step_ = false;  // a down filter reads the whole step
  int64_t step_length_ = -2;  // the first stage: the step's bucket (-1: none) for whole_step_, -2 per micro-batch
  void check_whole_step(int k) const;
  static void clear(Slot& slot);
  void clear_slots(uint64_t step);  // the step's slots; their frames go back to the pool
  void update(float lr_scale);  // the optimizer at a learning-rate scale
  void add_stats(const StepHeader& header, StepStats& stats) const;
  Task<> back_up(const PipelineAction& a, const StepHeader& h, uint32_t slot);
  Task<> drain_pending(StepStats& stats, float lr_scale);
  Task<StepStats> drain_at(float lr_scale);  // the first stage: Drain down, then drain_pending
  float drain_lr_scale_ = 1.0f;        // a later stage: the last Drain's
  bool async_ = false;         // the asynchronous schedule at a stage before the last: a step in flight
  bool pending_ = false;       // its backwards wait for the next step (or a drain)
  StepHeader pending_header_;  // that step
  std::vector<std::vector<Tensor>> owned_;  // the first stage, asynchronous: per slot, its inputs copied
  Tensor backward_twice(const Tensor& noised, const Tensor& exact, int slot);
  std::vector<Tensor> kept_grads_;
  Tensor noised_up_;
  struct ForwardInputs {
    std::span<const Tensor> in;
    const int32_t* labels = nullptr;
    const Tensor* mask = nullptr;
  };
  Task<ForwardInputs> inputs_of(uint32_t slot, MicrobatchRange range, std::span<const Tensor> first_inputs,
                                const int32_t* first_labels);  // the step's messages dropped, their frames back to the pool
};

}  // namespace tandem
