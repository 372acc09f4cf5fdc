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

// One step in flight: the links' state (which micro-batch's activations and input gradient
// each stage has sent) and what the loss stage measured.
struct LocalPipeline::Step {
  std::span<const Tensor> inputs;
  const int32_t* labels = nullptr;
  int64_t batch = 0;
  int microbatches = 0;
  float scale = 1;
  std::vector<std::vector<PipelineAction>> actions;  // per stage
  std::vector<std::vector<const Tensor*>> sent;      // per stage, per slot: its forward output
  std::vector<std::vector<char>> sent_grad;          // per stage > 0, per slot: input gradient ready
  std::vector<double> loss;                          // per slot
  std::vector<int64_t> correct;
  std::vector<std::size_t> next;  // per stage: its next action (one thread)
  std::vector<double> busy0;  // per stage: its busy time when the step began
  // Threads: the links' one lock; a stage that fails stops them all.
  std::mutex mu;
  std::condition_variable cv;
  std::exception_ptr error;
};

LocalPipeline::LocalPipeline(std::vector<Network*> stages, std::vector<Optimizer*> optimizers, Options options)
    : schedule_(make_pipeline_schedule(options.schedule)), threads_(options.threads) {
  if (stages.empty() || stages.size() != optimizers.size())
    fail("pipeline", cat("need one optimizer per stage, got ", stages.size(), " stages and ", optimizers.size(),
                         " optimizers"));
  for (std::size_t i = 0; i < stages.size(); ++i) stages_.emplace_back(*stages[i], optimizers[i]);
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

std::span<const Tensor> LocalPipeline::stage_inputs(Step& step, std::size_t i, int mb) {
  const auto slot = static_cast<std::size_t>(mb);
  std::vector<Tensor>& in = in_[i];
  in.clear();
  if (i == 0) {  // the micro-batch at its length bucket (core/length_buckets.h), as an edge runs it
    const auto [begin, count] = microbatch_range(step.batch, step.microbatches, mb);
    for (const Tensor& t : step.inputs) in.push_back(t.slice_batch(begin, count));
    fit_to_bucket(stages_.front().graph(), in, cuts_[slot]);
    return cuts_[slot].inputs;
  }
  in.push_back(*step.sent[i - 1][slot]);
  if (mask_of_[i] >= 0) in.push_back(cuts_[slot].inputs[static_cast<std::size_t>(mask_of_[i])]);
  return in;
}

bool LocalPipeline::ready(const Step& step, std::size_t s, const PipelineAction& a) const {
  const auto slot = static_cast<std::size_t>(a.microbatch);
  switch (a.kind) {
    case Kind::Forward: return s == 0 || step.sent[s - 1][slot] != nullptr;
    case Kind::BackwardWeight: return true;  // its stage ran the input half before (the schedule's order)
    default: return s + 1 == stages_.size() ? step.sent[s][slot] != nullptr : step.sent_grad[s + 1][slot] != 0;
  }
}

void LocalPipeline::run(Step& step, std::size_t s, const PipelineAction& a) {
  Stage& stage = stages_[s];
  const int mb = a.microbatch;
  const auto slot = static_cast<std::size_t>(mb);
  const bool last = s + 1 == stages_.size();
  if (a.kind == Kind::Forward) {
    std::span<const Tensor> in = stage_inputs(step, s, mb);
    if (last) {
      const auto [begin, count] = microbatch_range(step.batch, step.microbatches, mb);
      const Stage::LossPass pass = stage.forward_loss(in, mb, step.labels + begin, step.scale);
      step.loss[slot] = pass.loss;
      step.correct[slot] = pass.correct;
    }
    const Tensor* out = last ? &stage.network().output(mb) : &stage.forward(in, mb);
    std::lock_guard lock(step.mu);
    step.sent[s][slot] = out;
    return;
  }
  if (a.kind == Kind::BackwardWeight) {
    stage.backward_weights(mb);
    return;
  }
  const Tensor& grad_out = last ? stage.output_grad(mb) : grads_[s + 1][slot];
  const Tensor g = stage.backward(grad_out, mb, s > 0, a.kind == Kind::BackwardInput);
  if (s == 0) return;
  // The link upstream carries a copy: the stage's next backward reuses its buffer.
  Tensor& sent = grads_[s][slot];
  if (!sent.defined() || sent.shape() != g.shape()) sent = Tensor::empty(g.shape());
  sent.copy_from(g);
  std::lock_guard lock(step.mu);
  step.sent_grad[s][slot] = 1;
}

void LocalPipeline::run_sequential(Step& step) {
  std::vector<std::size_t>& next = step.next;
  next.assign(stages_.size(), 0);  // (no allocation after the first step)
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t s = 0; s < stages_.size(); ++s)
      while (next[s] < step.actions[s].size() && ready(step, s, step.actions[s][next[s]])) {
        run(step, s, step.actions[s][next[s]++]);
        progress = true;
      }
  }
  for (std::size_t s = 0; s < stages_.size(); ++s)
    if (next[s] < step.actions[s].size())
      fail("pipeline", cat("schedule ", schedule_->name(), ": stage ", s, " waits forever at ",
                           action_text(step.actions[s][next[s]])));
  for (Stage& stage : stages_) stage.step();
}

