#include "pipeline/link_filter.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/privacy/nopeek.h"

namespace tandem {
namespace {

}  // namespace

std::string CutNoiseFilter::name() const {
  return cat("noise on the activations (clip ", noise_.clip(), ", sigma ", noise_.sigma(), ")");
}

CutNoiseFilter::Slot& CutNoiseFilter::slot(uint32_t mb) {
  if (slots_.size() <= mb) slots_.resize(mb + 1);
  return slots_[mb];
}

const Tensor& CutNoiseFilter::activations_out(const Tensor& activations, uint32_t mb, int64_t) {
  Slot& s = slot(mb);
  s.sent_from = activations;  // the stage's output buffer: it holds until the slot's next forward
  noise_.forward(activations, sized(s.noised, activations.shape()), s.scales);
  return s.noised;
}

const Tensor& CutNoiseFilter::evaluation_out(const Tensor& activations, uint32_t mb) {
  Slot& s = slot(mb);
  s.sent_from = Tensor();  // no gradient comes back for it
  noise_.forward(activations, sized(s.noised, activations.shape()), s.scales);
  return s.noised;
}

const Tensor& CutNoiseFilter::gradient_in(const Tensor& grad, uint32_t mb, int64_t) {
  Slot& s = slot(mb);
  if (!s.sent_from.defined()) fail("stage", cat("a gradient for micro-batch ", mb, " that left no activations"));
  noise_.backward(grad, s.sent_from, s.scales, sized(s.grad, grad.shape()));
  return s.grad;
}

std::string NoPeekFilter::name() const { return cat("NoPeek (alpha ", alpha_, ")"); }

void NoPeekFilter::begin_step(std::span<const Tensor> first_inputs, uint32_t samples, uint32_t microbatches) {
  if (first_inputs.empty()) fail("stage", "NoPeek is the first stage's: it reads the step's inputs");
  x_ = first_inputs[0];
  samples_ = samples;
  k_ = microbatches;
  seen_ = 0;
  row_ = 0;
  ready_ = false;
  if (out_.size() < microbatches) out_.resize(microbatches);
}

const Tensor& NoPeekFilter::activations_out(const Tensor& activations, uint32_t, int64_t begin) {
  const int64_t count = activations.shape()[0];
  const int64_t row = activations.numel() / count;
  if (row_ == 0) {
    row_ = row;
    z_.assign(static_cast<std::size_t>(samples_) * static_cast<std::size_t>(row), 0.0f);
  } else if (row != row_) {
    fail("stage", "NoPeek needs every micro-batch of a step at one width; this model's micro-batches run at their "
                  "own sequence lengths (length buckets): leave nopeek out for it");
  }
  std::copy_n(activations.data(), activations.numel(), z_.data() + begin * row_);
  ++seen_;
  return activations;
}

const Tensor& NoPeekFilter::gradient_in(const Tensor& grad, uint32_t mb, int64_t begin) {
  if (!ready_) {  // the whole step's penalty, at the first gradient back
    if (seen_ != k_)
      fail("stage", "NoPeek needs every micro-batch of the step sent before the first gradient comes back");
    grad_.assign(z_.size(), 0.0f);
    dcor_ = distance_correlation(x_.data(), x_.numel() / samples_, z_.data(), row_, samples_, grad_.data(), alpha_,
                                 work_);
    ready_ = true;
  }
  Tensor& own = sized(out_[mb], grad.shape());
  own.copy_from(grad);
  const float* penalty = grad_.data() + begin * row_;
  float* g = own.data();
  for (int64_t i = 0, n = own.numel(); i < n; ++i) g[i] += penalty[i];
  return own;
}

std::string GradNoiseFilter::name() const {
  return cat("noise on the gradient sent up (clip ", noise_.clip(), ", sigma ", noise_.sigma(), ")");
}

const Tensor& GradNoiseFilter::gradient_out(const Tensor& grad, uint32_t, uint32_t samples) {
  noise_.forward_per_sample(grad, static_cast<float>(samples), per_sample_, out_, scales_);
  return out_;
}

// The clip at the gradient's bound never bites: the noise is sigma per value.
LabelNoiseFilter::LabelNoiseFilter(float sigma, int heads, uint64_t seed)
    : sigma_(sigma),
      noise_(std::sqrt(2.0f * static_cast<float>(heads)), sigma / std::sqrt(2.0f * static_cast<float>(heads)), seed) {}

std::string LabelNoiseFilter::name() const { return cat("noise on the loss gradient sent up (sigma ", sigma_, ")"); }

const Tensor* LabelNoiseFilter::loss_gradient_up(const Tensor& grad, uint32_t, uint32_t samples) {
  noise_.forward_per_sample(grad, static_cast<float>(samples), per_sample_, out_, scales_);
  return &out_;
}

}  // namespace tandem
