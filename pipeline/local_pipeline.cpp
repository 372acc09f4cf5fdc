#include "pipeline/local_pipeline.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/microbatch.h"

namespace tandem {

using Kind = PipelineAction::Kind;

double StageTimes::bubble() const {
  if (busy_s.empty() || wall_s <= 0) return 0.0;
  double busy = 0;
  for (double b : busy_s) busy += b;
  return 1.0 - busy / (static_cast<double>(busy_s.size()) * wall_s);
}

// One step in flight: the links' state (which slot's activations and input gradient each
// stage has sent) and what the loss stage measured.
struct LocalPipeline::Step {
  std::span<const Tensor> inputs;
  const int32_t* labels = nullptr;
  int64_t batch = 0;
  int microbatches = 0;
  float scale = 1;
  int64_t number = 0;   // the train_step call (an asynchronous slot set's parity)
  bool flushing = false;  // only the step before's backwards (flush)
  std::vector<std::vector<PipelineAction>> actions;  // per stage
  std::vector<std::vector<PipelineAction>> flush_actions;  // per stage: the backwards alone
  std::vector<std::vector<const Tensor*>> sent;      // per stage, per slot: its forward output
  std::vector<std::vector<char>> sent_grad;          // per stage > 0, per slot: input gradient ready
  std::vector<double> loss;                          // per micro-batch
  std::vector<int64_t> correct;
  std::vector<std::size_t> next;  // per stage: its next action (one thread)
  std::vector<double> busy0;  // per stage: its busy time when the step began
  // Threads: the links' one lock; a stage that fails stops them all.
  std::mutex mu;
  std::condition_variable cv;
  std::exception_ptr error;
  const std::vector<PipelineAction>& list(std::size_t s) const { return flushing ? flush_actions[s] : actions[s]; }
};

LocalPipeline::LocalPipeline(std::vector<Network*> stages, std::vector<Optimizer*> optimizers, Options options)
    : schedule_(make_pipeline_schedule(options.schedule)), threads_(options.threads) {
  if (stages.empty() || stages.size() != optimizers.size())
    fail("pipeline", cat("need one optimizer per stage, got ", stages.size(), " stages and ", optimizers.size(),
                         " optimizers"));
  for (std::size_t i = 0; i < stages.size(); ++i) stages_.emplace_back(*stages[i], optimizers[i]);
  async_ = schedule_->asynchronous();
  times_.busy_s.assign(stages_.size(), 0.0);
  times_.idle_s.assign(stages_.size(), 0.0);
  in_.resize(stages_.size());
  grads_.resize(stages_.size());
  stages.front()->set_input_gradient(false);  // the data: no gradient
  const auto& first = stages.front()->graph().inputs();
  for (Network* s : stages) {
    int mask = -1;
    if (s != stages.front() && s->graph().inputs().size() > 1) {
      for (std::size_t k = 0; k < first.size(); ++k)
        if (first[k].name == s->graph().inputs()[1].name) mask = static_cast<int>(k);
      if (mask < 0) fail("pipeline", cat(s->graph().name(), " reads an input the first stage does not take"));
    }
    mask_of_.push_back(mask);
  }
}

LocalPipeline::~LocalPipeline() = default;

int LocalPipeline::slot_of(const Step& step, const PipelineAction& a) const {
  if (!async_) return a.microbatch;
  return static_cast<int>(((step.number + a.step) & 1) * step.microbatches) + a.microbatch;
}

std::span<const Tensor> LocalPipeline::stage_inputs(Step& step, std::size_t i, int mb, int slot) {
  const auto at = static_cast<std::size_t>(slot);
  std::vector<Tensor>& in = in_[i];
  in.clear();
  if (i == 0) {  // the micro-batch at its length bucket (core/length_buckets.h), as an edge runs it
    const auto [begin, count] = microbatch_range(step.batch, step.microbatches, mb);
    for (std::size_t k = 0; k < step.inputs.size(); ++k) {
      Tensor rows = step.inputs[k].slice_batch(begin, count);
      if (async_) {  // its own copy: the backward, a step later, reads it
        if (owned_inputs_.size() <= at) owned_inputs_.resize(at + 1);
        std::vector<Tensor>& owned = owned_inputs_[at];
        if (owned.size() <= k) owned.resize(k + 1);
        sized(owned[k], rows.shape()).copy_from(rows);
        rows = owned[k];
      }
      in.push_back(rows);
    }
    fit_to_bucket(stages_.front().graph(), in, cuts_[at]);
    return cuts_[at].inputs;
  }
  in.push_back(*step.sent[i - 1][at]);
  if (mask_of_[i] >= 0) in.push_back(cuts_[at].inputs[static_cast<std::size_t>(mask_of_[i])]);
  return in;
}

bool LocalPipeline::ready(const Step& step, std::size_t s, const PipelineAction& a) const {
  const auto slot = static_cast<std::size_t>(slot_of(step, a));
  switch (a.kind) {
    case Kind::Forward: return s == 0 || step.sent[s - 1][slot] != nullptr;
    case Kind::BackwardWeight: return true;  // its stage ran the input half before (the schedule's order)
    default:
      if (s + 1 < stages_.size()) return step.sent_grad[s + 1][slot] != 0;
      return a.step < 0 || step.sent[s][slot] != nullptr;  // the loss's gradient, from this or the step before
  }
}

void LocalPipeline::run(Step& step, std::size_t s, const PipelineAction& a) {
  Stage& stage = stages_[s];
  const int mb = a.microbatch;
  const int slot = slot_of(step, a);
  const auto at = static_cast<std::size_t>(slot);
  const bool last = s + 1 == stages_.size();
  if (async_) stage.use_stash(a.step < 0);  // a backward of the step before runs on the weights its forward used
  if (a.kind == Kind::Forward) {
    std::span<const Tensor> in = stage_inputs(step, s, mb, slot);
    if (last) {
      const auto [begin, count] = microbatch_range(step.batch, step.microbatches, mb);
      const Stage::LossPass pass = stage.forward_loss(in, slot, step.labels + begin, step.scale);
      step.loss[static_cast<std::size_t>(mb)] = pass.loss;
      step.correct[static_cast<std::size_t>(mb)] = pass.correct;
    }
    const Tensor* out = last ? &stage.network().output(slot) : &stage.forward(in, slot);
    std::lock_guard lock(step.mu);
    step.sent[s][at] = out;
    return;
  }
  if (a.kind == Kind::BackwardWeight) {
    stage.backward_weights(slot);
    return;
  }
  const Tensor& grad_out = last ? stage.output_grad(slot) : grads_[s + 1][at];
  const Tensor g = stage.backward(grad_out, slot, s > 0, a.kind == Kind::BackwardInput);
  if (s == 0) return;
  // The link upstream carries a copy: the stage's next backward reuses its buffer.
  Tensor& sent = grads_[s][at];
  sized(sent, g.shape()).copy_from(g);
  std::lock_guard lock(step.mu);
  step.sent_grad[s][at] = 1;
}

void LocalPipeline::finish_stage(Step& step, std::size_t s) {
  Stage& stage = stages_[s];
  if (!async_ || s + 1 == stages_.size()) {  // synchronous (an asynchronous loss stage too)
    if (!step.flushing) stage.step();
    return;
  }
  stage.use_stash(false);
  const bool backed_up = step.flushing || pending_ > 0;
  if (!step.flushing) stage.stash_weights();  // the weights this step's forwards used, for their backwards
  if (backed_up) stage.step();
}

void LocalPipeline::run_sequential(Step& step) {
  std::vector<std::size_t>& next = step.next;
  next.assign(stages_.size(), 0);  // (no allocation after the first step)
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t s = 0; s < stages_.size(); ++s)
      while (next[s] < step.list(s).size() && ready(step, s, step.list(s)[next[s]])) {
        run(step, s, step.list(s)[next[s]++]);
        progress = true;
      }
  }
  for (std::size_t s = 0; s < stages_.size(); ++s)
    if (next[s] < step.list(s).size())
      fail("pipeline", cat("schedule ", schedule_->name(), ": stage ", s, " waits forever at ",
                           action_text(step.list(s)[next[s]])));
  for (std::size_t s = 0; s < stages_.size(); ++s) finish_stage(step, s);
}