void LocalPipeline::run_threads(Step& step) {
  std::vector<std::thread> workers;
  std::vector<double> idle(stages_.size(), 0.0);
  for (std::size_t s = 0; s < stages_.size(); ++s)
    workers.emplace_back([this, &step, &idle, s] {
      try {
        for (const PipelineAction& a : step.actions[s]) {
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
        stages_[s].step();
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

StepStats LocalPipeline::train_step(std::span<const Tensor> inputs, const int32_t* labels, int microbatches) {
  const int64_t batch = inputs[0].shape()[0];
  if (microbatches < 1 || microbatches > batch)
    fail("pipeline", cat("micro-batches must be in [1, batch size ", batch, "], got ", microbatches));
  const auto t0 = std::chrono::steady_clock::now();
  if (!step_) step_ = std::make_unique<Step>();
  Step& step = *step_;
  const auto n = stages_.size(), k = static_cast<std::size_t>(microbatches);
  step.inputs = inputs;
  step.labels = labels;
  step.batch = batch;
  step.microbatches = microbatches;
  step.scale = 1.0f / static_cast<float>(batch);
  step.error = nullptr;
  // The steady step allocates nothing: the orders are made again only when K changes.
  if (step.actions.size() != n || step.loss.size() != k) {
    step.actions.resize(n);
    for (std::size_t s = 0; s < n; ++s)
      step.actions[s] = schedule_->actions(static_cast<int>(s), static_cast<int>(n), microbatches);
    step.sent.assign(n, std::vector<const Tensor*>(k));
    step.sent_grad.assign(n, std::vector<char>(k));
    step.loss.resize(k);
    step.correct.resize(k);
    step.busy0.resize(n);
  }
  for (std::size_t s = 0; s < n; ++s) {
    std::fill(step.sent[s].begin(), step.sent[s].end(), nullptr);
    std::fill(step.sent_grad[s].begin(), step.sent_grad[s].end(), 0);
    if (grads_[s].size() < k) grads_[s].resize(k);
    stages_[s].zero_grad();
    step.busy0[s] = stages_[s].busy_s();
  }
  std::fill(step.loss.begin(), step.loss.end(), 0.0);
  std::fill(step.correct.begin(), step.correct.end(), 0);
  if (cuts_.size() < k) cuts_.resize(k);
  if (threads_)
    run_threads(step);
  else
    run_sequential(step);
  StepStats stats;
  for (std::size_t mb = 0; mb < k; ++mb) {
    stats.loss_sum += step.loss[mb];
    stats.correct += step.correct[mb];
  }
  stats.samples = batch;
  for (std::size_t s = 0; s < n; ++s) times_.busy_s[s] += stages_[s].busy_s() - step.busy0[s];
  times_.wall_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

StepStats LocalPipeline::evaluate(std::span<const Tensor> inputs, const int32_t* labels, int64_t chunk) {
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
      step.sent[s][0] = &net.forward(stage_inputs(step, s, 0), 0);
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
