#include "cloud/session/cloud_session.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "core/flatbuffer_read.h"
#include "core/loss.h"
#include "core/microbatch.h"
#include "core/sha256.h"

namespace tandem {

bool valid_client_id(std::string_view id) {
  if (id.size() < 1 || id.size() > 64 || id[0] == '.') return false;
  for (char c : id)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) return false;
  return true;
}

namespace {

constexpr uint32_t kMaxEvalBatch = 4096;

bool valid_client_id(const flatbuffers::String* id) { return id != nullptr && tandem::valid_client_id(id->string_view()); }

// Finite activations can still overflow the back shard (values near the float range's end):
// such a micro-batch must neither reach the weights nor go back as a non-finite gradient
// (which the edge refuses, or I8 cannot encode).
WireError overflow(uint64_t step, uint32_t mb, bool loss) {
  return {wire::ErrorCode::BadTensor, cat("step ", step, " micro-batch ", mb, ": the activations overflow the back shard "
                                          "(non-finite ", loss ? "loss" : "gradient", "); they are far outside any "
                                          "trained range")};
}

}  // namespace

CloudSession::CloudSession(BackShardTrainer& shard, const CloudSessionConfig& config)
    : shard_(shard),
      back_(shard.net()),
      optimizer_(shard.optimizer()),
      stage_(back_, &optimizer_),
      config_(config),
      seen_(config.microbatches, false) {
  u_shaped_ = u_shaped_cut(config_.cut);
  middle_backed_.assign(config_.microbatches, false);
  decoded_grads_.resize(config_.microbatches);
  deferred_.reserve(config_.microbatches);
  const auto& inputs = back_.graph().inputs();
  if (inputs.empty() || inputs.size() > 2 || (inputs.size() == 2 && !inputs[1].mask))
    fail("cloud session", "the back shard's inputs must be the cut and at most a mask (Graph::split)");
  mask_tokens_ = inputs.size() == 2 ? inputs[1].shape[0] : 0;
  if (shard.batched() && u_shaped_)
    fail("cloud session", "a U-shaped cut keeps the loss at the edge, so edges' micro-batches cannot run as one batch "
                          "on the cloud: serve it without --batch-edges");
  inputs_.assign(config_.microbatches + 1, std::vector<Tensor>(inputs.size()));
  masks_.resize(config_.microbatches + 1);
  if (config_.microbatches < 1 || config_.microbatches > config_.batch_size)
    fail("cloud session", cat("micro-batches must be in [1, batch size ", config_.batch_size, "]"));
}

CloudSession::~CloudSession() {
  release_turn();
  if (joined_) config_.federation->leave(config_.session_id);
}

CloudReply CloudSession::refuse(const WireError& error) {
  state_ = State::Closed;
  release_turn();
  return {writer_.error(error.code, error.text), true};
}