void LocalPipeline::run_threads(Step& step) {
  std::vector<std::thread> workers;
  std::vector<double> idle(stages_.size(), 0.0);
  std::size_t done = 0;  // stages through their actions: the updates wait for all of them
  for (std::size_t s = 0; s < stages_.size(); ++s)
    workers.emplace_back([this, &step, &idle, &done, s] {
      try {
        for (const PipelineAction& a : step.list(s)) {
          {
            const auto t0 = std::chrono::steady_clock::now();
            std::unique_lock lock(step.mu);
            step.cv.wait(lock, [&] { return step.error || ready(step, s, a); });
            idle[s] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (step.error) return;
          }
          run(step, s, a);
          step.cv.notify_all();
        }
        {  // a step that fails anywhere leaves every stage's weights as they were
          std::unique_lock lock(step.mu);
          if (++done == stages_.size()) step.cv.notify_all();
          step.cv.wait(lock, [&] { return step.error || done == stages_.size(); });
          if (step.error) return;
        }
        finish_stage(step, s);
      } catch (...) {
        std::lock_guard lock(step.mu);
        if (!step.error) step.error = std::current_exception();
        step.cv.notify_all();
      }
    });
  for (std::thread& t : workers) t.join();
  for (std::size_t s = 0; s < stages_.size(); ++s) times_.idle_s[s] += idle[s];
  if (step.error) std::rethrow_exception(step.error);
}

