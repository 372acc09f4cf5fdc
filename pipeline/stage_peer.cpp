#include "pipeline/stage_peer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "core/error.h"
#include "core/federated_average.h"
#include "core/flatbuffer_read.h"
#include "core/microbatch.h"
#include "core/sha256.h"
#include "core/wire/tensor_codec.h"

namespace tandem {

using Kind = PipelineAction::Kind;

namespace {

constexpr float kMaxLrScale = 100.0f;  // a schedule's factor; beyond this is a bug or an attack

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A link's next message, awaited: at once on a link that blocks in receive(); on a link
// driven by events, once it is delivered (the awaiting tasks suspend until then).
// A task destroyed while it waits (a host gives up on it) is taken off the link.
class LinkMessage {
 public:
  LinkMessage(StageLink& link, const char* awaiting) : link_(link), awaiting_(awaiting) {}
  LinkMessage(const LinkMessage&) = delete;
  LinkMessage& operator=(const LinkMessage&) = delete;
  ~LinkMessage() {
    if (parked_) link_.forget(parked_);
  }
  bool await_ready() { return link_.ready(); }
  void await_suspend(co::coroutine_handle<> task) {
    link_.resume_when_ready(task);
    parked_ = task;
  }
  Frame await_resume() {
    parked_ = {};
    return link_.receive(awaiting_);
  }