void CloudSession::run_deferred() {
  if (deferred_.empty()) return;
  if (!shard_.begin_compute(config_.session_id)) {  // lost the turn: the step is lost (the next message says so)
    deferred_.clear();
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  stage_.backward_weights(static_cast<int>(deferred_.front()));
  deferred_.erase(deferred_.begin());
  busy_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  shard_.end_compute();
}

void CloudSession::finish_step() {
  if (!step_pending_) return;
  while (!deferred_.empty()) run_deferred();
  const auto t0 = std::chrono::steady_clock::now();
  step_pending_ = false;
  // Evicted (false): the next message says so. A federation keeps its newest round between
  // updates, while this session still holds the shared shard.
  shard_.finish_step(config_.session_id, step_lr_scale_, config_.rounds ? std::function<void()>([this] { save_round(); })
                                                                         : std::function<void()>());
  busy_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void CloudSession::save_round() {
  const auto due = config_.federation->take_unsaved_round();
  if (!due) return;
  try {
    config_.rounds->save(due->first, due->second, back_, optimizer_);
  } catch (const Error& e) {  // training goes on; the operator sees why the round is not kept
    std::fprintf(stderr, "tandem-cloud: round %u was not checkpointed: %s\n", due->first, e.what());
  }
}

CloudReply CloudSession::handle(const Frame& frame) {
  // What the cloud itself fails at (a kernel the backend cannot make: the GPU's memory budget,
  // a library's error) ends this session with the reason, never the service.
  try {
    return dispatch(frame);
  } catch (const Error& e) {
    return refuse({wire::ErrorCode::Internal, cat("the cloud failed on this session: ", e.what())});
  }
}

CloudReply CloudSession::dispatch(const Frame& frame) {
  finish_step();  // a step completed by the last message is applied before anything reads the weights
  if (state_ == State::Closed) return refuse({wire::ErrorCode::UnexpectedMessage, "the session is closed"});
  if (shard_.was_evicted(config_.session_id)) return refuse(evicted());
  WireError error;
  const wire::Message* m = verify_frame(frame, config_.max_message_bytes, error);
  if (!m) return refuse(error);
  const wire::Payload type = m->payload_type();
  const bool training = state_ == State::Training;
  switch (type) {
    case wire::Payload::Hello:
      if (training) break;
      return on_hello(*m->payload_as_Hello());
    case wire::Payload::Forward:
      if (!training) break;
      return on_forward(frame, *m->payload_as_Forward());
    case wire::Payload::EvalForward:
      if (!training) break;
      return on_eval(frame, *m->payload_as_EvalForward());
    case wire::Payload::MiddleGradient:
      if (!u_shaped_)
        return refuse({wire::ErrorCode::UnexpectedMessage,
                       "MiddleGradient to a cloud that runs the back shard and the loss (not a U-shaped split)"});
      if (!training) break;
      return on_middle_gradient(frame, *m->payload_as_MiddleGradient());
    case wire::Payload::FrontWeights:
      if (!training) break;
      return on_front_weights(frame, *m->payload_as_FrontWeights());
    case wire::Payload::Bye:
      state_ = State::Closed;
      release_turn();
      return {writer_.bye("goodbye"), true};
    default:
      return refuse({wire::ErrorCode::UnexpectedMessage, cat(payload_name(type), " is not a message an edge sends")});
  }
  return refuse({wire::ErrorCode::UnexpectedMessage,
                 cat(payload_name(type), training ? " after the session started" : " before Hello")});
}

CloudReply CloudSession::on_hello(const wire::Hello& hello) {
  if (hello.protocol_version() != kProtocolVersion)
    return refuse({wire::ErrorCode::ProtocolVersion, cat("the edge speaks protocol ", hello.protocol_version(),
                                                         ", this cloud speaks ", kProtocolVersion)});
  const auto* hash = hello.model_hash();
  if (!hash || hash->size() != 32 || !std::equal(hash->begin(), hash->end(), config_.model_hash.begin())) {
    const std::string theirs = hash ? to_hex(hash->data(), std::min<std::size_t>(hash->size(), 32)) : "none";
    return refuse({wire::ErrorCode::ModelMismatch,
                   cat("the edge's model spec or cut differs from the cloud's (hash ", theirs.substr(0, 16),
                       "... vs ", to_hex(config_.model_hash.data(), 32).substr(0, 16), "...)")});
  }
  if (!valid_client_id(hello.client_id()))
    return refuse({wire::ErrorCode::Malformed,
                   "the client id must be 1 to 64 letters, digits, '.', '_' or '-', not starting with '.'"});
  client_id_ = hello.client_id()->str();
  // The client id names this edge's checkpoints and its place in a federation: it must be
  // the identity the connection proved, never one the Hello merely claims.
  if (!config_.peer_identity.empty() && client_id_ != config_.peer_identity)
    return refuse({wire::ErrorCode::Unauthorized,
                   cat("the Hello says client id '", client_id_, "' but the client certificate was issued to '",
                       config_.peer_identity, "': an edge trains only as the identity it holds")});
  if (config_.authorize) {
    const std::string why = config_.authorize(hello.token() ? hello.token()->str() : "", client_id_);
    if (!why.empty()) return refuse({wire::ErrorCode::Unauthorized, why});
  }
  bool agreed = false;
  std::string offered;
  if (hello.dtypes())
    for (auto d : *hello.dtypes()) {
      offered += cat(offered.empty() ? "" : ", ", static_cast<int>(d) <= static_cast<int>(wire::DType::MAX)
                                                       ? dtype_name(d) : "unknown");
      if (!agreed && std::find(config_.dtypes.begin(), config_.dtypes.end(), d) != config_.dtypes.end()) {
        dtype_ = d;
        agreed = true;
      }
    }
  if (!agreed) {
    std::string takes;
    for (auto d : config_.dtypes) takes += cat(takes.empty() ? "" : ", ", dtype_name(d));
    return refuse({wire::ErrorCode::BadTensor,
                   cat("the edge offers no wire dtype this cloud takes (offered: ", offered.empty() ? "none" : offered,
                       "; this cloud takes ", takes, ")")});
  }
  // Replicas of the shard: an edge joins at a round's boundary, resuming from one too, so its
  // steps and rounds are the set's (BackShardBatches::admit).
  if (config_.take_place)
    if (const std::string busy = config_.take_place(); !busy.empty()) return refuse({wire::ErrorCode::Busy, busy});
  if (BackShardBatches* b = shard_.batches(); b && b->replica_windows() && config_.federation) {
    const uint32_t every = config_.federation->options().aggregate_every;
    if (hello.resume_step() % every != 0)
      return refuse({wire::ErrorCode::NoCheckpoint,
                     cat("this replica set takes a resuming edge at a round's boundary, and step ", hello.resume_step(),
                         " is none (a round is ", every, " steps): give the edge --checkpoint-every a multiple of ",
                         every, " and resume it from there")});
    if (!b->admit(config_.session_id, cancelled_))
      return refuse({wire::ErrorCode::Internal, "the session closed while waiting for the replica set's next round"});
  }
  WireError error;
  // In a federation the shared back shard is the cloud's round checkpoint, not the edge's:
  // a resuming edge keeps its step and data cursor and takes the newest average.
  if (hello.resume_step() > 0 && config_.federation) step_ = hello.resume_step();
  if (hello.resume_step() > 0 && !config_.federation && !resume(hello.resume_step(), error)) return refuse(error);
  state_ = State::Training;
  decoded_.resize(config_.microbatches + 1);
  const std::string next_token = config_.authorize && config_.next_token ? config_.next_token(client_id_) : "";
  if (!config_.federation)
    return {writer_.welcome(config_.session_id, config_.batch_size, config_.microbatches, step_, dtype_, 0, 0, next_token),
            false};
  CloudReply reply{{}, false, config_.federation->join(config_.session_id, client_id_)};
  joined_ = true;
  const uint32_t round = reply.then.empty() ? 0 : config_.federation->round();
  reply.bytes = writer_.welcome(config_.session_id, config_.batch_size, config_.microbatches, step_, dtype_,
                                config_.federation->options().aggregate_every, round, next_token);
  return reply;
}

bool CloudSession::checked_batch(const Frame& frame, const wire::TensorMsg* t,
                                 const flatbuffers::Vector<int32_t>* labels, const flatbuffers::Vector<uint8_t>* mask,
                                 int64_t count, std::size_t slot, WireError& error) {
  if (u_shaped_) {
    if (labels != nullptr) {
      error = {wire::ErrorCode::BadTensor, cat("this cloud runs the middle of a U-shaped split (cut '", config_.cut,
                                               "'): the labels stay at the edge, and a message carrying them is refused")};
      return false;
    }
  } else if (!check_labels(labels, count, config_.classes, error)) {
    return false;
  }
  // With length buckets a micro-batch runs at its own length: the activations' second
  // dimension, which must be a bucket; the mask comes at that length too.
  const GraphInput& cut = back_.graph().inputs()[0];
  int64_t length = -1;
  if (cut.tokens && t && t->shape() && t->shape()->size() >= 2) {
    length = int64_at(*t->shape(), 1);
    const auto& buckets = back_.graph().length_buckets();
    if (std::find(buckets.begin(), buckets.end(), length) == buckets.end()) {
      error = {wire::ErrorCode::BadTensor, cat("activations of ", length, " tokens: this model runs sequences at its "
                                               "length buckets ", back_.graph().buckets_text(), " only")};
      return false;
    }
  }
  if (!read_mask(mask, count, mask_tokens_ > 0 && length > 0 ? length : mask_tokens_, masks_[slot], error)) return false;
  std::vector<Tensor>& in = inputs_[slot];
  in[0] = read_tensor(frame, t, Graph::at_length(cut.shape, cut.tokens, length).batched(count), "activations", dtype_,
                      decoded_[slot], error);
  if (mask_tokens_ > 0) in[1] = masks_[slot];
  return in[0].defined();
}

CloudReply CloudSession::on_forward(const Frame& frame, const wire::Forward& fwd) {
  WireError error;
  if (fwd.step() != step_) {
    check_window(fwd.step(), fwd.microbatch(), step_, step_microbatches_ ? step_microbatches_ : config_.microbatches,
                 error);
    return refuse(error);
  }
  if (seen_count_ == 0) {  // the step's first micro-batch fixes its shape
    const uint32_t samples = fwd.step_samples(), k = fwd.step_microbatches();
    if (samples < 1 || samples > config_.batch_size || k < 1 || k > config_.microbatches || k > samples)
      return refuse({wire::ErrorCode::BadTensor,
                     cat("step ", step_, " announces ", samples, " samples in ", k, " micro-batches (session: batch ",
                         config_.batch_size, ", ", config_.microbatches, " micro-batches)")});
    const float scale = fwd.lr_scale();
    if (!(scale >= 0.0f && scale <= kMaxLrScale))
      return refuse({wire::ErrorCode::BadTensor,
                     cat("step ", step_, " asks for a learning-rate scale of ", scale, ", outside [0, ", kMaxLrScale, "]")});
    if (fwd.checkpoint() && config_.checkpoints == nullptr)
      return refuse({wire::ErrorCode::NoCheckpoint, "this cloud keeps no checkpoints (serve it with a state folder)"});
    // A shared back shard: this session's step runs alone on it, from here to the update.
    if (!shard_.begin_step(config_.session_id, cancelled_, k))
      return refuse({wire::ErrorCode::Internal, "the session closed while waiting for its turn on the back shard"});
    step_samples_ = samples;
    step_microbatches_ = k;
    step_lr_scale_ = scale;
    step_checkpoint_ = fwd.checkpoint();
  } else if (fwd.step_samples() != step_samples_ || fwd.step_microbatches() != step_microbatches_ ||
             fwd.lr_scale() != step_lr_scale_ || fwd.checkpoint() != step_checkpoint_) {
    return refuse({wire::ErrorCode::BadTensor, cat("step ", step_, " changed its size, learning-rate scale or "
                                                   "checkpoint flag between micro-batches")});
  }
  if (!check_window(fwd.step(), fwd.microbatch(), step_, step_microbatches_, error)) return refuse(error);
  const uint32_t mb = fwd.microbatch();
  if (seen_[mb])
    return refuse({wire::ErrorCode::OutOfWindow, cat("micro-batch ", mb, " of step ", step_, " arrived twice")});
  const int64_t count = microbatch_range(step_samples_, step_microbatches_, mb).count;
  if (!checked_batch(frame, fwd.activations(), fwd.labels(), fwd.mask(), count, mb, error)) return refuse(error);
  const std::vector<Tensor>& activations = inputs_[mb];  // and the mask, when the shard reads one
  if (shard_.batched()) return on_batched_forward(*fwd.labels(), mb, count);

  if (!shard_.begin_compute(config_.session_id)) return refuse(evicted());
  const auto t0 = std::chrono::steady_clock::now();
  back_.set_training(true);
  // A micro-batch refused after its forward leaves the shard's running statistics (batch
  // norm) as they were: on a shared shard they are every edge's.
  const bool keep_state = back_.has_state();
  if (keep_state) back_.save_state(state_before_);
  auto refuse_after_forward = [&](const WireError& why) {
    if (keep_state) back_.restore_state(state_before_);
    shard_.end_compute();
    return refuse(why);
  };
  if (u_shaped_) {  // the middle's output goes down; its gradient comes back (on_middle_gradient)
    const Tensor& out = stage_.forward(activations, static_cast<int>(mb));
    if (!all_finite(out))
      return refuse_after_forward({wire::ErrorCode::BadTensor, cat("step ", step_, " micro-batch ", mb,
                                                                   ": the activations overflow the middle shard (a "
                                                                   "non-finite output)")});
    seen_[mb] = true;
    ++seen_count_;
    trained_samples_ += static_cast<uint64_t>(count);
    busy_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const CloudReply reply{writer_.middle_output(step_, mb, out, dtype_, static_cast<uint64_t>(optimizer_.steps())), false};
    shard_.end_compute();
    return reply;
  }
  const Stage::LossPass pass = stage_.train_loss(activations, static_cast<int>(mb), fwd.labels()->data(),
                                                 1.0f / static_cast<float>(step_samples_), true, config_.defer_weights);
  if (!pass.finite) return refuse_after_forward(overflow(step_, mb, true));  // no gradient ran
  const Tensor& grad = pass.input_grad;
  const double loss = pass.loss;
  if (!all_finite(grad)) return refuse_after_forward(overflow(step_, mb, false));
  seen_[mb] = true;
  ++seen_count_;
  trained_samples_ += static_cast<uint64_t>(count);
  train_loss_sum_ += loss;
  const uint64_t step = step_;
  microbatch_done(mb);
  busy_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The gradient is encoded before the update changes anything it could alias.
  const CloudReply reply{writer_.backward(step, mb, grad, static_cast<float>(loss), dtype_,
                                          static_cast<uint64_t>(optimizer_.steps())),
                         false};
  shard_.end_compute();
  // (A federation's shared back shard is kept per round instead: save_round.)
  if (step_pending_ && step_checkpoint_ && !config_.federation && !checkpoint_now(error)) return refuse(error);
  return reply;
}

CloudReply CloudSession::on_batched_forward(const flatbuffers::Vector<int32_t>& labels, uint32_t mb, int64_t count) {
  BatchedMicrobatch batched;
  batched.inputs = inputs_[mb];
  batched.labels = labels.data();
  batched.loss_scale = 1.0f / static_cast<float>(step_samples_);
  batched.grad = &batched_grad_;
  const bool trained = shard_.run_batched(config_.session_id, batched, cancelled_);
  busy_s_ += batched.compute_s;  // (its share of the batch, not the time it waited for it)
  if (!trained) {
    switch (batched.outcome) {
      case BatchedMicrobatch::Outcome::NonFiniteLoss: return refuse(overflow(step_, mb, true));
      case BatchedMicrobatch::Outcome::NonFiniteGradient: return refuse(overflow(step_, mb, false));
      case BatchedMicrobatch::Outcome::Evicted: return refuse(evicted());
      case BatchedMicrobatch::Outcome::Closed:
        return refuse({wire::ErrorCode::Internal, "the session closed while its micro-batch waited for its batch"});
      default: return refuse({wire::ErrorCode::Internal, cat("the cloud failed on this session: ", batched.failure)});
    }
  }
  seen_[mb] = true;
  ++seen_count_;
  trained_samples_ += static_cast<uint64_t>(count);
  train_loss_sum_ += batched.loss;
  const uint64_t step = step_;
  microbatch_done(mb);
  const CloudReply reply{writer_.backward(step, mb, batched_grad_, static_cast<float>(batched.loss), dtype_,
                                          batched.weight_version),
                         false};
  WireError error;
  if (step_pending_ && step_checkpoint_ && !config_.federation && !checkpoint_now(error)) return refuse(error);
  return reply;
}

void CloudSession::microbatch_done(uint32_t mb) {
  if (config_.defer_weights && !shard_.batched()) deferred_.push_back(mb);  // (a batched shard defers its own)
  const uint32_t done = u_shaped_ ? ++middle_backed_count_ : seen_count_;
  if (done < step_microbatches_) return;
  step_pending_ = true;  // applied once the reply is on its way (finish_step)
  ++step_;
  seen_count_ = middle_backed_count_ = 0;
  std::fill(seen_.begin(), seen_.end(), false);
  std::fill(middle_backed_.begin(), middle_backed_.end(), false);
}

CloudReply CloudSession::on_middle_gradient(const Frame& frame, const wire::MiddleGradient& mg) {
  const uint32_t mb = mg.microbatch();
  if (mg.step() != step_ || seen_count_ == 0 || mb >= step_microbatches_ || !seen_[mb] || middle_backed_[mb])
    return refuse({wire::ErrorCode::OutOfWindow, cat("MiddleGradient for step ", mg.step(), " micro-batch ", mb,
                                                     " was not expected (the middle's output for it has not left, or "
                                                     "its gradient came already; step ", step_, ")")});
  if (!std::isfinite(mg.loss()))
    return refuse({wire::ErrorCode::BadTensor, cat("step ", step_, " micro-batch ", mb, ": the loss is not finite")});
  WireError error;
  const Tensor& out = back_.output(static_cast<int>(mb));
  // Its own buffer: decoded_[mb] may hold the activations the middle's backward reads.
  Tensor grad_out = read_tensor(frame, mg.gradients(), out.shape(), "gradients", dtype_, decoded_grads_[mb], error);
  if (!grad_out.defined()) return refuse(error);
  if (!shard_.begin_compute(config_.session_id)) return refuse(evicted());
  const auto t0 = std::chrono::steady_clock::now();
  const Tensor grad = stage_.backward(grad_out, static_cast<int>(mb), true, config_.defer_weights);
  if (!all_finite(grad)) {
    shard_.end_compute();
    return refuse({wire::ErrorCode::BadTensor, cat("step ", step_, " micro-batch ", mb, ": the gradient overflows the "
                                                   "middle shard (non-finite); it is far outside any trained range")});
  }
  middle_backed_[mb] = true;
  train_loss_sum_ += mg.loss();
  const uint64_t step = step_;
  microbatch_done(mb);
  busy_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const CloudReply reply{writer_.backward(step, mb, grad, mg.loss(), dtype_, static_cast<uint64_t>(optimizer_.steps())),
                         false};
  shard_.end_compute();
  WireError save_error;
  if (step_pending_ && step_checkpoint_ && !config_.federation && !checkpoint_now(save_error)) return refuse(save_error);
  return reply;
}

bool CloudSession::checkpoint_now(WireError& error) {
  finish_step();
  CheckpointMeta meta;
  meta.role = "cloud";
  meta.client_id = client_id_;
  meta.cut = config_.cut;
  meta.model_hash = config_.model_hash;
  meta.step = step_;
  try {
    config_.checkpoints->save(client_id_, step_, encode_checkpoint(meta, back_, &optimizer_));
  } catch (const Error& e) {
    error = {wire::ErrorCode::Internal, cat("the cloud cannot save its checkpoint of step ", step_, ": ", e.what())};
    return false;
  }
  return true;
}

bool CloudSession::resume(uint64_t step, WireError& error) {
  if (config_.checkpoints == nullptr) {
    error = {wire::ErrorCode::NoCheckpoint, "this cloud keeps no checkpoints; start the edge afresh"};
    return false;
  }
  try {
    const CheckpointData data = config_.checkpoints->load(client_id_, step);
    if (data.meta.model_hash != config_.model_hash || data.meta.role != "cloud")
      fail("checkpoint", "it was written for another model, cut or role");
    restore_checkpoint(data, back_, &optimizer_);
  } catch (const Error& e) {
    error = {wire::ErrorCode::NoCheckpoint,
             cat("cannot resume client '", client_id_, "' at step ", step, ": ", e.what())};
    return false;
  }
  step_ = step;
  return true;
}

CloudReply CloudSession::on_eval(const Frame& frame, const wire::EvalForward& eval) {
  WireError error;
  // U-shaped: no labels; the batch's size is the activations' first dimension.
  const wire::TensorMsg* t = eval.activations();
  const int64_t rows = t && t->shape() && t->shape()->size() > 0 ? int64_at(*t->shape(), 0) : 0;
  const uint32_t count = !u_shaped_ ? (eval.labels() ? eval.labels()->size() : 0)
                                    : (rows > 0 && rows <= kMaxEvalBatch ? static_cast<uint32_t>(rows) : 0);
  if (count < 1 || count > kMaxEvalBatch)
    return refuse({wire::ErrorCode::BadTensor, cat("evaluation batch of ", count, " samples is outside [1, ",
                                                   kMaxEvalBatch, "]")});
  if (!checked_batch(frame, eval.activations(), eval.labels(), eval.mask(), count, config_.microbatches, error))
    return refuse(error);
  const std::vector<Tensor>& activations = inputs_[config_.microbatches];
  // On a shared back shard, between steps: a turn of its own for this batch.
  // (Batched: every evaluation, since the shard is busy with others' batches mid-step too.)
  const bool own_turn = shard_.batched() || (shard_.shared() && seen_count_ == 0 && !step_pending_);
  if (own_turn && !shard_.begin_eval(config_.session_id, cancelled_))
    return refuse({wire::ErrorCode::Internal, "the session closed while waiting for its turn on the back shard"});
  if (!shard_.begin_compute(config_.session_id)) return refuse(evicted());
  const auto t0 = std::chrono::steady_clock::now();
  // A slot of its own, so evaluation never disturbs a training step's stashes.
  back_.set_training(false);
  if (u_shaped_) {  // the edge's tail scores it
    const Tensor& out = eval_forward(activations);
    busy_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const CloudReply reply{writer_.eval_middle_output(eval.batch_id(), out, dtype_, busy_s_), false};
    shard_.end_compute();
    if (own_turn) shard_.end_eval(config_.session_id);
    return reply;
  }
  const Tensor& logits = eval_forward(activations);
  const double loss = stage_.loss(logits, eval.labels()->data(), 1.0f, nullptr);
  const auto correct = static_cast<uint32_t>(stage_.correct(logits, eval.labels()->data()));
  busy_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const CloudReply reply{writer_.eval_result(eval.batch_id(), correct, count, loss, busy_s_), false};
  shard_.end_compute();
  if (own_turn) shard_.end_eval(config_.session_id);
  return reply;
}

const Tensor& CloudSession::eval_forward(std::span<const Tensor> inputs) {
  const int64_t piece = (static_cast<int64_t>(config_.batch_size) + config_.microbatches - 1) / config_.microbatches;
  return back_.forward_in_pieces(inputs, static_cast<int>(config_.microbatches), piece, eval_joined_);
}

WireError CloudSession::evicted() const {
  return {wire::ErrorCode::OutOfWindow, "this edge held the shared back shard mid-step without progress for longer "
                                        "than the round deadline and lost its step; reconnect to rejoin"};
}

CloudReply CloudSession::on_front_weights(const Frame& frame, const wire::FrontWeights& weights) {
  if (!config_.federation)
    return refuse({wire::ErrorCode::UnexpectedMessage, "FrontWeights to a cloud that does not federate"});
  const uint32_t every = config_.federation->options().aggregate_every;
  if (seen_count_ != 0 || step_pending_ || step_ == 0 || (step_ % every != 0 && !weights.final()) ||
      submitted_step_ == step_)
    return refuse({wire::ErrorCode::OutOfWindow, cat("FrontWeights at step ", step_, " (they are due after every ",
                                                     every, " steps and after the last, between steps, once)")});
  // Its last front: it steps no more, so a replica's windows go on without it (the set's edges
  // that train on close the round with it, at their boundary).
  if (weights.final())
    if (BackShardBatches* b = shard_.batches()) b->retire(config_.session_id);
  WireError error;
  if (!config_.federation->submit(config_.session_id, frame, weights,
                                  static_cast<uint64_t>(every) * config_.batch_size, error))
    return refuse(error);
  submitted_step_ = step_;
  return {};  // the Aggregated comes when the round closes
}

}  // namespace tandem