void LocalPipeline::begin_step(Step& step, std::span<const Tensor> inputs, const int32_t* labels, int microbatches) {
  const auto n = stages_.size(), k = static_cast<std::size_t>(microbatches);
  const std::size_t slots = async_ ? 2 * k : k;
  if (!step.flushing) {  // a flush backs up the step before, whose rows and loss scale are kept
    step.inputs = inputs;
    step.labels = labels;
    step.batch = inputs[0].shape()[0];
    step.scale = 1.0f / static_cast<float>(step.batch);
  }
  step.microbatches = microbatches;
  step.number = steps_;
  step.error = nullptr;
  // The steady step allocates nothing: the orders are made again only when K changes.
  if (step.actions.size() != n || step.loss.size() != k) {
    step.actions.resize(n);
    step.flush_actions.resize(n);
    // An order whose stages disagree would leave threads waiting forever: refused here, by
    // name (simulate), before any runs.
    (void)simulate(*schedule_, static_cast<int>(n), microbatches);
    for (std::size_t s = 0; s < n; ++s) {
      step.actions[s] = schedule_->actions(static_cast<int>(s), static_cast<int>(n), microbatches);
      step.flush_actions[s].clear();
      for (const PipelineAction& a : step.actions[s])
        if (a.step < 0) step.flush_actions[s].push_back(a);
    }
    step.sent.assign(n, std::vector<const Tensor*>(slots));
    step.sent_grad.assign(n, std::vector<char>(slots));
    step.loss.resize(k);
    step.correct.resize(k);
    step.busy0.resize(n);
  }
  for (std::size_t s = 0; s < n; ++s) {
    // Asynchronous: the step before's slots keep what its backwards need (their outputs and
    // the losses' gradients); only this step's are cleared.
    for (std::size_t slot = 0; slot < slots; ++slot) {
      const bool this_step = !async_ || slot / k == static_cast<std::size_t>(steps_ & 1);
      if (this_step && !step.flushing) {
        step.sent[s][slot] = nullptr;
        step.sent_grad[s][slot] = 0;
      } else if (!this_step && s + 1 < stages_.size()) {
        step.sent_grad[s][slot] = 0;  // the step before's gradients go up now (the last stage's came with it)
      }
    }
    if (grads_[s].size() < slots) grads_[s].resize(slots);
    stages_[s].zero_grad();
    step.busy0[s] = stages_[s].busy_s();
  }
  std::fill(step.loss.begin(), step.loss.end(), 0.0);
  std::fill(step.correct.begin(), step.correct.end(), 0);
  if (cuts_.size() < slots) cuts_.resize(slots);
  if (async_ && owned_inputs_.size() < slots) owned_inputs_.resize(slots);
}

