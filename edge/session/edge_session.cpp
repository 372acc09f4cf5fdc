#include "edge/session/edge_session.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/loss.h"
#include "core/microbatch.h"
#include "core/privacy/nopeek.h"

namespace tandem {

EdgeSession::EdgeSession(Network& front, Optimizer& optimizer, uint32_t microbatches,
                         const std::array<uint8_t, 32>& model_hash, std::string client_id,
                         std::vector<wire::DType> dtypes)
    : front_(front), optimizer_(optimizer), microbatches_(microbatches), model_hash_(model_hash),
      client_id_(std::move(client_id)), offered_(std::move(dtypes)), decoded_(microbatches) {
  if (microbatches_ < 1) fail("edge session", "micro-batches must be >= 1");
  if (offered_.empty()) fail("edge session", "no wire dtype to offer");
  front_.set_input_gradient(false);  // its input is the data: backward stops at the last trained weight
}

std::span<const uint8_t> EdgeSession::hello() {
  return writer_.hello(client_id_, model_hash_, token_, kProtocolVersion, offered_, resume_step_);
}

namespace {
// The message, or null with `error` set; the cloud's own Error message is passed on.
const wire::Message* expect(const Frame& frame, wire::Payload want, WireError& error) {
  const wire::Message* m = verify_frame(frame, kDefaultMaxMessageBytes, error);
  if (!m) return nullptr;
  if (m->payload_type() == wire::Payload::Error) {
    const auto* e = m->payload_as_Error();
    error = {e->code(), cat("the cloud refused: ", e->text() ? e->text()->str() : std::string("(no text)"))};
    return nullptr;
  }
  if (m->payload_type() != want) {
    error = {wire::ErrorCode::UnexpectedMessage,
             cat("expected ", payload_name(want), ", got ", payload_name(m->payload_type()))};
    return nullptr;
  }
  return m;
}

// The front shard's output must be finite before it leaves: weights that diverged (a learning
// rate too high, or huge gradients from the cloud) are this edge's problem to report, not a
// tensor for the cloud to refuse (nor NaN for the I8 encoder). The first bad element, or -1.
int64_t first_non_finite(const Tensor& activations) {
  const float* p = activations.data();
  for (int64_t i = 0, n = activations.numel(); i < n; ++i)
    if (!std::isfinite(p[i])) return i;
  return -1;
}
[[noreturn]] void diverged(const std::string& what, int64_t element) {
  fail("edge session", cat("the front shard's activations for ", what, " are not finite (element ", element,
                           "): its weights diverged"));
}
}  // namespace

bool EdgeSession::on_welcome(const Frame& frame, WireError& error) {
  const wire::Message* m = expect(frame, wire::Payload::Welcome, error);
  if (!m) return false;
  const auto* w = m->payload_as_Welcome();
  if (w->microbatches() < microbatches_) {
    error = {wire::ErrorCode::UnexpectedMessage, cat("the cloud takes at most ", w->microbatches(),
                                                     " micro-batches a step; this edge asks for ", microbatches_)};
    return false;
  }
  if (std::find(offered_.begin(), offered_.end(), w->dtype()) == offered_.end()) {
    error = {wire::ErrorCode::BadTensor,
             cat("the cloud chose wire dtype ", static_cast<int>(w->dtype()), ", which this edge did not offer")};
    return false;
  }
  if (w->start_step() != resume_step_) {
    error = {wire::ErrorCode::NoCheckpoint, cat("the cloud starts at step ", w->start_step(), " but this edge ",
                                                resume_step_ ? cat("resumes from step ", resume_step_) : "starts afresh")};
    return false;
  }
  aggregate_every_ = w->aggregate_every();
  awaiting_aggregate_ = w->round() > 0;
  if (w->next_token()) next_token_ = w->next_token()->str();
  dtype_ = w->dtype();
  batch_limit_ = w->batch_size();
  step_ = w->start_step();
  welcomed_ = true;
  return true;
}

void EdgeSession::set_tail(Network* tail) {
  if (steps_in_flight() > 0) fail("edge session", "set_tail during a step");
  tail_ = tail;
  if (tail)
    tail_stage_.emplace(*tail, nullptr);  // the session's optimizer steps the tail's parameters with the front's
  else
    tail_stage_.reset();
  tail_mask_ = -1;
  if (!tail || tail->graph().inputs().size() < 2) return;  // the tail reads the middle's output only
  const std::string& mask = tail->graph().inputs()[1].name;
  const auto& in = front_.graph().inputs();
  for (std::size_t i = 0; i < in.size(); ++i)
    if (in[i].name == mask) tail_mask_ = static_cast<int>(i);
  if (tail_mask_ < 0) fail("edge session", cat("the tail reads mask '", mask, "', which is not an input of the front"));
}

std::vector<Param*> EdgeSession::edge_params() const {
  std::vector<Param*> out = front_.params();
  if (tail_) out.insert(out.end(), tail_->params().begin(), tail_->params().end());
  return out;
}

NamedTensors EdgeSession::front_params() const {
  NamedTensors out;
  for (Param* p : edge_params()) out.emplace_back(p->name(), p->value());
  return out;
}

std::span<const uint8_t> EdgeSession::front_weights(uint64_t samples, bool final) {
  if (!(aggregate_due() || (final && aggregate_every_ > 0 && step_ > 0)))
    fail("edge session", cat("front weights are not due at step ", step_));
  if (pending_front_steps_ > 0) {  // per round: the round's one update, on the summed gradients
    optimizer_.step();
    pending_front_steps_ = 0;
  }
  return writer_.front_weights(round_, samples, front_params(), final);
}

bool EdgeSession::on_aggregated(const Frame& frame, WireError& error) {
  const wire::Message* m = expect(frame, wire::Payload::Aggregated, error);
  if (!m) return false;
  const auto* a = m->payload_as_Aggregated();
  std::vector<Tensor> values;
  if (!read_named_tensors(frame, a->tensors(), front_params(), values, error)) return false;
  anchor_.clear();
  pending_front_steps_ = 0;  // gradients against the weights the average replaces
  const std::vector<Param*> params = edge_params();
  for (std::size_t i = 0; i < values.size(); ++i) {
    params[i]->value().copy_from(values[i]);
    params[i]->bump_version();
    anchor_.push_back(values[i].clone());
  }
  if (!awaiting_aggregate_) ++rounds_joined_;
  awaiting_aggregate_ = false;
  exchanged_step_ = step_;
  round_ = a->round();
  return true;
}

void EdgeSession::set_mask_input(int index) {
  const auto& in = front_.graph().inputs();
  if (index >= static_cast<int>(in.size()) || (index >= 0 && !in[static_cast<std::size_t>(index)].mask))
    fail("edge session", cat("input ", index, " of the front is not a mask"));
  mask_input_ = index;
}

LengthCut& EdgeSession::cut_slot(std::size_t slot) {
  if (cut_.size() <= slot) cut_.resize(std::max<std::size_t>(slot + 1, eval_slot() + 1));
  return cut_[slot];
}

std::span<const Tensor> EdgeSession::slice_inputs(const StepState& s, int64_t begin, int64_t count, std::size_t slot) {
  mb_inputs_.resize(s.inputs.size());
  for (std::size_t i = 0; i < s.inputs.size(); ++i) mb_inputs_[i] = s.inputs[i].slice_batch(begin, count);
  LengthCut& cut = cut_slot(slot);
  if (s.length >= 0)
    cut_to_length(front_.graph(), mb_inputs_, s.length, cut);
  else
    fit_to_bucket(front_.graph(), mb_inputs_, cut);
  return cut.inputs;
}

Shape EdgeSession::tail_input_shape(std::size_t slot, int64_t count) const {
  const GraphInput& in = tail_->graph().inputs()[0];
  return Graph::at_length(in.shape, in.tokens, slot < cut_.size() ? cut_[slot].length : -1).batched(count);
}

std::span<const Tensor> EdgeSession::tail_inputs(const Tensor& middle, const Tensor* mask) {
  tail_in_.assign(1, middle);
  if (mask) tail_in_.push_back(*mask);
  return tail_in_;
}

void EdgeSession::set_async(bool on) {
  if (steps_in_flight() > 0) fail("edge session", "set_async during a step");
  async_ = on;
  decoded_.resize(eval_slot());
}

int EdgeSession::begin_step(std::span<const Tensor> inputs, const int32_t* labels, float lr_scale, bool checkpoint) {
  if (!welcomed_) fail("edge session", "begin_step before the cloud's Welcome");
  if (awaiting_aggregate_ || (aggregate_due() && exchanged_step_ != step_))
    fail("edge session", "begin_step before the round's average (Aggregated) arrived");
  const int in_flight = steps_in_flight();
  if (in_flight > (async_ ? 1 : 0))
    fail("edge session", cat("step ", step_ + static_cast<uint64_t>(in_flight) - 1, " is still in flight"));
  if (async_) {
    const char* why = tail_ ? "a U-shaped split (the tail's loss needs the current weights)"
                      : noise_ ? "noise on the cut (each release is accounted per step)"
                      : nopeek_ > 0.0f ? "NoPeek (its penalty reads a whole step's activations)"
                      : aggregate_every_ > 0 ? "a federation (its rounds exchange the weights of a step boundary)"
                                             : nullptr;
    if (why) fail("edge session", cat("the asynchronous schedule is for plain split training, not with ", why));
    if (in_flight == 1 && cur_.checkpoint)
      fail("edge session", cat("step ", cur_.number, " saves a checkpoint: the next step waits until it is done"));
  }
  if (inputs.size() != front_.graph().inputs().size())
    fail("edge session", cat("the front takes ", front_.graph().inputs().size(), " inputs, given ", inputs.size()));
  if (inputs[0].shape()[0] > static_cast<int64_t>(batch_limit_))
    fail("edge session", cat("batch of ", inputs[0].shape()[0], " exceeds the cloud's limit of ", batch_limit_));
  StepState& s = in_flight == 0 ? cur_ : ahead_;
  s.active = true;
  s.number = step_ + static_cast<uint64_t>(in_flight);
  s.inputs.assign(inputs.begin(), inputs.end());
  s.labels = labels;
  s.lr_scale = lr_scale;
  s.checkpoint = checkpoint;
  s.microbatches = static_cast<int>(std::min<int64_t>(microbatches_, s.batch()));
  s.length = nopeek_ > 0.0f ? bucket_for(front_.graph(), s.inputs) : -1;
  s.backed = 0;
  s.loss_sum = 0.0;
  s.weights = step_;
  s.state.assign(microbatches_, 0);
  if (in_flight == 0) {
    step_dcor_ = 0.0;
    nopeek_ready_ = false;
    optimizer_.set_lr_scale(lr_scale);
    if (pending_front_steps_ == 0) {  // per round: the round's gradients add up
      front_.zero_grad();
      if (tail_) tail_->zero_grad();
    }
  }
  return s.microbatches;
}

// The penalty is the whole step's: its samples' activations gathered from the K slots, so
// that it does not depend on K (and K micro-batches still train exactly like one).
void EdgeSession::nopeek_step() {
  const int64_t batch = cur_.batch();
  int64_t row = 0;
  for (int m = 0; m < cur_.microbatches; ++m) {
    if (cur_.state[static_cast<std::size_t>(m)] == 0)
      fail("edge session", "NoPeek needs every micro-batch of the step forwarded before the first Backward");
    const Tensor& z = front_.output(m);
    row = z.numel() / z.shape()[0];
  }
  nopeek_z_.resize(static_cast<std::size_t>(batch * row));
  for (int m = 0; m < cur_.microbatches; ++m) {
    const Tensor& z = front_.output(m);
    const int64_t begin = microbatch_range(batch, cur_.microbatches, m).begin;
    std::copy_n(z.data(), z.numel(), nopeek_z_.data() + begin * row);
  }
  nopeek_grad_.assign(nopeek_z_.size(), 0.0f);
  // The correlation with the first input (the image; for a sequence, its ids).
  step_dcor_ = distance_correlation(cur_.inputs[0].data(), cur_.inputs[0].numel() / batch, nopeek_z_.data(), row, batch,
                                    nopeek_grad_.data(), nopeek_, dcor_work_);
  nopeek_ready_ = true;
}

std::span<const uint8_t> EdgeSession::forward(int mb) {
  StepState& s = newest();
  if (!s.active || mb < 0 || mb >= s.microbatches || s.state[static_cast<std::size_t>(mb)] != 0)
    fail("edge session", cat("micro-batch ", mb, " of step ", s.number, " cannot be forwarded now"));
  if (s.weights != step_)  // its backward would not know which weights to use
    fail("edge session", cat("micro-batch ", mb, " of step ", s.number, " comes after an update: forward a step's "
                             "micro-batches before the Backwards of the step before it"));
  const int64_t batch = s.batch();
  const auto [begin, count] = microbatch_range(batch, s.microbatches, mb);
  const std::size_t slot = slot_of(s, static_cast<uint32_t>(mb));
  front_.set_training(true);
  const std::span<const Tensor> in = slice_inputs(s, begin, count, slot);
  if (const int64_t length = cut_[slot].length; length > 0) tokens_run_ += count * length;
  const Tensor& activations = front_.forward(in, static_cast<int>(slot));
  if (const int64_t bad = first_non_finite(activations); bad >= 0) diverged(cat("micro-batch ", mb, " of step ", s.number), bad);
  s.state[static_cast<std::size_t>(mb)] = 1;
  return writer_.forward(s.number, static_cast<uint32_t>(mb), s.weights /* weights version: updates applied */,
                         leaving(activations, slot),
                         tail_ ? std::span<const int32_t>()  // U-shaped: the labels stay here
                               : std::span<const int32_t>(s.labels + begin, static_cast<std::size_t>(count)),
                         static_cast<uint32_t>(batch), static_cast<uint32_t>(s.microbatches), dtype_, s.lr_scale,
                         s.checkpoint, mask_input_ >= 0 ? &in[static_cast<std::size_t>(mask_input_)] : nullptr);
}

void EdgeSession::swap_stash() {
  std::size_t k = 0;
  for (Param* p : edge_params()) {
    if (!p->trainable()) continue;
    std::swap(p->value(), stash_[k++]);
    p->bump_version();  // kernels that pack weights see another tensor
  }
  stash_in_ = !stash_in_;
}

bool EdgeSession::on_backward(const Frame& frame, WireError& error, bool& step_done) {
  step_done = false;
  const wire::Message* m = expect(frame, wire::Payload::Backward, error);
  if (!m) return false;
  const auto* b = m->payload_as_Backward();
  const uint32_t mb = b->microbatch();
  StepState& s = cur_;
  if (!s.active || b->step() != s.number || mb >= static_cast<uint32_t>(s.microbatches) ||
      s.state[mb] != (tail_ ? 3 : 1)) {
    error = {wire::ErrorCode::OutOfWindow,
             cat("Backward for step ", b->step(), " micro-batch ", mb, " was not expected (step ", step_, ")")};
    return false;
  }
  // Outside a federation the back shard has taken as many updates as steps before this one.
  if (aggregate_every_ == 0 && b->weight_version() != s.number) {
    error = {wire::ErrorCode::OutOfWindow, cat("Backward for step ", s.number, " was computed with back-shard version ",
                                               b->weight_version(), ", expected ", s.number)};
    return false;
  }
  const std::size_t slot = slot_of(s, mb);
  const Tensor& sent = front_.output(static_cast<int>(slot));
  Tensor grad = read_tensor(frame, b->gradients(), sent.shape(), "gradients", dtype_, decoded_[slot], error);
  if (!grad.defined()) return false;
  const Tensor* cut_grad = &grad;
  if (noise_) {  // the gradient is of what was sent: back through the clip first
    noise_->backward(grad, sent, clip_scales_[mb], cut_grads_[mb]);
    cut_grad = &cut_grads_[mb];
  }
  if (nopeek_ > 0.0f) {  // plus the penalty's gradient, in a buffer of the edge's own
    if (!nopeek_ready_) nopeek_step();
    if (cut_grads_.size() <= mb) cut_grads_.resize(eval_slot() + 1);
    Tensor& own = cut_grads_[mb];
    if (cut_grad != &own) {
      sized(own, sent.shape()).copy_from(*cut_grad);
    }
    const auto [begin, count] = microbatch_range(s.batch(), s.microbatches, static_cast<int>(mb));
    const int64_t row = sent.numel() / count;
    const float* penalty = nopeek_grad_.data() + begin * row;
    float* g = own.data();
    for (int64_t i = 0, n = count * row; i < n; ++i) g[i] += penalty[i];
    cut_grad = &own;
  }
  // Forwarded before the last update (asynchronous): backed up on the weights it saw.
  if ((s.weights != step_) != stash_in_) swap_stash();
  front_.backward(*cut_grad, static_cast<int>(slot), false);
  if (!tail_) s.loss_sum += b->loss();  // U-shaped: the tail's own (on_middle_output)
  s.state[mb] = 2;
  if (++s.backed == s.microbatches) {
    if (stash_in_) swap_stash();
    if (ahead_.active && ahead_.weights == step_) {
      // The step begun ahead ran its forwards on the weights this update replaces: keep them.
      const std::vector<Param*> params = edge_params();
      std::size_t k = 0;
      for (Param* p : params) {
        if (!p->trainable()) continue;
        if (stash_.size() <= k) stash_.push_back(Tensor::empty(p->value().shape()));
        stash_[k++].copy_from(p->value());
      }
    }
    if (proximal_mu_ > 0.0f && !anchor_.empty()) {
      const std::vector<Param*> params = edge_params();
      for (std::size_t k = 0; k < anchor_.size(); ++k) {
        Param& p = *params[k];
        float* g = p.grad().data();
        const float* w = p.value().data();
        const float* a = anchor_[k].data();
        for (int64_t i = 0, n = p.grad().numel(); i < n; ++i) g[i] += proximal_mu_ * (w[i] - a[i]);
      }
    }
    optimizer_.set_lr_scale(s.lr_scale);
    if (per_round())
      ++pending_front_steps_;
    else
      optimizer_.step();
    ++step_;
    step_done = true;
    done_loss_sum_ = s.loss_sum;
    s.active = false;
    if (ahead_.active) {  // its Backwards come next, into gradients of their own
      std::swap(cur_, ahead_);
      front_.zero_grad();
    }
  }
  return true;
}


bool EdgeSession::on_middle_output(const Frame& frame, WireError& error, std::span<const uint8_t>& reply) {
  reply = {};
  if (!tail_) {
    error = {wire::ErrorCode::UnexpectedMessage, "MiddleOutput, but this edge runs no tail (its cut is not U-shaped)"};
    return false;
  }
  const wire::Message* m = expect(frame, wire::Payload::MiddleOutput, error);
  if (!m) return false;
  const auto* o = m->payload_as_MiddleOutput();
  const uint32_t mb = o->microbatch();
  if (!cur_.active || o->step() != step_ || mb >= static_cast<uint32_t>(cur_.microbatches) || cur_.state[mb] != 1) {
    error = {wire::ErrorCode::OutOfWindow,
             cat("MiddleOutput for step ", o->step(), " micro-batch ", mb, " was not expected (step ", step_, ")")};
    return false;
  }
  if (aggregate_every_ == 0 && o->weight_version() != step_) {
    error = {wire::ErrorCode::OutOfWindow, cat("MiddleOutput for step ", step_, " was computed with middle version ",
                                               o->weight_version(), ", expected ", step_)};
    return false;
  }
  const auto [begin, count] = microbatch_range(cur_.batch(), cur_.microbatches, static_cast<int>(mb));
  const Shape shape = tail_input_shape(mb, count);
  Tensor middle = read_tensor(frame, o->activations(), shape, "activations", dtype_, decoded_[mb], error);
  if (!middle.defined()) return false;
  Tensor mask;  // the micro-batch's as the front ran it, when the tail reads one
  if (tail_mask_ >= 0) mask = cut_slot(mb).inputs[static_cast<std::size_t>(tail_mask_)];
  Stage& tail = *tail_stage_;
  const double loss = tail.forward_loss(tail_inputs(middle, tail_mask_ >= 0 ? &mask : nullptr), static_cast<int>(mb),
                                        cur_.labels + begin, 1.0f / static_cast<float>(cur_.batch()))
                          .loss;
  const Tensor& dlogits = tail.output_grad(static_cast<int>(mb));
  const float samples = static_cast<float>(cur_.batch());
  Tensor grad;
  if (label_noise_) {
    // Noise on each sample's own loss gradient at the logits (the rows times the step's
    // samples) for what goes up; the tail's weights take the exact gradient: the noisy pass
    // runs first and its parameter gradients are put back, then the exact pass adds its own.
    // (Training the tail on the noisy gradient too would make the labels' protection a DP
    // guarantee, but measured on Fashion-MNIST it lets the tail's weights drift until
    // training collapses: bench/README.md, label_leakage.)
    if (tail_grads_.size() != tail_->params().size()) tail_grads_.resize(tail_->params().size());
    for (std::size_t k = 0; k < tail_grads_.size(); ++k) {
      const Tensor& g = tail_->params()[k]->grad();
      sized(tail_grads_[k], g.shape()).copy_from(g);
    }
    label_noise_->forward_per_sample(dlogits, samples, per_sample_, noised_dlogits_, grad_scales_);
    grad = tail.backward(noised_dlogits_, static_cast<int>(mb), true);
    sized(noised_grad_in_, grad.shape()).copy_from(grad);  // the backward's own buffer is reused by the next one
    grad = noised_grad_in_;
    for (std::size_t k = 0; k < tail_grads_.size(); ++k) tail_->params()[k]->grad().copy_from(tail_grads_[k]);
    tail.backward(dlogits, static_cast<int>(mb), false);
  } else {
    grad = tail.backward(dlogits, static_cast<int>(mb), true);
  }
  if (!std::isfinite(loss)) fail("edge session", cat("the tail's loss for micro-batch ", mb, " of step ", step_,
                                                     " is not finite: the weights diverged"));
  if (const int64_t bad = first_non_finite(grad); bad >= 0)
    fail("edge session", cat("the tail's gradient for micro-batch ", mb, " of step ", step_, " is not finite (element ",
                             bad, "): the weights diverged"));
  cur_.loss_sum += loss;
  cur_.state[mb] = 3;
  const Tensor* up = &grad;
  if (grad_noise_) {  // on each sample's gradient of its own loss (the rows times the step's samples)
    grad_noise_->forward_per_sample(grad, samples, per_sample_, noised_grad_, grad_scales_);
    up = &noised_grad_;
  }
  // With the labels protected, the exact loss would tell the cloud about them: it gets 0.
  reply = writer_.middle_gradient(step_, mb, *up, label_noise_ || grad_noise_ ? 0.0f : static_cast<float>(loss), dtype_);
  return true;
}

bool EdgeSession::on_step_message(const Frame& frame, WireError& error, bool& step_done,
                                  std::span<const uint8_t>& reply) {
  reply = {};
  step_done = false;
  if (tail_) {
    WireError ignored;
    const wire::Message* m = verify_frame(frame, kDefaultMaxMessageBytes, ignored);
    if (m && m->payload_type() == wire::Payload::MiddleOutput) return on_middle_output(frame, error, reply);
  }
  return on_backward(frame, error, step_done);
}

std::span<const uint8_t> EdgeSession::eval_forward(uint64_t batch_id, std::span<const Tensor> inputs,
                                                   const int32_t* labels, int64_t count) {
  front_.set_training(false);
  const std::size_t slot = eval_in_ = steps_in_flight() > 0 ? eval_slot() : 0;
  LengthCut& cut = cut_slot(slot);
  fit_to_bucket(front_.graph(), inputs, cut);
  inputs = cut.inputs;
  const Tensor& activations = front_.forward_in_pieces(inputs, static_cast<int>(slot), eval_rows_, eval_joined_);
  if (tail_mask_ >= 0) eval_mask_ = inputs[static_cast<std::size_t>(tail_mask_)];
  if (const int64_t bad = first_non_finite(activations); bad >= 0) diverged(cat("evaluation batch ", batch_id), bad);
  eval_labels_ = labels;
  eval_count_ = count;
  eval_batch_ = batch_id;
  return writer_.eval_forward(batch_id, noise_evaluation_ ? leaving(activations, slot) : activations,
                              tail_ ? std::span<const int32_t>()  // U-shaped: scored here (on_eval_result)
                                    : std::span<const int32_t>(labels, static_cast<std::size_t>(count)),
                              dtype_, mask_input_ >= 0 ? &inputs[static_cast<std::size_t>(mask_input_)] : nullptr);
}

const Tensor& EdgeSession::leaving(const Tensor& activations, std::size_t slot) {
  if (!noise_) return activations;
  if (noised_.size() <= slot) {
    noised_.resize(eval_slot() + 1);
    cut_grads_.resize(eval_slot() + 1);
    clip_scales_.resize(eval_slot() + 1);
  }
  noise_->forward(activations, noised_[slot], clip_scales_[slot]);
  return noised_[slot];
}

bool EdgeSession::on_eval_result(const Frame& frame, WireError& error, EvalResult& result) {
  if (tail_) {  // U-shaped: the middle's output comes back, and the tail scores it
    const wire::Message* m = expect(frame, wire::Payload::EvalMiddleOutput, error);
    if (!m) return false;
    const auto* o = m->payload_as_EvalMiddleOutput();
    if (o->batch_id() != eval_batch_ || eval_labels_ == nullptr) {
      error = {wire::ErrorCode::OutOfWindow, cat("EvalMiddleOutput for batch ", o->batch_id(), " was not expected")};
      return false;
    }
    const Shape shape = tail_input_shape(eval_in_, eval_count_);
    Tensor middle = read_tensor(frame, o->activations(), shape, "activations", dtype_, eval_decoded_, error);
    if (!middle.defined()) return false;
    tail_->set_training(false);
    const Tensor& logits =
        tail_->forward(tail_inputs(middle, tail_mask_ >= 0 ? &eval_mask_ : nullptr), static_cast<int>(eval_in_));
    result = {tail_stage_->correct(logits, eval_labels_), eval_count_, o->cloud_busy_s()};
    eval_labels_ = nullptr;
    return true;
  }
  const wire::Message* m = expect(frame, wire::Payload::EvalResult, error);
  if (!m) return false;
  const auto* r = m->payload_as_EvalResult();
  result = {r->correct(), r->count(), r->cloud_busy_s()};
  return true;
}

}  // namespace tandem
