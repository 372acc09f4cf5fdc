#include "core/trainer.h"

#include <chrono>

#include "core/error.h"
#include "core/loss.h"
#include "core/microbatch.h"

namespace tandem {

ChainTrainer::ChainTrainer(std::vector<Network*> stages, std::vector<Optimizer*> optimizers)
    : stages_(std::move(stages)), optimizers_(std::move(optimizers)) {
  if (stages_.empty() || stages_.size() != optimizers_.size())
    fail("trainer", cat("need one optimizer per stage, got ", stages_.size(), " stages and ", optimizers_.size(),
                        " optimizers"));
  times_.busy_s.assign(stages_.size(), 0.0);
  stages_.front()->set_input_gradient(false);  // the data: no gradient
  const auto& first = stages_.front()->graph().inputs();
  for (Network* s : stages_) {
    int mask = -1;
    if (s != stages_.front() && s->graph().inputs().size() > 1)
      for (std::size_t k = 0; k < first.size(); ++k)
        if (first[k].name == s->graph().inputs()[1].name) mask = static_cast<int>(k);
    if (s != stages_.front() && s->graph().inputs().size() > 1 && mask < 0)
      fail("trainer", cat(s->graph().name(), " reads an input the first stage does not take"));
    mask_of_.push_back(mask);
  }
}

std::span<const Tensor> ChainTrainer::stage_inputs(std::size_t i, std::span<const Tensor> inputs, const Tensor& x,
                                                   int64_t begin, int64_t count, int slot) {
  if (cuts_.size() <= static_cast<std::size_t>(slot)) cuts_.resize(static_cast<std::size_t>(slot) + 1);
  LengthCut& cut = cuts_[static_cast<std::size_t>(slot)];
  in_.clear();
  if (i == 0) {  // the micro-batch at its length bucket (core/length_buckets.h), as an edge runs it
    for (const Tensor& t : inputs) in_.push_back(t.slice_batch(begin, count));
    fit_to_bucket(stages_.front()->graph(), in_, cut);
    return cut.inputs;
  }
  in_.push_back(x);
  if (mask_of_[i] >= 0) in_.push_back(cut.inputs[static_cast<std::size_t>(mask_of_[i])]);
  return in_;
}

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

StepStats ChainTrainer::train_step(std::span<const Tensor> inputs, const int32_t* labels, int microbatches) {
  const int64_t batch = inputs[0].shape()[0];
  if (microbatches < 1 || microbatches > batch)
    fail("trainer", cat("micro-batches must be in [1, batch size ", batch, "], got ", microbatches));
  for (Network* s : stages_) s->zero_grad();
  StepStats stats;
  const float scale = 1.0f / static_cast<float>(batch);
  for (int mb = 0; mb < microbatches; ++mb) {
    const auto [begin, count] = microbatch_range(batch, microbatches, mb);
    Tensor x;
    for (std::size_t i = 0; i < stages_.size(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      stages_[i]->set_training(true);
      x = stages_[i]->forward(stage_inputs(i, inputs, x, begin, count, mb), mb);
      times_.busy_s[i] += seconds_since(t0);
    }
    if (dlogits_.size() <= static_cast<std::size_t>(mb)) dlogits_.resize(static_cast<std::size_t>(mb) + 1);
    Tensor& dlogits = dlogits_[static_cast<std::size_t>(mb)];
    if (!dlogits.defined() || dlogits.shape() != x.shape()) dlogits = Tensor::empty(x.shape());
    const int64_t heads = stages_.back()->graph().output_groups();
    stats.loss_sum += compute_loss(stages_.back()->graph().loss(), x, labels + begin, scale, &dlogits, heads);
    stats.correct += count_correct(x, labels + begin, heads);
    Tensor grad = dlogits;
    for (std::size_t i = stages_.size(); i-- > 0;) {
      const auto t0 = std::chrono::steady_clock::now();
      grad = stages_[i]->backward(grad, mb, i > 0);
      times_.busy_s[i] += seconds_since(t0);
    }
  }
  stats.samples = batch;
  for (std::size_t i = 0; i < optimizers_.size(); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    optimizers_[i]->step();
    times_.busy_s[i] += seconds_since(t0);
  }
  return stats;
}

StepStats ChainTrainer::evaluate(std::span<const Tensor> inputs, const int32_t* labels, int64_t chunk) {
  StepStats stats;
  const int64_t total = inputs[0].shape()[0];
  for (int64_t begin = 0; begin < total; begin += chunk) {
    const int64_t count = std::min(chunk, total - begin);
    Tensor x;
    for (std::size_t i = 0; i < stages_.size(); ++i) {
      stages_[i]->set_training(false);
      x = stages_[i]->forward(stage_inputs(i, inputs, x, begin, count, 0), 0);
    }
    const int64_t heads = stages_.back()->graph().output_groups();
    stats.loss_sum += compute_loss(stages_.back()->graph().loss(), x, labels + begin, 1.0f, nullptr, heads);
    stats.correct += count_correct(x, labels + begin, heads);
    stats.samples += count;
  }
  return stats;
}

}  // namespace tandem