void LocalPipeline::run_step(Step& step) {
  const auto t0 = std::chrono::steady_clock::now();
  if (threads_)
    run_threads(step);
  else
    run_sequential(step);
  for (std::size_t s = 0; s < stages_.size(); ++s) times_.busy_s[s] += stages_[s].busy_s() - step.busy0[s];
  times_.wall_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

StepStats LocalPipeline::train_step(std::span<const Tensor> inputs, const int32_t* labels, int microbatches) {
  const int64_t batch = inputs[0].shape()[0];
  if (microbatches < 1 || microbatches > batch)
    fail("pipeline", cat("micro-batches must be in [1, batch size ", batch, "], got ", microbatches));
  if (async_ && pending_ > 0 && pending_ != microbatches) flush();  // the slots follow K
  if (!step_) step_ = std::make_unique<Step>();
  Step& step = *step_;
  step.flushing = false;
  try {
    begin_step(step, inputs, labels, microbatches);
    if (async_ && pending_ == 0)  // nothing to back up yet: this step's forwards alone
      for (std::size_t s = 0; s < stages_.size(); ++s)
        step.actions[s].erase(std::remove_if(step.actions[s].begin(), step.actions[s].end(),
                                             [](const PipelineAction& a) { return a.step < 0; }),
                              step.actions[s].end());
    run_step(step);
  } catch (...) {
    abandon();
    throw;
  }
  if (async_ && pending_ == 0)  // the full orders again for the next step
    for (std::size_t s = 0; s < stages_.size(); ++s)
      step.actions[s] = schedule_->actions(static_cast<int>(s), static_cast<int>(stages_.size()), microbatches);
  StepStats stats;
  for (std::size_t mb = 0; mb < static_cast<std::size_t>(microbatches); ++mb) {
    stats.loss_sum += step.loss[mb];
    stats.correct += step.correct[mb];
  }
  stats.samples = batch;
  ++steps_;
  if (async_) pending_ = microbatches;
  return stats;
}

void LocalPipeline::abandon() {
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    stages_[s].use_stash(false);
    stages_[s].network().drop_deferred_weights();
    stages_[s].zero_grad();
  }
  pending_ = 0;
  if (step_) step_->actions.clear();  // made again, whole, by the next step
}

void LocalPipeline::flush() {
  if (!async_ || pending_ == 0) return;
  Step& step = *step_;
  // The step before's backwards, as the next step would run them, without its forwards.
  step.flushing = true;
  try {
    begin_step(step, {}, nullptr, pending_);
    run_step(step);
  } catch (...) {
    step.flushing = false;
    abandon();
    throw;
  }
  step.flushing = false;
  ++steps_;  // the next step's slots are the other set, as after a step
  pending_ = 0;
}

StepStats LocalPipeline::evaluate(std::span<const Tensor> inputs, const int32_t* labels, int64_t chunk) {
  flush();
  StepStats stats;
  const int64_t total = inputs[0].shape()[0];
  Step step;
  step.inputs = inputs;
  step.sent.assign(stages_.size(), std::vector<const Tensor*>(1, nullptr));
  if (cuts_.empty()) cuts_.resize(1);
  for (int64_t begin = 0; begin < total; begin += chunk) {
    const int64_t count = std::min(chunk, total - begin);
    // One micro-batch of `count` rows at `begin`: the step's rows are the chunk's.
    std::vector<Tensor> rows;
    for (const Tensor& t : inputs) rows.push_back(t.slice_batch(begin, count));
    step.inputs = rows;
    step.batch = count;
    step.microbatches = 1;
    for (std::size_t s = 0; s < stages_.size(); ++s) {
      Network& net = stages_[s].network();
      net.set_training(false);
      step.sent[s][0] = &net.forward(stage_inputs(step, s, 0, 0), 0);
    }
    const Tensor& out = *step.sent.back()[0];
    const Stage& loss_stage = stages_.back();
    stats.loss_sum += loss_stage.loss(out, labels + begin, 1.0f, nullptr);
    stats.correct += loss_stage.correct(out, labels + begin);
    stats.samples += count;
  }
  return stats;
}

}  // namespace tandem