 private:
  StageLink& link_;
  const char* awaiting_;
  co::coroutine_handle<> parked_;
};
LinkMessage message(StageLink& link, const char* awaiting) { return {link, awaiting}; }

// The blocking calls: the task runs to its end within start() (every receive waits in place).
template <class T>
T run_blocking(Task<T> task, const char* call) {
  task.start();
  if (!task.done())
    fail("stage", cat(call, " waits on a link driven by events: drive the peer with ", call, "_async and deliver "
                      "the link's messages"));
  return task.result();
}

}  // namespace

void StageLink::resume_when_ready(co::coroutine_handle<>) {
  fail("stage", "a link that blocks in receive() is always ready; one driven by events overrides resume_when_ready");
}

void StagePeer::defer_later_work(std::function<bool()> others_waiting,
                                 std::function<void(co::coroutine_handle<>)> park) {
  others_waiting_ = std::move(others_waiting);
  park_ = std::move(park);
}

uint64_t StagePeer::connect(std::span<const uint64_t> checkpoints) {
  return run_blocking(connect_async(checkpoints), "connect");
}
StepStats StagePeer::train_step(const StepHeader& header, std::span<const Tensor> inputs, const int32_t* labels) {
  return run_blocking(train_step_async(header, inputs, labels), "train_step");
}
StepStats StagePeer::drain() { return run_blocking(drain_async(), "drain"); }
bool StagePeer::average() { return run_blocking(average_async(), "average"); }
StepStats StagePeer::evaluate(std::span<const Tensor> inputs, const int32_t* labels, uint64_t begin) {
  return run_blocking(evaluate_async(inputs, labels, begin), "evaluate");
}
bool StagePeer::follow_step(StepStats& stats) { return run_blocking(follow_step_async(stats), "follow_step"); }
void StagePeer::finish(const std::string& reason) { run_blocking(finish_async(reason), "finish"); }

std::array<uint8_t, 32> plan_hash(std::span<const uint8_t> spec_binary, const std::string& cuts, uint32_t stages,
                                  bool labels_travel, const FirstParties& first) {
  Sha256 h;
  h.update(spec_binary.data(), spec_binary.size());
  std::string rest = cat('\0', cuts, '\0', stages);
  if (!labels_travel) rest += cat('\0', "labels stay at the first party");
  if (first.count > 1) rest += cat('\0', first.count, " first parties");
  if (first.average_every > 0) rest += cat('\0', "averaged every ", first.average_every, " rounds");
  h.update(reinterpret_cast<const uint8_t*>(rest.data()), rest.size());
  return h.finish();
}

std::array<uint8_t, 32> run_hash(const StagePlan& plan, const std::string& schedule) {
  Sha256 h;
  h.update(plan.hash.data(), plan.hash.size());
  h.update(plan.terms.data(), plan.terms.size());
  const std::string rest = cat('\0', schedule, '\0', plan.batch, '\0', plan.microbatches, '\0', dtype_name(plan.dtype));
  h.update(reinterpret_cast<const uint8_t*>(rest.data()), rest.size());
  return h.finish();
}

StagePlan make_stage_plan(std::span<const uint8_t> spec_binary, const Graph& whole, const std::string& cuts,
                          const std::vector<Graph>& stages, std::size_t index, const PipelineSchedule& schedule,
                          uint32_t batch, uint32_t microbatches, wire::DType dtype, bool labels_travel,
                          const std::string& run_terms, const FirstParties& first) {
  StagePlan plan;
  plan.index = static_cast<uint32_t>(index);
  plan.stages = static_cast<uint32_t>(stages.size());
  plan.members = first.count;
  plan.average_every = first.count > 1 ? first.average_every : 0;
  plan.hash = plan_hash(spec_binary, cuts, plan.stages, labels_travel, first);
  if (!run_terms.empty()) {
    Sha256 t;
    t.update(reinterpret_cast<const uint8_t*>(run_terms.data()), run_terms.size());
    plan.terms = t.finish();
  }
  plan.dtype = dtype;
  plan.labels_travel = labels_travel;
  plan.batch = batch;
  plan.microbatches = microbatches;
  plan.classes = static_cast<int32_t>(whole.classes());
  plan.run = run_hash(plan, schedule.name());
  for (std::size_t s = 1; s < stages.size(); ++s)  // a later stage that reads the mask: it travels from the first
    if (stages[s].inputs().size() > 1)
      for (std::size_t k = 0; k < whole.inputs().size(); ++k)
        if (whole.inputs()[k].name == stages[s].inputs()[1].name) {
          plan.mask_input = static_cast<int>(k);
          plan.mask_tokens = whole.inputs()[k].shape.numel();
        }
  return plan;
}

// One micro-batch of the step in flight: what arrived for it, kept (with the frame its
// tensors are views of) until the step ends.
struct StagePeer::Slot {
  bool activations = false, gradients = false;
  bool sent = false;  // this stage's output went down: its gradient may come back
  Frame act_frame, grad_frame;
  std::vector<Tensor> inputs;  // the stage's inputs: the activations, and the mask when it reads one
  Tensor decoded, grad_decoded;  // activations and gradients decoded from a dtype other than f32
  Tensor mask;                 // the mask as it travels on, [count, length]
  std::vector<int32_t> labels;
  Tensor grad;                 // the gradient of this stage's output
  float loss = 0;
  uint32_t correct = 0;
};

StagePeer::StagePeer(Stage& stage, const PipelineSchedule& schedule, const StagePlan& plan, StageLink* upstream,
                     StageLink* downstream)
    : StagePeer(stage, schedule, plan, std::span<StageLink* const>(&upstream, upstream ? 1 : 0), downstream) {}

StagePeer::StagePeer(Stage& stage, const PipelineSchedule& schedule, const StagePlan& plan,
                     std::span<StageLink* const> members, StageLink* downstream)
    : stage_(stage), schedule_(schedule), plan_(plan), up_(members.empty() ? nullptr : members[0]), down_(downstream),
      members_(members.begin(), members.end()) {
  check_schedule(schedule);
  if (plan.stages < 2 || plan.index >= plan.stages)
    fail("stage", cat("stage ", plan.index, " of ", plan.stages, ": a pipeline across parties has two stages or more"));
  if (plan.members < 1 || (first() && plan.member >= plan.members) || (!first() && plan.member != 0))
    fail("stage", cat("member ", plan.member, " of ", plan.members, " first parties at stage ", plan.index));
  if (plan.members > 1 && schedule.asynchronous())
    fail("stage", cat("the async schedule keeps a step in flight, and with ", plan.members, " first parties taking "
                      "turns it would cross members: use gpipe, 1f1b or zero-bubble"));
  const std::size_t ups = first() ? 0 : shared() ? plan.members : 1;
  if (members_.size() != ups || std::find(members_.begin(), members_.end(), nullptr) != members_.end() ||
      (down_ == nullptr) != last())
    fail("stage", cat("stage ", plan.index, " of ", plan.stages, " needs ", ups, " upstream link", ups == 1 ? "" : "s",
                      " and ", last() ? "no" : "a", " downstream link"));
  gone_.assign(plan.members, false);
  if (plan.microbatches < 1 || plan.batch < plan.microbatches)
    fail("stage", cat("a plan of ", plan.microbatches, " micro-batches in a batch of ", plan.batch));
  async_ = schedule.asynchronous() && !last();
  const std::size_t slots = async_ ? 2 * plan.microbatches : plan.microbatches;
  slots_.resize(slots);
  cuts_.resize(slots);
  if (async_ && first()) owned_.resize(slots);
  if (first()) stage.network().set_input_gradient(false);  // the data: no gradient
}

StagePeer::~StagePeer() = default;

WireError StagePeer::label_range_error(const int32_t* labels, int64_t count) const {
  for (int64_t i = 0; i < count; ++i)
    if (labels[i] < 0 || labels[i] >= plan_.classes)
      return {wire::ErrorCode::BadTensor, cat("label ", labels[i], " is outside [0, ", plan_.classes, ")")};
  return {};
}

void StagePeer::check_schedule(const PipelineSchedule& schedule) {
  // Every schedule of pipeline/schedule.h runs across parties: the asynchronous one drains
  // its step in flight with Drain.
  (void)simulate(schedule, 2, 1);  // an order that would leave a stage waiting is refused by name
}

void StagePeer::refuse(StageLink& link, const char* neighbour, WireError error) {
  link.refuse(error);
  fail("stage", cat("stage ", plan_.index, " refused the ", neighbour, " stage's message: ", error.text));
}

const wire::Message* StagePeer::verified(StageLink& link, const char* neighbour, const Frame& frame) {
  WireError error;
  const wire::Message* msg = verify_frame(frame, frame.size(), error);
  if (msg == nullptr) refuse(link, neighbour, error);
  if (msg->payload_type() == wire::Payload::Error) {
    const wire::Error* e = msg->payload_as_Error();
    if (e->code() == wire::ErrorCode::Busy)
      throw LinkBusy(cat("[stage] the ", neighbour, " stage is busy: ", e->text() ? e->text()->str() : ""));
    if (e->code() == wire::ErrorCode::Restart)
      throw LinkLost(cat("[stage] the ", neighbour, " stage starts again from the newest checkpoint: ",
                         e->text() ? e->text()->str() : ""));
    fail("stage", cat("the ", neighbour, " stage ended the run: ", e->text() ? e->text()->str() : "(no reason given)"));
  }
  if (msg->format() != kWireFormat)
    refuse(link, neighbour, {wire::ErrorCode::ProtocolVersion, cat("a message in wire format ", msg->format(),
                                                                    "; this stage speaks ", kWireFormat,
                                                                    ": run the same tandem version at every stage")});
  return msg;
}

WireError stage_hello_problem(const StagePlan& plan, const std::string& schedule, const wire::StageHello& h,
                              bool from_up, uint32_t member) {
  const char* neighbour = from_up ? "previous" : "next";
  if (h.format() != kWireFormat)
    return {wire::ErrorCode::ProtocolVersion, cat("wire format ", h.format(), "; this stage speaks ", kWireFormat)};
  if (!h.plan_hash() || h.plan_hash()->size() != plan.hash.size() ||
      !std::equal(plan.hash.begin(), plan.hash.end(), h.plan_hash()->begin()))
    return {wire::ErrorCode::ModelMismatch,
            cat("the ", neighbour, " stage runs another plan (its model spec, cut list, number of stages, where the "
                "labels are or first parties differ from stage ", plan.index, "'s): give every party the same "
                "deployment")};
  const std::string said = h.schedule() ? h.schedule()->str() : std::string();
  if (said != schedule)
    return {wire::ErrorCode::ModelMismatch, cat("the ", neighbour, " stage runs the '", said, "' schedule and stage ",
                                                plan.index, " the '", schedule,
                                                "' one: give every party the same pipeline-schedule")};
  const uint32_t want = from_up ? plan.index - 1 : plan.index + 1;
  if (h.stage() != want || h.stages() != plan.stages)
    return {wire::ErrorCode::ModelMismatch,
            cat("stage ", h.stage(), " of ", h.stages(), " linked to stage ", plan.index, " of ", plan.stages)};
  if (h.member() != member)
    return {wire::ErrorCode::ModelMismatch,
            cat("the first party on the link of member ", member, " of ", plan.members, " says it is member ",
                h.member(), ": give each first party its own place in the deployment")};
  if (!from_up) return {};
  const std::string says = cat("the previous stage plans steps of at most ", h.batch(), " samples in ",
                               h.microbatches(), " micro-batches");
  if (h.microbatches() < 1 || h.batch() < h.microbatches())
    return {wire::ErrorCode::ModelMismatch, cat(says, ": not a plan")};
  if (plan.own_terms ? h.batch() > plan.batch || h.microbatches() > plan.microbatches
                     : h.batch() != plan.batch || h.microbatches() != plan.microbatches)
    return {wire::ErrorCode::ModelMismatch,
            cat(says, ", and stage ", plan.index, plan.own_terms ? " takes at most " : " ", plan.batch, " in ",
                plan.microbatches,
                plan.own_terms ? ": plan a smaller batch or fewer micro-batches"
                               : ": give every party the same batch and microbatches")};
  std::array<uint8_t, 32> terms{};
  if (h.terms_hash() && h.terms_hash()->size() == terms.size())
    std::copy(h.terms_hash()->begin(), h.terms_hash()->end(), terms.begin());
  if (!plan.own_terms && terms != plan.terms)
    return {wire::ErrorCode::ModelMismatch,
            cat("the previous stage's run terms (the optimizer's, the seed, the epochs, the data's extent, the privacy "
                "filters or checkpoint-every) differ from stage ", plan.index, "'s: give every party the same "
                "deployment")};
  const bool shared = plan.index == 1 && plan.members > 1;
  if (shared && h.resume_step() % plan.members != 0)
    return {wire::ErrorCode::NoCheckpoint, cat("member ", member, " proposes step ", h.resume_step(),
                                               ", not the end of a round of ", plan.members, " steps")};
  if (!choose_dtype(plan, h)) {
    std::string offered, taken;
    if (h.dtypes())
      for (wire::DType d : *h.dtypes()) offered += cat(offered.empty() ? "" : ", ", dtype_name(d));
    for (wire::DType d : plan.accepts.empty() ? std::vector<wire::DType>{plan.dtype} : plan.accepts)
      taken += cat(taken.empty() ? "" : ", ", dtype_name(d));
    return {wire::ErrorCode::ModelMismatch,
            cat("the previous stage sends ", offered.empty() ? std::string("no dtype") : offered, " and stage ",
                plan.index, " takes ", taken,
                plan.own_terms ? ": offer one of those" : ": give every party the same wire-dtype")};
  }
  return {};
}

std::optional<wire::DType> choose_dtype(const StagePlan& plan, const wire::StageHello& h) {
  const std::vector<wire::DType> takes = plan.accepts.empty() ? std::vector<wire::DType>{plan.dtype} : plan.accepts;
  if (h.dtypes())
    for (wire::DType d : *h.dtypes())
      if (std::find(takes.begin(), takes.end(), d) != takes.end()) return d;
  return std::nullopt;
}

const wire::StageHello& StagePeer::hello_from(StageLink& link, const char* neighbour, const Frame& frame,
                                              bool from_up, uint32_t member) {
  const wire::Message* msg = verified(link, neighbour, frame);
  const wire::StageHello* h = msg->payload_as_StageHello();
  if (h == nullptr)
    refuse(link, neighbour, {wire::ErrorCode::UnexpectedMessage,
                             cat("expected StageHello, got ", payload_name(msg->payload_type()))});
  if (const WireError no = stage_hello_problem(plan_, schedule_.name(), *h, from_up, member); !no.ok())
    refuse(link, neighbour, no);
  return *h;
}

StageHelloFields stage_hello_fields(const StagePlan& plan, const std::string& schedule, uint64_t resume_step,
                                    uint64_t epoch_steps) {
  StageHelloFields f;
  f.plan_hash = plan.hash;
  f.stage = plan.index;
  f.stages = plan.stages;
  f.resume_step = resume_step;
  f.member = plan.member;
  f.epoch_steps = epoch_steps;
  f.schedule = schedule;
  f.batch = plan.batch;
  f.microbatches = plan.microbatches;
  f.dtypes = {plan.dtype};
  f.terms = plan.terms;
  return f;
}

StageHelloFields StagePeer::hello_fields(uint64_t resume_step) const {
  StageHelloFields f = stage_hello_fields(plan_, schedule_.name(), resume_step, first() ? epoch_steps_ : 0);
  f.client_id = client_id_;
  f.token = token_;
  f.ended = ended_step_;
  return f;
}

void StagePeer::check_answer(const wire::StageHello& h) {
  if (!h.dtypes() || h.dtypes()->size() != 1 || h.dtypes()->Get(0) != plan_.dtype)
    refuse(*down_, "next", {wire::ErrorCode::ModelMismatch,
                            cat("the stage after did not choose the dtype stage ", plan_.index, " offered (",
                                dtype_name(plan_.dtype), ") for their link")});
  down_dtype_ = h.dtypes()->Get(0);
  next_token_ = h.next_token() ? h.next_token()->str() : std::string();
}

Task<uint64_t> StagePeer::connect_async(std::span<const uint64_t> checkpoints) {
  // The newest step at or before `limit` that this stage can start from.
  const auto newest_by = [&](uint64_t limit) {
    uint64_t best = 0;
    for (uint64_t s : checkpoints)
      if (s <= limit) best = std::max(best, s);
    return best;
  };
  const auto have = [&](uint64_t step) {
    return step == 0 || std::find(checkpoints.begin(), checkpoints.end(), step) != checkpoints.end();
  };
  uint64_t proposal = UINT64_MAX;
  uint64_t epoch_steps = 0;  // the first member's that said
  uint32_t said = 0;
  for (uint32_t m = 0; m < members_.size(); ++m) {  // every member's, at a shared stage: the oldest
    const Frame frame = co_await message(*members_[m], "StageHello");
    const wire::StageHello& h = hello_from(*members_[m], "previous", frame, true, shared() ? m : 0);
    // The link's dtype: the first of the stage before's offer that this stage takes (there is
    // one: hello_from checked), the same for every member.
    const wire::DType chosen = *choose_dtype(plan_, h);
    if (m > 0 && chosen != up_dtype_)
      refuse(*members_[m], "previous",
             {wire::ErrorCode::ModelMismatch, cat("member ", m, " sends ", dtype_name(chosen), " and member 0 ",
                                                  dtype_name(up_dtype_), ": give every first party the same wire-dtype")});
    up_dtype_ = chosen;
    proposal = std::min(proposal, h.resume_step());
    if (!shared() || h.epoch_steps() == 0) continue;
    if (epoch_steps == 0) {
      epoch_steps = h.epoch_steps();
      said = m;
    } else if (h.epoch_steps() != epoch_steps) {
      refuse(*members_[m], "previous",
             {wire::ErrorCode::ModelMismatch,
              cat("member ", m, " trains ", h.epoch_steps(), " steps an epoch and member ", said, " ", epoch_steps,
                  ": the first parties take turns, a step each, so each needs as many (give them as many samples: "
                  "limit in their sections)")});
    }
  }
  uint64_t start = newest_by(proposal);
  ended_ = last() && ended_step_.has_value();  // the last stage's end is the run's
  if (!last()) {
    Frame answer_frame;
    bool reached = true;
    try {
      down_->open();
    } catch (const LinkUnreachable&) {
      if (!ended_step_ || !end_acknowledged_) throw;  // it may be down before recording its end
      reached = false;  // the party after ended its run and went away
    }
    ended_ = !reached;
    if (reached) {
      down_->send(writer_.stage_hello(hello_fields(start)));
      answer_frame = co_await message(*down_, "StageHello");
      ended_ = verified(*down_, "next", answer_frame)->payload_type() == wire::Payload::Bye;
      if (ended_ && !ended_step_)
        refuse(*down_, "next", {wire::ErrorCode::UnexpectedMessage,
                                cat("the stages after have ended the run, but stage ", plan_.index,
                                    " has no record of its end: start every party again from empty checkpoint-dirs")});
    }
    if (!ended_) {
      const wire::StageHello& h = hello_from(*down_, "next", answer_frame, false);
      check_answer(h);
      const uint64_t answer = h.resume_step();
      if (answer > start || !have(answer))
        refuse(*down_, "next", {wire::ErrorCode::NoCheckpoint,
                                cat("the stage after answered step ", answer, " to start from; stage ", plan_.index,
                                    " proposed ", start, " and has no checkpoint of it")});
      start = answer;
    }
  }
  if (!ended_ && ended_step_) {  // the run goes on: a record of its end is superseded
    ended_step_.reset();
    if (resume_) resume_();
  }
  if (ended_) {
    for (StageLink* up : members_)
      up->send_last(writer_.bye(cat("the run ended at step ", *ended_step_, " at stage ", plan_.index,
                                    " and every stage after it")));
    next_step_ = *ended_step_;
    co_return *ended_step_;
  }
  for (StageLink* up : members_) {
    StageHelloFields answer = stage_hello_fields(plan_, schedule_.name(), start);
    answer.dtypes = {up_dtype_};
    answer.next_token = answer_token_;
    up->send(writer_.stage_hello(answer));
  }
  // A member trains its own turns: the first of the round `start` begins.
  next_step_ = first() ? start + plan_.member : start;
  version_ = first() ? start / plan_.members : start;  // the updates the restored weights have had
  turn_ = 0;
  up_ = first() ? nullptr : members_[0];
  gone_.assign(plan_.members, false);
  any_gone_ = false;
  // The averages taken before `start` (a round's end), as the run that made its checkpoints
  // counted them; whether a member trained since the last one.
  const uint64_t rounds = start / plan_.members;
  averages_ = plan_.average_every > 0 ? static_cast<uint32_t>(rounds / plan_.average_every) : 0;
  trained_since_average_ = plan_.average_every > 0 && rounds % plan_.average_every != 0;
  since_average_ = 0;
  co_return start;
}

void StagePeer::reset() {
  stage_.reset();
  for (LinkFilter* f : down_filters_) f->reset();
  for (LinkFilter* f : up_filters_) f->reset();
  in_step_ = false;
  pending_ = false;  // the asynchronous step in flight is dropped with the step
  for (Slot& s : slots_) clear(s);
}

void StagePeer::clear(Slot& s) {
  s.activations = s.gradients = s.sent = false;
  s.act_frame = s.grad_frame = Frame();
  s.inputs.clear();
  s.grad = Tensor();
  s.loss = 0;
  s.correct = 0;
}

void StagePeer::clear_slots(uint64_t step) {
  for (uint32_t mb = 0; mb < plan_.microbatches; ++mb) clear(slots_[slot_of(step, mb)]);
}

bool StagePeer::check_header(const wire::Activations& a, WireError& error) {
  const StepHeader h{a.step(),       a.step_samples(), a.step_microbatches(), a.lr_scale(), a.checkpoint(),
                     a.evaluation(), a.evaluation_begin()};
  if (in_step_) {
    if (h == header_) return true;
    error = {wire::ErrorCode::BadTensor, cat("step ", header_.step, " changed its size, learning-rate scale, "
                                             "checkpoint or evaluation flag between micro-batches")};
    return false;
  }
  if (shared() && !h.evaluation && any_gone_) {
    error = {wire::ErrorCode::OutOfWindow, cat("member ", turn_, " sent step ", h.step, " after another first party "
                                               "ended its run: the members train the same number of steps (give each "
                                               "as many samples)")};
    return false;
  }
  const uint64_t expected = shared() && h.evaluation ? turn_step() : next_step_;
  if (h.step != expected) {
    error = {wire::ErrorCode::OutOfWindow,
             cat(h.evaluation ? "an evaluation batch before step " : "activations of step ", h.step, " while stage ",
                 plan_.index, " trains step ", expected, " next",
                 shared() ? cat(" (member ", turn_, "'s turn of ", plan_.members, ")") : std::string())};
    return false;
  }
  if (shared() && h.checkpoint && h.step % plan_.members != plan_.members - 1) {
    error = {wire::ErrorCode::BadTensor, cat("step ", h.step, " asks for a checkpoint within a round: the last member "
                                             "of ", plan_.members, " asks for it, at the round's end")};
    return false;
  }
  if (h.samples < 1 || h.samples > plan_.batch || h.microbatches < 1 || h.microbatches > plan_.microbatches ||
      h.microbatches > h.samples) {
    error = {wire::ErrorCode::BadTensor, cat("step ", h.step, " announces ", h.samples, " samples in ", h.microbatches,
                                             " micro-batches (plan: batch ", plan_.batch, ", ", plan_.microbatches,
                                             " micro-batches)")};
    return false;
  }
  if (pending_ && (h.evaluation || h.microbatches != pending_header_.microbatches)) {
    error = {wire::ErrorCode::OutOfWindow,
             cat(h.evaluation ? std::string("an evaluation batch") : cat("step ", h.step, " with K = ", h.microbatches),
                 " while step ", pending_header_.step, "'s backwards (K = ", pending_header_.microbatches,
                 ") are in flight: the first stage sends Drain first")};
    return false;
  }
  if (h.evaluation && h.checkpoint) {
    error = {wire::ErrorCode::BadTensor, cat("an evaluation batch before step ", h.step, " asks for a checkpoint: "
                                             "nothing trains in one")};
    return false;
  }
  if (h.checkpoint && !save_) {
    error = {wire::ErrorCode::NoCheckpoint, cat("step ", h.step, " asks every stage for a checkpoint; stage ",
                                                plan_.index, " keeps none (give its party a checkpoint-dir)")};
    return false;
  }
  if (!(h.lr_scale >= 0.0f && h.lr_scale <= kMaxLrScale)) {
    error = {wire::ErrorCode::BadTensor, cat("step ", h.step, " asks for a learning-rate scale of ", h.lr_scale,
                                             ", outside [0, ", kMaxLrScale, "]")};
    return false;
  }
  header_ = h;
  in_step_ = true;
  return true;
}

bool StagePeer::check_activations(const Frame& frame, const wire::Activations& a, Slot& slot, WireError& error) {
  const int64_t count = microbatch_range(header_.samples, header_.microbatches, a.microbatch()).count;
  if (!plan_.labels_travel) {
    if (a.labels() != nullptr && a.labels()->size() > 0) {
      error = {wire::ErrorCode::BadTensor, "labels arrived, and in this plan they never leave the first party"};
      return false;
    }
  } else if (!check_labels(a.labels(), count, plan_.classes, error)) {
    return false;
  }
  // With length buckets a micro-batch runs at its own length: the activations' second
  // dimension, which must be a bucket; the mask travels at that length too.
  const Graph& graph = stage_.graph();
  const GraphInput& cut = graph.inputs()[0];
  const wire::TensorMsg* t = a.tensor();
  int64_t length = -1;
  if (cut.tokens && t && t->shape() && t->shape()->size() >= 2) {
    length = int64_at(*t->shape(), 1);
    const auto& buckets = graph.length_buckets();
    if (std::find(buckets.begin(), buckets.end(), length) == buckets.end()) {
      error = {wire::ErrorCode::BadTensor, cat("activations of ", length, " tokens: this model runs sequences at its "
                                               "length buckets ", graph.buckets_text(), " only")};
      return false;
    }
  }
  const int64_t mask_tokens = plan_.mask_input >= 0 ? (length > 0 ? length : plan_.mask_tokens) : 0;
  if (!read_mask(a.mask(), count, mask_tokens, slot.mask, error)) return false;
  slot.inputs.clear();
  slot.inputs.push_back(read_tensor(frame, t, Graph::at_length(cut.shape, cut.tokens, length).batched(count),
                                    "activations", up_dtype_, slot.decoded, error));
  if (!slot.inputs[0].defined()) return false;
  if (graph.inputs().size() > 1) slot.inputs.push_back(slot.mask);
  if (plan_.labels_travel) slot.labels.assign(a.labels()->begin(), a.labels()->end());
  return true;
}

Task<StagePeer::Upstream> StagePeer::take_from_upstream(const char* awaiting) {
  const auto t0 = std::chrono::steady_clock::now();
  Frame frame = co_await message(*up_, awaiting);
  idle_s_ += since(t0);
  const wire::Message* msg = verified(*up_, "previous", frame);
  if (msg->payload_type() == wire::Payload::Bye) {
    if (in_step_)
      refuse(*up_, "previous", {wire::ErrorCode::UnexpectedMessage,
                                cat("Bye within step ", header_.step, ": a run ends between steps")});
    if (pending_)
      refuse(*up_, "previous", {wire::ErrorCode::UnexpectedMessage,
                                cat("Bye while step ", pending_header_.step, "'s backwards are in flight: the first "
                                    "stage sends Drain before it ends the run")});
    if (shared()) {  // that member is done; the run ends once every member is
      gone_[turn_] = true;
      any_gone_ = true;
      if (std::find(gone_.begin(), gone_.end(), false) != gone_.end()) {
        pass_turn();
        co_return co_await take_from_upstream(awaiting);
      }
    }
    co_return Upstream::Bye;
  }
  if (msg->payload_type() == wire::Payload::FrontWeights) {  // the members' average at the run's end
    std::string wrong;
    if (!shared() || plan_.average_every == 0)
      wrong = "FrontWeights in a plan whose first stages are not averaged";
    else if (in_step_)
      wrong = cat("FrontWeights within step ", header_.step, ": the first stages are averaged between rounds");
    else if (next_step_ % plan_.members != 0 || turn_ != 0 || any_gone_)
      wrong = cat("FrontWeights from member ", turn_, " within round ", next_step_ / plan_.members,
                  ": the first stages are averaged between rounds, after the last member's step");
    else if ((next_step_ / plan_.members) % plan_.average_every == 0)
      wrong = cat("FrontWeights after round ", next_step_ / plan_.members,
                  ": nothing was trained since the last average");
    if (!wrong.empty()) refuse(*up_, "previous", {wire::ErrorCode::UnexpectedMessage, wrong});
    co_await collect_average(std::move(frame), true);
    co_return Upstream::Averaged;
  }
  if (const wire::Drain* d = msg->payload_as_Drain()) {
    // The step in flight: at a stage before the last, the one whose backwards are pending;
    // at the last (which backs each step up at once), the step it ran last.
    std::string wrong;
    if (!schedule_.asynchronous())
      wrong = cat("Drain in a plan whose ", schedule_.name(), " schedule keeps no step in flight");
    else if (in_step_)
      wrong = cat("Drain within step ", header_.step, ": a step in flight drains between steps");
    else if (d->stage() + 1 != plan_.index)
      wrong = cat("Drain named stage ", d->stage(), " reached stage ", plan_.index);
    else if (async_ ? !pending_ || d->step() != pending_header_.step : next_step_ == 0 || d->step() != next_step_ - 1)
      wrong = cat("Drain of step ", d->step(), " reached stage ", plan_.index, ", whose step in flight is ",
                  async_ ? (pending_ ? cat(pending_header_.step) : std::string("none"))
                         : (next_step_ > 0 ? cat(next_step_ - 1) : std::string("none")));
    if (!wrong.empty()) refuse(*up_, "previous", {wire::ErrorCode::UnexpectedMessage, wrong});
    if (!(d->lr_scale() >= 0.0f && d->lr_scale() <= kMaxLrScale))
      refuse(*up_, "previous", {wire::ErrorCode::BadTensor, cat("Drain of step ", d->step(), " asks for a learning-rate "
                                                                "scale of ", d->lr_scale(), ", outside [0, ", kMaxLrScale, "]")});
    drain_lr_scale_ = d->lr_scale();
    co_return Upstream::Drain;
  }
  const wire::Activations* a = msg->payload_as_Activations();
  if (a == nullptr)
    refuse(*up_, "previous", {wire::ErrorCode::UnexpectedMessage,
                              cat("expected Activations, got ", payload_name(msg->payload_type()))});
  WireError error;
  if (a->stage() + 1 != plan_.index)
    refuse(*up_, "previous", {wire::ErrorCode::UnexpectedMessage,
                              cat("activations named stage ", a->stage(), " reached stage ", plan_.index)});
  if (!check_header(*a, error)) refuse(*up_, "previous", error);
  if (!check_window(a->step(), a->microbatch(), header_.step, header_.microbatches, error))
    refuse(*up_, "previous", error);
  Slot& slot = slots_[slot_of(a->step(), a->microbatch())];
  if (slot.activations)
    refuse(*up_, "previous", {wire::ErrorCode::OutOfWindow, cat("micro-batch ", a->microbatch(), " of step ",
                                                                header_.step, " arrived twice")});
  if (!check_activations(frame, *a, slot, error)) refuse(*up_, "previous", error);
  slot.act_frame = std::move(frame);
  slot.activations = true;
  co_return Upstream::Activations;
}

Task<> StagePeer::take_from_downstream(const char* awaiting) {
  const auto t0 = std::chrono::steady_clock::now();
  Frame frame = co_await message(*down_, awaiting);
  idle_s_ += since(t0);
  const wire::Message* msg = verified(*down_, "next", frame);
  const StepHeader& h = async_ && !header_.evaluation ? pending_header_ : header_;  // the step backed up now
  const wire::Payload expected = h.evaluation ? wire::Payload::Evaluated : wire::Payload::Gradients;
  if (msg->payload_type() != expected)
    refuse(*down_, "next", {wire::ErrorCode::UnexpectedMessage, cat("expected ", payload_name(expected), ", got ",
                                                                    payload_name(msg->payload_type()))});
  WireError error;
  if (const wire::Evaluated* e = msg->payload_as_Evaluated()) {
    if (e->stage() != plan_.index + 1)
      refuse(*down_, "next", {wire::ErrorCode::UnexpectedMessage,
                              cat("an evaluation result named stage ", e->stage(), " reached stage ", plan_.index)});
    if (!check_window(e->step(), e->microbatch(), down_header(h).step, h.microbatches, error))
      refuse(*down_, "next", error);
    Slot& slot = slots_[slot_of(h.step, e->microbatch())];
    if (!slot.sent || slot.gradients)
      refuse(*down_, "next", {wire::ErrorCode::OutOfWindow, cat("an evaluation result of micro-batch ", e->microbatch(),
                                                                " that was not awaited")});
    const int64_t count = microbatch_range(h.samples, h.microbatches, e->microbatch()).count;
    if (!std::isfinite(e->loss()) || e->correct() > count)
      refuse(*down_, "next", {wire::ErrorCode::BadTensor, cat("evaluation micro-batch ", e->microbatch(), "'s loss ",
                                                              e->loss(), " or correct count ", e->correct(),
                                                              " is impossible")});
    slot.loss = e->loss();
    slot.correct = e->correct();
    slot.gradients = true;
    co_return;
  }
  const wire::Gradients* g = msg->payload_as_Gradients();
  if (g->stage() != plan_.index + 1)
    refuse(*down_, "next", {wire::ErrorCode::UnexpectedMessage,
                            cat("gradients named stage ", g->stage(), " reached stage ", plan_.index)});
  if (!check_window(g->step(), g->microbatch(), h.step, h.microbatches, error)) refuse(*down_, "next", error);
  const uint32_t index = slot_of(h.step, g->microbatch());
  Slot& slot = slots_[index];
  if (!slot.sent || slot.gradients)  // a gradient of an output this stage has not sent, or twice
    refuse(*down_, "next", {wire::ErrorCode::OutOfWindow, cat("a gradient of micro-batch ", g->microbatch(),
                                                              " of step ", h.step, " that was not awaited")});
  const int64_t count = microbatch_range(h.samples, h.microbatches, g->microbatch()).count;
  if (!std::isfinite(g->loss()) || g->correct() > count)
    refuse(*down_, "next", {wire::ErrorCode::BadTensor, cat("micro-batch ", g->microbatch(), "'s loss ", g->loss(),
                                                            " or correct count ", g->correct(), " is impossible")});
  slot.grad = read_tensor(frame, g->tensor(), stage_.network().output(static_cast<int>(index)).shape(),
                          "gradients", down_dtype_, slot.grad_decoded, error);
  if (!slot.grad.defined()) refuse(*down_, "next", error);
  slot.loss = g->loss();
  slot.correct = g->correct();
  slot.grad_frame = std::move(frame);
  slot.gradients = true;
}

Task<StagePeer::Slot*> StagePeer::activations(uint32_t slot) {
  while (!slots_[slot].activations) {
    const Upstream got = co_await take_from_upstream("activations");
    if (got != Upstream::Activations)
      refuse(*up_, "previous", {wire::ErrorCode::UnexpectedMessage,
                                cat("Drain within step ", header_.step, ": a step in flight drains between steps")});
  }
  co_return &slots_[slot];
}

Task<StagePeer::Slot*> StagePeer::gradients(uint32_t slot) {
  while (!slots_[slot].gradients) co_await take_from_downstream("gradients");
  co_return &slots_[slot];
}

void StagePeer::set_filters(std::vector<LinkFilter*> down, std::vector<LinkFilter*> up) {
  if (!down.empty() && down_ == nullptr)
    fail("stage", cat("stage ", plan_.index, " is the last: it sends nothing down for ", down[0]->name(), " to filter"));
  if (!up.empty() && up_ == nullptr)
    fail("stage", cat("stage ", plan_.index, " is the first: it sends nothing up for ", up[0]->name(), " to filter"));
  if (schedule_.asynchronous() && (!down.empty() || !up.empty()))
    fail("stage", cat((down.empty() ? up : down)[0]->name(), " keeps one step's state per micro-batch; the async schedule "
                      "has two steps in flight: use gpipe or 1f1b with filters on the links"));
  down_filters_ = std::move(down);
  up_filters_ = std::move(up);
  hides_loss_ = std::any_of(up_filters_.begin(), up_filters_.end(), [](LinkFilter* f) { return f->hides_loss(); });
  whole_step_ = std::any_of(down_filters_.begin(), down_filters_.end(), [](LinkFilter* f) { return f->needs_whole_step(); });
  for (int k = 1; k <= static_cast<int>(plan_.microbatches); ++k) check_whole_step(k);
  for (LinkFilter* f : up_filters_) {
    if (!f->backs_up_twice()) continue;
    if (!last()) fail("stage", cat(f->name(), " is the loss stage's; stage ", plan_.index, " is not the last"));
    if (schedule_.name() == std::string("zero-bubble"))
      fail("stage", cat(f->name(), " backs the loss stage up whole, twice; the zero-bubble schedule splits its "
                        "backward (input gradients first): use gpipe or 1f1b"));
  }
}

void StagePeer::check_whole_step(int k) const {
  if (!whole_step_) return;
  const auto whole = std::find_if(down_filters_.begin(), down_filters_.end(),
                                  [](LinkFilter* f) { return f->needs_whole_step(); });
  int forwards = 0;
  for (const PipelineAction& a : schedule_.actions(static_cast<int>(plan_.index), static_cast<int>(plan_.stages), k)) {
    if (a.kind == Kind::Forward) ++forwards;
    else if (forwards < k)
      fail("stage", cat((*whole)->name(), " reads a whole step's activations before the first gradient comes back; the ",
                        schedule_.name(), " schedule backs micro-batch ", a.microbatch, " up at stage ", plan_.index,
                        " before its last is sent: use the gpipe schedule"));
  }
}

// The loss stage with label noise: the gradient sent up from `noised`, the weights' from
// `exact` (the noisy pass runs first and its weight gradients are put back).
Tensor StagePeer::backward_twice(const Tensor& noised, const Tensor& exact, int slot) {
  const std::vector<Param*>& params = stage_.network().params();
  if (kept_grads_.size() != params.size()) kept_grads_.resize(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& g = params[i]->grad();
    sized(kept_grads_[i], g.shape()).copy_from(g);
  }
  const Tensor up = stage_.backward(noised, slot, true);
  sized(noised_up_, up.shape()).copy_from(up);  // the backward's own buffer is reused by the next one
  for (std::size_t i = 0; i < params.size(); ++i) params[i]->grad().copy_from(kept_grads_[i]);
  stage_.backward(exact, slot, false);
  return noised_up_;
}

// A micro-batch's inputs, labels and mask in `slot`: the first stage's rows at their length
// bucket (copied under the asynchronous schedule: the caller refills its batch before the
// backward, a step later, reads them), or the slot's Activations, awaited.
Task<StagePeer::ForwardInputs> StagePeer::inputs_of(uint32_t slot, MicrobatchRange range,
                                                    std::span<const Tensor> first_inputs,
                                                    const int32_t* first_labels) {
  ForwardInputs f;
  if (first()) {
    in_.clear();
    for (std::size_t k = 0; k < first_inputs.size(); ++k) {
      Tensor rows = first_inputs[k].slice_batch(range.begin, range.count);
      if (async_) {
        std::vector<Tensor>& owned = owned_[slot];
        if (owned.size() <= k) owned.resize(k + 1);
        sized(owned[k], rows.shape()).copy_from(rows);
        rows = owned[k];
      }
      in_.push_back(rows);
    }
    if (step_length_ >= -1)
      cut_to_length(stage_.graph(), in_, step_length_, cuts_[slot]);  // the step's bucket, for a whole-step filter
    else
      fit_to_bucket(stage_.graph(), in_, cuts_[slot]);
    f.in = cuts_[slot].inputs;
    f.labels = first_labels + range.begin;
    if (plan_.mask_input >= 0) f.mask = &cuts_[slot].inputs[static_cast<std::size_t>(plan_.mask_input)];
    slots_[slot].activations = true;
    co_return f;
  }
  Slot* const got = co_await activations(slot);
  const Slot& s = *got;
  f.in = s.inputs;
  f.labels = s.labels.data();
  if (plan_.mask_input >= 0) f.mask = &s.mask;
  co_return f;
}

Task<> StagePeer::run_step(const StepHeader& header, std::span<const Tensor> first_inputs,
                           const int32_t* first_labels, StepStats& stats) {
  if (header.evaluation) {
    step_length_ = -2;
    co_await run_evaluation(header, first_inputs, first_labels, stats);
    co_return;
  }
  const int k = static_cast<int>(header.microbatches);
  if (k != actions_k_) {
    actions_ = schedule_.actions(static_cast<int>(plan_.index), static_cast<int>(plan_.stages), k);
    actions_k_ = k;
    check_whole_step(k);
  }
  // A filter that reads the whole step (NoPeek) sees every micro-batch at the step's bucket.
  step_length_ = first() && whole_step_ ? bucket_for(stage_.graph(), first_inputs) : -2;
  for (LinkFilter* f : down_filters_) f->begin_step(first_inputs, header.samples, header.microbatches);
  stage_.zero_grad();
  const float scale = 1.0f / static_cast<float>(header.samples);
  for (const PipelineAction& a : actions_) {
    if (a.step < 0 && !pending_) continue;  // the first step, or the first after a drain: its forwards alone
    const auto mb = static_cast<uint32_t>(a.microbatch);
    const StepHeader& h = a.step < 0 ? pending_header_ : header;
    const uint32_t slot = slot_of(h.step, mb);
    const auto slot_index = static_cast<int>(slot);
    stage_.use_stash(a.step < 0);  // the step before's backward runs on the weights its forward used
    if (a.kind != Kind::Forward) {
      if (a.kind == Kind::BackwardWeight) co_await LaterWork{*this};  // nobody waits for it
      co_await back_up(a, h, slot);
      continue;
    }
    const MicrobatchRange range = microbatch_range(header.samples, header.microbatches, a.microbatch);
    auto [in, labels, mask] = co_await inputs_of(slot, range, first_inputs, first_labels);
    if (!first()) {
      if (last() && !plan_.labels_travel) {  // the first party's own labels, where its data is
        if (!labels_) fail("stage", "the loss stage of a plan whose labels stay at the first party has no labels");
        const std::span<const int32_t> step_labels = labels_(header.step);
        if (step_labels.size() != header.samples)
          fail("stage", cat("the data gives ", step_labels.size(), " labels for step ", header.step, "; the first "
                            "party announced ", header.samples, " samples: give both the same data, limit and seed"));
        labels = step_labels.data() + range.begin;
        const WireError bad = label_range_error(labels, range.count);
        if (!bad.ok()) fail("stage", bad.text);
      }
    }
    if (last()) {
      const Stage::LossPass pass = stage_.forward_loss(in, slot_index, labels, scale);
      if (!pass.finite)
        fail("stage", cat("the loss of micro-batch ", mb, " of step ", header.step,
                          " is not finite: lower the learning rate (--lr)"));
      slots_[slot].loss = static_cast<float>(pass.loss);
      slots_[slot].correct = static_cast<uint32_t>(pass.correct);
      slots_[slot].gradients = true;
    } else {
      const Tensor& out = stage_.forward(in, slot_index);
      const std::span<const int32_t> sent_labels =
          plan_.labels_travel ? std::span<const int32_t>(labels, static_cast<std::size_t>(range.count))
                              : std::span<const int32_t>();
      const Tensor* sent = &out;
      for (LinkFilter* f : down_filters_) sent = &f->activations_out(*sent, mb, range.begin);
      down_->send(writer_.activations(down_header(header), plan_.index, mb, version_, *sent, sent_labels, mask,
                                      down_dtype_));
      slots_[slot].sent = true;
    }
  }
  next_step_ = header.step + (first() ? plan_.members : 1);  // a member's next turn
  in_step_ = false;
  if (shared()) {
    turn_ = static_cast<uint32_t>(next_step_ % plan_.members);
    up_ = members_[turn_];
  }
  if (!async_) {
    add_stats(header, stats);
    co_await LaterWork{*this};  // the next step's activations wait for it, no neighbour
    update(header.lr_scale);
    clear_slots(header.step);  // the frames go back to their pool
  } else {
    // The weights this step's forwards used, kept for their backwards in the next step; the
    // update applies the step before's gradients (none on the first step, or after a drain).
    stage_.use_stash(false);
    stage_.stash_weights();
    if (pending_) {
      add_stats(pending_header_, stats);
      update(header.lr_scale);
      clear_slots(pending_header_.step);
    }
    pending_header_ = header;
    pending_ = true;
    // A checkpoint holds no step in flight: every stage backs this one up now, before it saves
    // (an uninterrupted run does the same, so a restart from it gives the same weights).
    if (header.checkpoint) co_await drain_pending(stats, header.lr_scale);
  }
  if (first() && plan_.members > 1) {
    since_average_ += header.samples;
    trained_since_average_ = true;
  }
  if (first() && average_due(header.step)) co_await send_average(false);  // a checkpoint holds the average
  if (header.checkpoint && save_) save_(first() ? checkpoint_label(header.step) : next_step_);
  if (shared() && average_due(header.step)) co_await collect_average(Frame(), false);
}

bool StagePeer::average_due(uint64_t step) const {
  if (plan_.average_every == 0 || plan_.members < 2 || !(first() || shared())) return false;
  if (shared() && step % plan_.members != plan_.members - 1) return false;  // within the round
  return (step / plan_.members + 1) % plan_.average_every == 0;
}

void StagePeer::set_first_stage(const NamedTensors& params) {
  first_params_.clear();
  average_.clear();
  for (const auto& [name, t] : params) {
    first_params_.emplace_back(name, Tensor::zeros(t.shape()));
    average_.push_back(Tensor::zeros(t.shape()));
  }
}

Task<bool> StagePeer::average_async() {
  if (!first() || plan_.members < 2 || plan_.average_every == 0)
    fail("stage", "average() is for a first party of several whose first stages are averaged (first-parties, "
                  "average-every)");
  if (pending_ || in_step_) fail("stage", "average() runs between steps");
  if (!trained_since_average_) co_return false;
  co_await send_average(true);
  co_return true;
}

Task<> StagePeer::send_average(bool final) {
  NamedTensors mine;
  const std::vector<Param*>& params = stage_.network().params();
  for (Param* p : params) mine.emplace_back(p->name(), p->value());
  down_->send(writer_.front_weights(averages_, since_average_, mine, final));
  const auto t0 = std::chrono::steady_clock::now();
  const Frame frame = co_await message(*down_, "the average of the first stages");
  idle_s_ += since(t0);
  const wire::Message* msg = verified(*down_, "next", frame);
  const wire::Aggregated* a = msg->payload_as_Aggregated();
  if (a == nullptr)
    refuse(*down_, "next", {wire::ErrorCode::UnexpectedMessage,
                            cat("expected Aggregated, got ", payload_name(msg->payload_type()))});
  if (a->round() != averages_ + 1 || a->edges() != plan_.members)
    refuse(*down_, "next", {wire::ErrorCode::OutOfWindow,
                            cat("average ", a->round(), " of ", a->edges(), " first parties; member ", plan_.member,
                                " awaits average ", averages_ + 1, " of ", plan_.members)});
  std::vector<Tensor> values;
  WireError error;
  if (!read_named_tensors(frame, a->tensors(), mine, values, error)) refuse(*down_, "next", error);
  for (std::size_t i = 0; i < values.size(); ++i) {
    params[i]->value().copy_from(values[i]);
    params[i]->bump_version();
  }
  ++averages_;
  since_average_ = 0;
  trained_since_average_ = false;
}

Task<> StagePeer::collect_average(Frame first, bool final) {
  if (first_params_.empty())
    fail("stage", cat("stage ", plan_.index, " averages ", plan_.members, " first stages and was not given their "
                      "parameters (set_first_stage)"));
  const uint64_t round = next_step_ / plan_.members;
  std::vector<Frame> frames(plan_.members);
  std::vector<std::vector<Tensor>> parts(plan_.members);
  uint64_t samples = 0;
  for (uint32_t m = 0; m < plan_.members; ++m) {
    StageLink& link = *members_[m];
    Frame frame;
    if (m == 0 && first.size() > 0) {
      frame = std::move(first);
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      frame = co_await message(link, "FrontWeights");
      idle_s_ += since(t0);
    }
    const wire::Message* msg = verified(link, "previous", frame);
    const wire::FrontWeights* w = msg->payload_as_FrontWeights();
    if (w == nullptr)
      refuse(link, "previous", {wire::ErrorCode::UnexpectedMessage,
                                cat("expected member ", m, "'s FrontWeights after round ", round, ", got ",
                                    payload_name(msg->payload_type()))});
    if (w->round() != averages_ || w->final() != final)
      refuse(link, "previous", {wire::ErrorCode::OutOfWindow,
                                cat("member ", m, "'s FrontWeights ", w->final() ? "at its run's end" : "between rounds",
                                    " from average ", w->round(), "; stage ", plan_.index, " takes the ",
                                    final ? "run's last" : "rounds'", " average ", averages_ + 1, " after round ", round)});
    const uint64_t rounds_since = round - static_cast<uint64_t>(averages_) * plan_.average_every;
    if (w->samples() > static_cast<uint64_t>(plan_.batch) * rounds_since)
      refuse(link, "previous", {wire::ErrorCode::BadTensor,
                                cat("member ", m, " reports ", w->samples(), " samples since the last average; ",
                                    rounds_since, " rounds of at most ", plan_.batch, " have run since")});
    WireError error;
    if (!read_named_tensors(frame, w->tensors(), first_params_, parts[m], error)) refuse(link, "previous", error);
    samples += w->samples();
    frames[m] = std::move(frame);  // parts[m] are views of it
  }
  // Each member once: they train as many steps between averages (equal weights).
  std::vector<const std::vector<Tensor>*> in;
  for (const std::vector<Tensor>& p : parts) in.push_back(&p);
  const std::vector<uint64_t> equal(plan_.members, 0);
  federated_average(in, equal, average_);
  ++averages_;
  NamedTensors named;
  for (std::size_t k = 0; k < average_.size(); ++k) named.emplace_back(first_params_[k].first, average_[k]);
  const std::span<const uint8_t> bytes = writer_.aggregated(averages_, plan_.members, samples, named);
  for (StageLink* link : members_) link->send(bytes);
}

StepHeader StagePeer::down_header(const StepHeader& h) const {
  StepHeader d = h;
  if (shared() && h.evaluation) d.step = next_step_;  // the members' evaluation batches, in this stage's count
  // Within a round only the last member asks the later stages for a checkpoint; the others
  // keep theirs at the round's end (their weights do not change until their next turn).
  if (first() && plan_.member + 1 < plan_.members) d.checkpoint = false;
  return d;
}

void StagePeer::pass_turn() {
  for (uint32_t i = 1; i <= plan_.members; ++i) {
    const uint32_t m = (turn_ + i) % plan_.members;
    if (!gone_[m]) {
      turn_ = m;
      up_ = members_[m];
      return;
    }
  }
}

void StagePeer::update(float lr_scale) {
  if (stage_.optimizer() != nullptr) stage_.optimizer()->set_lr_scale(lr_scale);
  stage_.step();
  ++version_;
}

void StagePeer::add_stats(const StepHeader& header, StepStats& stats) const {
  for (uint32_t mb = 0; mb < header.microbatches; ++mb) {
    const Slot& s = slots_[slot_of(header.step, mb)];
    stats.loss_sum += s.loss;
    stats.correct += s.correct;
  }
  stats.samples += header.samples;
}

// Micro-batch a.microbatch's backward (whole, or its input half) in `slot`, of step `h`: from
// the loss's gradient on the last stage, else from the next stage's Gradients; its input
// gradient goes up.
Task<> StagePeer::back_up(const PipelineAction& a, const StepHeader& h, uint32_t slot) {
  const auto mb = static_cast<uint32_t>(a.microbatch);
  const auto slot_index = static_cast<int>(slot);
  if (a.kind == Kind::BackwardWeight) {
    stage_.backward_weights(slot_index);
    co_return;
  }
  const MicrobatchRange range = microbatch_range(h.samples, h.microbatches, a.microbatch);
  const Tensor* grad_out = &stage_.output_grad(slot_index);
  if (!last()) {
    Slot* s = co_await gradients(slot);
    grad_out = &s->grad;
  }
  for (auto f = down_filters_.rbegin(); f != down_filters_.rend(); ++f)
    grad_out = &(*f)->gradient_in(*grad_out, mb, range.begin);
  const Tensor* noised = nullptr;  // a loss gradient of the up filters' for the gradient sent up
  if (last())
    for (LinkFilter* f : up_filters_)
      if (const Tensor* n = f->loss_gradient_up(*grad_out, mb, h.samples)) noised = n;
  const Tensor g = noised ? backward_twice(*noised, *grad_out, slot_index)
                          : stage_.backward(*grad_out, slot_index, !first(), a.kind == Kind::BackwardInput);
  if (first()) co_return;
  const Tensor* up = &g;
  for (LinkFilter* f : up_filters_) up = &f->gradient_out(*up, mb, h.samples);
  up_->send(writer_.gradients(plan_.index, h.step, mb, version_, *up, hides_loss_ ? 0.0f : slots_[slot].loss,
                              hides_loss_ ? 0 : slots_[slot].correct, up_dtype_));
}

// The asynchronous schedule's step in flight, backed up now on the weights its forwards used
// (the backwards the next step would have run, in its order), then the update.
Task<> StagePeer::drain_pending(StepStats& stats, float lr_scale) {
  if (!pending_) co_return;
  const StepHeader h = pending_header_;
  stage_.zero_grad();
  stage_.use_stash(true);
  for (const PipelineAction& a :
       schedule_.actions(static_cast<int>(plan_.index), static_cast<int>(plan_.stages), static_cast<int>(h.microbatches)))
    if (a.step < 0) co_await back_up(a, h, slot_of(h.step, static_cast<uint32_t>(a.microbatch)));
  stage_.use_stash(false);
  add_stats(h, stats);
  update(lr_scale);
  clear_slots(h.step);
  pending_ = false;
}

Task<StepStats> StagePeer::drain_async() {
  if (!first()) fail("stage", "drain is the first stage's; a later stage drains when Drain arrives (follow_step)");
  if (!pending_) co_return StepStats{};
  co_return co_await drain_at(pending_header_.lr_scale);
}

Task<StepStats> StagePeer::drain_at(float lr_scale) {
  StepStats stats;
  down_->send(writer_.drain(plan_.index, pending_header_.step, lr_scale));
  co_await drain_pending(stats, lr_scale);
  co_return stats;
}

// An evaluation batch: every micro-batch forward in evaluation mode and down; the loss stage
// answers each with Evaluated, which every stage passes up. Nothing trains.
Task<> StagePeer::run_evaluation(const StepHeader& header, std::span<const Tensor> first_inputs,
                                 const int32_t* first_labels, StepStats& stats) {
  for (uint32_t mb = 0; mb < header.microbatches; ++mb) {
    const MicrobatchRange range = microbatch_range(header.samples, header.microbatches, static_cast<int>(mb));
    const uint32_t slot = slot_of(header.step, mb);
    auto [in, labels, mask] = co_await inputs_of(slot, range, first_inputs, first_labels);
    const Tensor& out = stage_.evaluate(in, static_cast<int>(slot));
    if (!last()) {
      const Tensor* sent = &out;
      for (LinkFilter* f : down_filters_) sent = &f->evaluation_out(*sent, mb);
      const std::span<const int32_t> sent_labels =
          plan_.labels_travel ? std::span<const int32_t>(labels, static_cast<std::size_t>(range.count))
                              : std::span<const int32_t>();
      down_->send(writer_.activations(down_header(header), plan_.index, mb, version_, *sent, sent_labels, mask,
                                      down_dtype_));
      slots_[slot].sent = true;
      continue;
    }
    if (!plan_.labels_travel) {  // the first party's own evaluation labels, where its data is
      if (!evaluation_labels_) fail("stage", "the loss stage of a plan whose labels stay at the first party has no "
                                             "evaluation labels");
      const std::span<const int32_t> own =
          evaluation_labels_(header.evaluation_begin + static_cast<uint64_t>(range.begin), static_cast<uint32_t>(range.count));
      if (own.size() != static_cast<std::size_t>(range.count))
        refuse(*up_, "previous",
               {wire::ErrorCode::OutOfWindow,
                cat("an evaluation batch from sample ", header.evaluation_begin, " of ", header.samples,
                    " samples: the evaluation set here has no labels for samples ",
                    header.evaluation_begin + static_cast<uint64_t>(range.begin), " to ",
                    header.evaluation_begin + static_cast<uint64_t>(range.begin + range.count) - 1,
                    " (give both processes of the first party the same data and test-limit)")});
      labels = own.data();
    }
    if (const WireError bad = label_range_error(labels, range.count); !bad.ok()) fail("stage", bad.text);
    const double loss = stage_.loss(out, labels, 1.0f, nullptr);
    if (!std::isfinite(loss))
      fail("stage", cat("the evaluation loss of micro-batch ", mb, " before step ", header.step, " is not finite"));
    slots_[slot].loss = static_cast<float>(loss);
    slots_[slot].correct = static_cast<uint32_t>(stage_.correct(out, labels));
    slots_[slot].gradients = true;
    up_->send(writer_.evaluated(plan_.index, header.step, mb, hides_loss_ ? 0.0f : slots_[slot].loss,
                                hides_loss_ ? 0 : slots_[slot].correct));
  }
  for (uint32_t mb = 0; mb < header.microbatches; ++mb) {
    const uint32_t slot = slot_of(header.step, mb);
    const Slot* got = &slots_[slot];
    if (!last()) got = co_await gradients(slot);
    const Slot& s = *got;
    if (!last() && !first()) up_->send(writer_.evaluated(plan_.index, header.step, mb, s.loss, s.correct));
    stats.loss_sum += s.loss;
    stats.correct += s.correct;
  }
  stats.samples = header.samples;
  in_step_ = false;
  clear_slots(header.step);
}

Task<StepStats> StagePeer::evaluate_async(std::span<const Tensor> inputs, const int32_t* labels, uint64_t begin) {
  if (!first()) fail("stage", "evaluate is the first stage's; a later stage follows (follow_step)");
  const auto samples = static_cast<uint32_t>(inputs.empty() ? 0 : inputs[0].shape()[0]);
  if (samples < 1 || samples > plan_.batch)
    fail("stage", cat("an evaluation batch of ", samples, " samples (plan: batch ", plan_.batch, ")"));
  if (pending_) fail("stage", cat("step ", pending_header_.step, " is in flight: drain() before an evaluation batch"));
  header_ = StepHeader{next_step_, samples, std::min(plan_.microbatches, samples), 1.0f, false, true, begin};
  in_step_ = true;
  StepStats stats;
  co_await run_step(header_, inputs, labels, stats);
  co_return stats;
}

Task<StepStats> StagePeer::train_step_async(StepHeader header, std::span<const Tensor> inputs,
                                            const int32_t* labels) {
  if (!first()) fail("stage", "train_step is the first stage's; a later stage follows its steps (follow_step)");
  if (header.step != next_step_)
    fail("stage", cat("step ", header.step, " after step ", next_step_ - 1, ": steps are trained in order"));
  if (header.evaluation) fail("stage", "train_step trains; an evaluation batch is evaluate()'s");
  if (inputs.empty() || header.samples != inputs[0].shape()[0] || header.microbatches < 1 ||
      header.microbatches > plan_.microbatches || header.samples > plan_.batch || header.microbatches > header.samples)
    fail("stage", cat("a step of ", header.samples, " samples in ", header.microbatches, " micro-batches (plan: batch ",
                      plan_.batch, ", ", plan_.microbatches, " micro-batches)"));
  StepStats stats;
  // The slots follow K: the step in flight drains first, its update at this step's scale (as
  // one process, whose learning-rate scale is set before the step, applies it).
  if (pending_ && pending_header_.microbatches != header.microbatches) stats = co_await drain_at(header.lr_scale);
  header_ = header;
  in_step_ = true;
  co_await run_step(header, inputs, labels, stats);
  co_return stats;
}

Task<bool> StagePeer::follow_step_async(StepStats& stats) {
  if (first()) fail("stage", "the first stage leads its steps (train_step)");
  stats = StepStats{};
  for (;;) {
    const Upstream got = co_await take_from_upstream("activations of the next step");
    if (got == Upstream::Bye) {
      co_await end_run();
      co_return false;
    }
    if (got == Upstream::Activations) break;
    if (got == Upstream::Averaged) continue;
    if (down_ != nullptr)  // on down first: its gradients come back
      down_->send(writer_.drain(plan_.index, pending_header_.step, drain_lr_scale_));
    StepStats drained;
    co_await drain_pending(drained, drain_lr_scale_);
  }
  evaluated_ = header_.evaluation;
  co_await run_step(header_, {}, nullptr, stats);
  co_return true;
}

Task<> StagePeer::finish_async(std::string reason) {
  if (!first()) fail("stage", "the first stage ends the run");
  if (pending_) fail("stage", cat("step ", pending_header_.step, " is in flight: drain() before finish()"));
  // The run is over once every later stage has recorded its end: their Bye comes back up the
  // chain. One of several first parties waits, too, for every member to end its run, so a
  // link lost meanwhile (another member's final turns) finds it there to start again from the
  // newest checkpoint with the others.
  down_->send(writer_.bye(reason));
  co_await end_acknowledged(plan_.members < 2 ? "the stages after to record the run's end"
                                              : "the end of every first party's run");
}

Task<> StagePeer::end_acknowledged(const char* awaiting) {
  const auto t0 = std::chrono::steady_clock::now();
  const Frame frame = co_await message(*down_, awaiting);
  idle_s_ += since(t0);
  const wire::Message* msg = verified(*down_, "next", frame);
  if (msg->payload_type() != wire::Payload::Bye)
    refuse(*down_, "next", {wire::ErrorCode::UnexpectedMessage,
                            cat("expected Bye after this stage's Bye, got ", payload_name(msg->payload_type()))});
}

Task<> StagePeer::end_run() {
  // This stage's end first (what it throws ends this run here: the host tells the stage
  // before), then the stages after's: every stage's end is recorded before the Bye that ends
  // the stages after it, so a stage lost once its end is recorded loses nothing.
  if (end_) end_(next_step_, false);
  if (down_ != nullptr) {
    down_->send(writer_.bye("the first stage ended the run"));
    co_await end_acknowledged("the stages after to record the run's end");
  }
  if (end_) end_(next_step_, true);
  for (StageLink* up : shared() ? members_ : std::vector<StageLink*>{up_})
    up->send_last(writer_.bye(shared() ? "every first party has ended its run" : "every later stage has recorded the run's end"));
}

}  // namespace tandem
