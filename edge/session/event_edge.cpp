#include "edge/session/event_edge.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>

#include "backends/registry.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/length_buckets.h"
#include "core/privacy/rdp_accountant.h"
#include "core/microbatch.h"
#include "data/epoch_order.h"

namespace tandem {
namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
      continue;
    }
    out += c;
  }
  return out + "\"";
}

// Epsilon spent on the cut; null when it is unbounded (clipping without noise).
std::string dp_json(double epsilon) {
  if (epsilon < 0) return "";
  return std::isinf(epsilon) ? std::string(",\"dp_epsilon\":null") : cat(",\"dp_epsilon\":", num(epsilon));
}

}  // namespace

double busy_backoff_s(int attempt) {
  static std::mt19937_64 jitter{std::random_device{}()};
  const double base = std::min(30.0, std::ldexp(1.0, std::min(attempt - 1, 5)));
  return base * std::uniform_real_distribution<double>(0.5, 1.5)(jitter);
}

std::string EdgeEvent::json() const {
  using K = Kind;
  switch (kind) {
    case K::Connected:
      return "{\"event\":\"connected\"}";
    case K::Welcome:
      return cat("{\"event\":\"welcome\",\"start_step\":", step, ",\"dtype\":", quoted(dtype),
                 ",\"aggregate_every\":", aggregate_every, "}");
    case K::EpochStarted:
      return cat("{\"event\":\"epoch_started\",\"epoch\":", epoch, ",\"samples\":", samples, ",\"cursor\":", cursor, "}");
    case K::Step:
      return cat("{\"event\":\"step\",\"step\":", steps_done, ",\"steps\":", steps, ",\"loss\":", num(loss),
                 ",\"samples_per_s\":", num(samples_per_s), ",\"edge_busy_s\":", num(edge_busy_s),
                 ",\"elapsed_s\":", num(seconds), dcor < 0 ? "" : cat(",\"dcor\":", num(dcor)), dp_json(epsilon), "}");
    case K::Round:
      return cat("{\"event\":\"round\",\"round\":", round, ",\"step\":", step, "}");
    case K::EpochTrained:
      return cat("{\"event\":\"epoch\",\"epoch\":", epoch, ",\"samples\":", samples, ",\"seconds\":", num(seconds),
                 ",\"train_loss\":", num(loss), first_grad_ms < 0 ? "" : cat(",\"first_grad_ms\":", num(first_grad_ms)),
                 dcor < 0 ? "" : cat(",\"dcor\":", num(dcor)),
                 tokens_per_sample < 0 ? "" : cat(",\"tokens_per_sample\":", num(tokens_per_sample)),
                 dp_json(epsilon), "}");
    case K::Evaluated:
      return cat("{\"event\":\"evaluated\",\"accuracy\":", num(accuracy), ",\"samples\":", samples,
                 ",\"epoch\":", epoch, "}");
    case K::Done:
      return cat("{\"event\":\"done\",\"steps\":", steps_done, ",\"first_loss\":", num(first_loss),
                 ",\"last_loss\":", num(loss), accuracy >= 0 ? cat(",\"test_accuracy\":", num(accuracy)) : "",
                 dp_json(epsilon), text.empty() ? "" : cat(",\"stopped\":", quoted(text)), "}");
    case K::Error:
      return cat("{\"event\":\"error\",\"text\":", quoted(text), "}");
    case K::Retry:
      return cat("{\"event\":\"retry\",\"attempt\":", attempt, ",\"of\":", attempts, ",\"wait_s\":", num(seconds),
                 ",\"text\":", quoted(text), "}");
    case K::Reconnect:
      return cat("{\"event\":\"reconnect\",\"attempt\":", attempt, ",\"of\":", attempts, ",\"wait_s\":", num(seconds),
                 ",\"step\":", step, ",\"steps_redone\":", steps_done, ",\"text\":", quoted(text), "}");
  }
  return "{}";
}

std::string EdgePrivacy::problem() const {
  if (!(dp_clip >= 0.0f && dp_noise >= 0.0f && dp_epsilon_budget >= 0.0 && dp_delta > 0.0 && dp_delta < 1.0))
    return "--dp-clip, --dp-noise and --dp-epsilon-budget must be >= 0 and --dp-delta in (0, 1)";
  if ((dp_noise > 0.0f || dp_epsilon_budget > 0.0) && dp_clip <= 0.0f)
    return "--dp-noise and --dp-epsilon-budget need --dp-clip C (the norm the noise is scaled to)";
  if (!(nopeek >= 0.0f)) return "--nopeek must be >= 0 (the weight of the distance-correlation penalty)";
  if (!(grad_clip >= 0.0f && grad_noise >= 0.0f)) return "--grad-clip and --grad-noise must be >= 0";
  if (grad_noise > 0.0f && grad_clip <= 0.0f) return "--grad-noise needs --grad-clip C (the norm the noise is scaled to)";
  if (!(label_noise >= 0.0f)) return "--label-noise must be >= 0";
  return "";
}

EventEdge::EventEdge(const ModelSpec& spec, EventEdgeConfig config, Send send, Emit emit)
    : config_(std::move(config)), send_(std::move(send)), emit_(std::move(emit)), model_name_(spec.name) {
  if (EgressAudit* audit = config_.audit)  // what leaves is on record before it leaves
    send_ = [audit, send = std::move(send_)](std::span<const uint8_t> bytes) {
      audit->record(bytes);
      send(bytes);
    };
  const Graph graph = Graph::build(spec);
  if (config_.cut.empty()) config_.cut = graph.default_cut();
  if (config_.cut.empty()) fail("edge", "the model spec names no default cut: give one");
  if (config_.batch < 1 || config_.microbatches < 1 || config_.eval_chunk < 1)
    fail("edge", "batch, micro-batches and the evaluation chunk must be at least 1");
  if (config_.steps < 0 || config_.epochs < 0) fail("edge", "steps and epochs must be at least 0");
  inputs_ = graph.inputs();
  if (!graph.length_buckets().empty())
    for (std::size_t i = 0; i < inputs_.size(); ++i)
      if (inputs_[i].mask) mask_input_ = static_cast<int>(i);
  if (config_.group_by_length && mask_input_ < 0)
    fail("edge", "grouping batches by length needs length buckets: add length_buckets to the spec's mask input");
  classes_ = static_cast<int32_t>(graph.classes());
  backend_ = make_backend(config_.backend, BackendOptions{config_.threads});
  const Graph front_graph = graph.split(config_.cut).first;
  front_ = std::make_unique<Network>(front_graph, *backend_, config_.seed);
  front_->set_recompute(config_.recompute);
  model_ = {front_.get()};
  if (u_shaped_cut(config_.cut)) {  // the edge also runs the tail and the loss: the labels stay here
    tail_ = std::make_unique<Network>(graph.tail(config_.cut), *backend_, config_.seed);
    model_.push_back(tail_.get());
  }
  for (Network* net : model_) {
    if (config_.init_front)
      config_.init_front(graph, *net);
    else
      init_from_whole_model(graph, config_.seed, *net, *make_backend("reference"));  // as the cloud draws its shard
  }
  std::vector<Param*> params = front_->params();
  if (tail_) params.insert(params.end(), tail_->params().begin(), tail_->params().end());
  optimizer_ = make_optimizer(params, config_.optimizer);
  position_.role = "edge";
  position_.client_id = config_.client_id;
  position_.cut = config_.cut;
  position_.model_hash = model_hash(spec, config_.cut);
  session_ = std::make_unique<EdgeSession>(*front_, *optimizer_, config_.microbatches, position_.model_hash,
                                           config_.client_id, config_.dtypes);
  const int64_t batch = std::max<int64_t>(config_.batch, 1);
  const int64_t k = std::clamp<int64_t>(config_.microbatches, 1, batch);
  const int64_t microbatch = (batch + k - 1) / k;  // the largest of a step's (microbatch_range)
  session_->set_eval_microbatch(microbatch);
  // An EvalForward carries a chunk of test samples' activations. This edge runs a chunk a
  // training micro-batch at a time, on training's kernels and memory, and holds the chunk's
  // activations three times while it leaves (put together, in the message, in the egress
  // audit's check), so a chunk is the most whole micro-batches within kEvalMessageBytes, at
  // least one (no larger than a training Forward), at most config_.eval_chunk: evaluation
  // then costs the edge no more than training (spam-bert's cut is 128 KiB a mail: 48-mail
  // chunks held 20 MiB at the peak). The cloud scores a chunk in pieces of its own micro-batch.
  const int64_t cut_bytes = front_graph.nodes()[static_cast<std::size_t>(front_graph.output())].shape.numel() * 4;
  const int64_t fits = kEvalMessageBytes / std::max<int64_t>(cut_bytes, 1) / microbatch * microbatch;
  eval_chunk_ = std::clamp<int64_t>(std::max(fits, microbatch), 1, config_.eval_chunk);
  if (eval_chunk_ > microbatch) eval_chunk_ = eval_chunk_ / microbatch * microbatch;
  if (!config_.token.empty()) session_->set_token(config_.token);
  if (tail_) session_->set_tail(tail_.get());
  // The cloud's shard reads the mask (its attention does): it goes up with the activations.
  const Graph cloud_shard = graph.split(config_.cut).second;
  for (std::size_t i = 0; cloud_shard.inputs().size() > 1 && i < inputs_.size(); ++i)
    if (inputs_[i].name == cloud_shard.inputs()[1].name) session_->set_mask_input(static_cast<int>(i));
  if (config_.privacy.grad_clip > 0.0f) {
    if (!tail_)
      fail("edge", cat("--grad-clip protects the labels of a U-shaped split (a cut \"A,B\"); cut '", config_.cut,
                       "' sends the labels themselves"));
    grad_noise_ = std::make_unique<CutNoise>(config_.privacy.grad_clip, config_.privacy.grad_noise, config_.privacy.dp_seed);
    session_->set_gradient_noise(grad_noise_.get());
  }
  if (config_.privacy.label_noise > 0.0f) {
    if (!tail_)
      fail("edge", cat("--label-noise protects the labels of a U-shaped split (a cut \"A,B\"); cut '", config_.cut,
                       "' sends the labels themselves"));
    if (graph.loss() != "softmax_cross_entropy")
      fail("edge", cat("--label-noise needs a softmax cross-entropy model (its loss gradient's bound), not '", graph.loss(), "'"));
    // Each head's p - onehot(y) has L2 norm at most sqrt(2): the clip at that bound never
    // bites, and the noise is label_noise per value.
    const float bound = std::sqrt(2.0f * static_cast<float>(graph.output_groups()));
    label_noise_ = std::make_unique<CutNoise>(bound, config_.privacy.label_noise / bound, config_.privacy.dp_seed);
    session_->set_label_noise(label_noise_.get());
  }
  session_->set_proximal(config_.proximal_mu);
  session_->set_nopeek(config_.privacy.nopeek);
  if (config_.privacy.dp_clip > 0.0f) {
    noise_ = std::make_unique<CutNoise>(config_.privacy.dp_clip, config_.privacy.dp_noise, config_.privacy.dp_seed);
    session_->set_cut_noise(noise_.get(), config_.privacy.dp_noise_evaluation);
  }
  session_->set_front_updates(config_.front_updates_per_round ? EdgeSession::FrontUpdates::PerRound
                                                              : EdgeSession::FrontUpdates::PerStep);
  if (config_.async) {
    const char* with = tail_ ? "a U-shaped cut"
                       : config_.privacy.dp_clip > 0.0f ? "--dp-clip (noise on the cut)"
                       : config_.privacy.nopeek > 0.0f ? "--nopeek"
                       : config_.front_updates_per_round ? "--front-updates round" : nullptr;
    if (with) fail("edge", cat("--pipeline async is for plain split training, not with ", with));
    session_->set_async(true);
  }
  if (config_.checkpoints)
    if (const auto resumed = config_.checkpoints->resume(position_.model_hash, model_, *optimizer_)) {
      position_ = *resumed;
      session_->resume_from(position_.step);
      resumed_ = true;
    }
  // The releases a checkpoint's steps made, at least (a count kept from before it covers them).
  if (noise_ && config_.releases) config_.releases->at_least(position_.step);
  if (noise_) releases_ = position_.step;
}

EventEdge::~EventEdge() = default;

void EventEdge::set_data(bool test, const uint8_t* pixels, const int32_t* labels, int64_t n, int64_t h, int64_t w) {
  if (n < 1) fail("edge", "no images given");
  const Shape& input = inputs_[0].shape;
  if (inputs_.size() != 1 || Shape({h, w, 1}).numel() != input.numel())
    fail("edge", cat("images of ", h, "x", w, " do not fit the model's input ", input.str(),
                     inputs_.size() != 1 ? cat(" (it takes ", inputs_.size(), " inputs)") : std::string()));
  Tensor images = Tensor::empty(input.batched(n));
  float* out = images.data();
  for (int64_t i = 0, e = n * h * w; i < e; ++i) out[i] = static_cast<float>(pixels[i]) / 255.0f;
  set_data(test, std::move(images), std::vector<int32_t>(labels, labels + n));
}

void EventEdge::set_data(bool test, Tensor images, std::vector<int32_t> labels) {
  if (images.shape().rank() > 0 && inputs_.size() == 1 && images.shape().item_numel() == inputs_[0].shape.numel())
    images = images.reshape(inputs_[0].shape.batched(images.shape()[0]));  // e.g. [n, 784] for [28, 28, 1]
  std::vector<Tensor> inputs;
  inputs.push_back(std::move(images));
  set_data(test, std::move(inputs), std::move(labels));
}

// Each sample's length: its mask's last kept token (0: none kept).
std::vector<int32_t> EventEdge::sequence_lengths(const Tensor& mask) {
  const int64_t n = mask.shape()[0], tokens = mask.shape()[1];
  std::vector<int32_t> lengths(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    lengths[static_cast<std::size_t>(i)] = static_cast<int32_t>(kept_length(mask.data() + i * tokens, tokens));
  return lengths;
}

void EventEdge::set_data(bool test, std::vector<Tensor> inputs, std::vector<int32_t> labels) {
  if (inputs.size() != inputs_.size())
    fail("edge", cat("the model takes ", inputs_.size(), " inputs, given ", inputs.size()));
  const int64_t n = inputs[0].shape().rank() > 0 ? inputs[0].shape()[0] : 0;
  if (n < 1) fail("edge", "no samples given");
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const GraphInput& in = inputs_[i];
    if (inputs[i].shape() != in.shape.batched(n))
      fail("edge", cat("the model's input '", in.name, "' is ", in.shape.str(), " a sample but the data is ",
                       inputs[i].shape().str(), " for ", n, " samples"));
    if (!in.integer && !in.mask) continue;
    for (int64_t e = 0; e < inputs[i].numel(); ++e)
      if (!in.accepts(inputs[i][e]))
        fail("edge", cat("input '", in.name, "': ", inputs[i][e], " at element ", e, " is not ", in.rule()));
  }
  if (static_cast<int64_t>(labels.size()) != n)
    fail("edge", cat(n, " samples but ", labels.size(), " labels"));
  for (int64_t i = 0; i < n; ++i)
    if (labels[static_cast<std::size_t>(i)] < 0 || labels[static_cast<std::size_t>(i)] >= classes_)
      fail("edge", cat("label ", labels[static_cast<std::size_t>(i)], " of sample ", i, " is outside [0, ", classes_, ")"));
  if (mask_input_ >= 0 && (test || config_.group_by_length))
    (test ? test_lengths_ : train_lengths_) = sequence_lengths(inputs[static_cast<std::size_t>(mask_input_)]);
  (test ? test_ : train_) = Data{std::move(inputs), std::move(labels)};
}

void EventEdge::on_open() {
  if (state_ != State::Idle) return;
  if (!train_.given()) {
    fail_with("no training data was given");
    return;
  }
  const int64_t n = train_.count();
  if (position_.cursor > n || position_.epoch < 1) {
    fail_with(cat("the checkpoint stands at sample ", position_.cursor, " of epoch ", position_.epoch,
                  ", outside this data set of ", n, " (was the data or --limit changed?)"));
    return;
  }
  schedule_ = config_.schedule;
  if (schedule_.total_steps == 0) {
    const int64_t per_epoch = (n + config_.batch - 1) / config_.batch;
    schedule_.total_steps = config_.epochs > 0 ? config_.epochs * per_epoch : config_.steps;
    if (config_.epochs > 0 && config_.steps > 0) schedule_.total_steps = std::min(schedule_.total_steps, config_.steps);
  }
  try {
    validate(schedule_);
  } catch (const Error& e) {
    fail_with(e.what());
    return;
  }
  emit(event(EdgeEvent::Kind::Connected));
  started_ = std::chrono::steady_clock::now();
  state_ = State::AwaitWelcome;
  busy_.clear();
  // One run record however many Hellos it takes: a retry's Hello joins the same chain.
  if (config_.audit && !audit_begun_)
    config_.audit->begin_run(config_.client_id, model_name_, config_.cut, position_.model_hash);
  audit_begun_ = true;
  send_(session_->hello());
}

bool EventEdge::on_message(const Frame& frame) {
  WireError err;
  try {
    switch (state_) {
      case State::AwaitWelcome: {
        if (!session_->on_welcome(frame, err)) {
          if (err.code != wire::ErrorCode::Busy) return fail_with(err.text);
          busy_ = err.text;  // nothing has started: the owner may say Hello again later
          state_ = State::Idle;
          return false;
        }
        EdgeEvent e = event(EdgeEvent::Kind::Welcome);
        e.dtype = dtype_name(session_->dtype());
        emit(e);
        if (session_->awaiting_aggregate()) {  // a late edge: the newest average comes first
          state_ = State::AwaitAverage;
          after_average_ = AfterAverage::Continue;
          return true;
        }
        proceed();
        return !finished();
      }
      case State::Training: {
        bool done = false;
        const auto t0 = std::chrono::steady_clock::now();
        std::span<const uint8_t> reply;
        Batch& oldest = batch_of(session_->step());  // the step this message is for
        if (!session_->on_step_message(frame, err, done, reply)) return fail_with(err.text);
        if (oldest.awaiting_first_grad && reply.empty()) {  // the step's first Backward (not a MiddleOutput)
          first_grad_s_.push_back(std::chrono::duration<double>(t0 - oldest.sent).count());
          oldest.awaiting_first_grad = false;
        }
        if (!reply.empty()) send_(reply);  // U-shaped: the middle output's gradient goes back up
        busy_s_ += since(t0);
        if (!done) return true;
        const int64_t count = oldest.inputs[0].shape()[0], n = train_.count();
        const double loss = session_->step_loss_sum() / static_cast<double>(count);
        if (first_loss_ < 0) first_loss_ = loss;
        last_loss_ = loss;
        epoch_loss_sum_ += session_->step_loss_sum();
        ++steps_done_;
        samples_done_ += count;
        position_.step = session_->step();
        position_.cursor += count;
        EdgeEvent e = event(EdgeEvent::Kind::Step);
        e.samples = count;
        e.loss = loss;
        if (config_.privacy.nopeek > 0.0f) {
          e.dcor = session_->step_dcor();
          epoch_dcor_sum_ += e.dcor * static_cast<double>(count);
        }
        e.seconds = since(started_);
        e.samples_per_s = static_cast<double>(samples_done_) / std::max(e.seconds, 1e-9);
        const bool epoch_end = position_.cursor == n;
        if (epoch_end) {
          position_.epoch += 1;
          position_.cursor = 0;
        }
        if (oldest.saves) config_.checkpoints->save(position_, model_, *optimizer_);
        emit(e);
        samples_since_round_ += static_cast<uint64_t>(count);
        if (session_->steps_in_flight() > 0) {  // asynchronous: the step begun ahead goes on
          const auto t1 = std::chrono::steady_clock::now();
          start_ahead();
          busy_s_ += since(t1);
          return !finished();
        }
        if (session_->aggregate_due()) {
          send_front(/*final=*/false, epoch_end ? AfterAverage::EndEpoch : AfterAverage::Continue);
          return true;
        }
        after_step(epoch_end);
        return !finished();
      }
      case State::AwaitAverage: {
        if (!session_->on_aggregated(frame, err)) return fail_with(err.text);
        emit(event(EdgeEvent::Kind::Round));
        switch (after_average_) {
          case AfterAverage::Continue: proceed(); break;
          case AfterAverage::EndEpoch: end_epoch(); break;
          case AfterAverage::Finish: start_eval(/*final=*/true); break;
        }
        return !finished();
      }
      case State::Evaluating: {
        EdgeSession::EvalResult result;
        if (!session_->on_eval_result(frame, err, result)) return fail_with(err.text);
        eval_correct_ += result.correct;
        eval_seen_ += result.count;
        cloud_busy_s_ = result.cloud_busy_s;
        send_eval_batch();
        return !finished();
      }
      default:
        return fail_with(state_ == State::Idle ? "a message arrived before the connection opened"
                                               : "a message arrived after the run ended");
    }
  } catch (const Error& e) {  // a checkpoint that cannot be written, a kernel that refuses
    return fail_with(e.what());
  }
}

void EventEdge::on_closed(const std::string& why) {
  if (!finished()) fail_with(busy_.empty() ? why : busy_);
}

void EventEdge::stop(const std::string& why) {
  busy_.clear();
  if (!finished()) fail_with(why);
}

const char* EventEdge::awaiting() const {
  switch (state_) {
    case State::AwaitWelcome: return "Welcome";
    case State::Training: return tail_ ? "MiddleOutput or Backward" : "Backward";
    case State::AwaitAverage: return "Aggregated";
    case State::Evaluating: return "EvalResult";
    default: return "nothing";
  }
}

double EventEdge::epsilon_after(uint64_t releases) const {
  if (!noise_ || !train_.given()) return -1.0;
  if (config_.privacy.dp_noise <= 0.0f) return std::numeric_limits<double>::infinity();  // clipping alone proves nothing
  if (releases == 0) return 0.0;
  const double q = std::min(1.0, static_cast<double>(config_.batch) / static_cast<double>(train_.count()));
  return dp_epsilon(q, config_.privacy.dp_noise, releases, config_.privacy.dp_delta).epsilon;
}

bool EventEdge::budget_spent() const {
  return noise_ && config_.privacy.dp_epsilon_budget > 0.0 && epsilon_after(releases() + 1) > config_.privacy.dp_epsilon_budget;
}

bool EventEdge::run_over() const {
  if (budget_spent()) return true;
  if (config_.epochs == 0 && config_.steps == 0) return true;
  if (config_.epochs > 0 && position_.epoch > config_.epochs) return true;
  return config_.steps > 0 && steps_done_ >= config_.steps;
}

void EventEdge::proceed() {
  if (run_over()) return finish_run();
  start_step();
}

void EventEdge::after_step(bool epoch_end) {
  if (epoch_end) return end_epoch();
  proceed();
}

void EventEdge::start_step() {
  state_ = State::Training;
  just_ended_epoch_ = 0;
  const int64_t n = train_.count();
  const auto t0 = std::chrono::steady_clock::now();
  if (!epoch_open_) {  // each epoch a fresh permutation, drawn from (seed, epoch) alone
    order_ = epoch_order(n, config_.seed, position_.epoch);
    if (!train_lengths_.empty())
      group_by_length(order_, train_lengths_, config_.batch,
                      config_.seed ^ (static_cast<uint64_t>(position_.epoch) * 0x9e3779b97f4a7c15ULL));
    epoch_first_ = position_.cursor;
    epoch_tokens_first_ = session_->tokens_run();
    epoch_loss_sum_ = 0.0;
    epoch_started_ = t0;
    epoch_open_ = true;
    first_grad_s_.clear();
    epoch_dcor_sum_ = 0.0;
    EdgeEvent e = event(EdgeEvent::Kind::EpochStarted);
    e.samples = n;
    emit(e);
  }
  // Asynchronous, a step ahead: its batch follows the one in flight.
  const int64_t begin = position_.cursor + (session_->steps_in_flight() > 0 ? batch_of(session_->step()).inputs[0].shape()[0] : 0);
  const int64_t count = std::min<int64_t>(config_.batch, n - begin);
  const uint64_t number = session_->step() + static_cast<uint64_t>(session_->steps_in_flight());
  Batch& b = batch_of(number);
  b.inputs.resize(inputs_.size());
  b.labels.resize(static_cast<std::size_t>(count));
  for (std::size_t k = 0; k < inputs_.size(); ++k) {
    Tensor& batch = b.inputs[k];
    if (!batch.defined() || batch.shape()[0] != count) batch = Tensor::empty(inputs_[k].shape.batched(count));
    const int64_t item = inputs_[k].shape.numel();
    for (int64_t i = 0; i < count; ++i)
      std::copy_n(train_.inputs[k].data() + order_[static_cast<std::size_t>(begin + i)] * item, item,
                  batch.data() + i * item);
  }
  for (int64_t i = 0; i < count; ++i)
    b.labels[static_cast<std::size_t>(i)] = train_.labels[static_cast<std::size_t>(order_[static_cast<std::size_t>(begin + i)])];
  b.saves = config_.checkpoints && config_.checkpoints->due(number + 1, begin + count == n);
  if (noise_) {  // counted before it leaves: a step lost half-way released its activations too
    if (config_.releases)
      config_.releases->count_one();
    else
      ++releases_;
  }
  const int k = session_->begin_step(b.inputs, b.labels.data(), lr_factor(schedule_, static_cast<int64_t>(number)), b.saves);
  // Every activation leaves as soon as it is computed; gradients are applied as they come.
  for (int mb = 0; mb < k; ++mb) {
    const std::span<const uint8_t> forward = session_->forward(mb);
    if (config_.on_training_forward) {
      const MicrobatchRange r = microbatch_range(count, k, mb);
      config_.on_training_forward(position_.epoch, std::span(order_).subspan(static_cast<std::size_t>(begin + r.begin),
                                                                              static_cast<std::size_t>(r.count)),
                                  forward);
    }
    send_(forward);
    if (mb == 0) {
      b.sent = std::chrono::steady_clock::now();
      b.awaiting_first_grad = true;
    }
  }
  busy_s_ += since(t0);
  if (config_.async && session_->steps_in_flight() == 1) start_ahead();
}

void EventEdge::start_ahead() {
  const Batch& in_flight = batch_of(session_->step());
  const int64_t end = position_.cursor + in_flight.inputs[0].shape()[0];
  // These end with the step in flight: the epoch (evaluation, a new order), a checkpoint
  // (a step boundary to resume from), the run.
  if (end == train_.count() || in_flight.saves || (config_.steps > 0 && steps_done_ + 1 >= config_.steps)) return;
  start_step();
}

void EventEdge::end_epoch() {
  // The last epoch's steps join a round before it is reported, so the run ends on the average.
  if (run_over() && steps_done_ > 0 && session_->final_round_due())
    return send_front(/*final=*/true, AfterAverage::EndEpoch);
  const int64_t trained = train_.count() - epoch_first_;
  EdgeEvent e = event(EdgeEvent::Kind::EpochTrained);
  e.epoch = position_.epoch - 1;
  e.samples = trained;
  e.loss = epoch_loss_sum_ / static_cast<double>(std::max<int64_t>(trained, 1));
  e.seconds = since(epoch_started_);
  if (config_.privacy.nopeek > 0.0f) e.dcor = epoch_dcor_sum_ / static_cast<double>(std::max<int64_t>(trained, 1));
  if (mask_input_ >= 0)
    e.tokens_per_sample = static_cast<double>(session_->tokens_run() - epoch_tokens_first_) /
                          static_cast<double>(std::max<int64_t>(trained, 1));
  if (!first_grad_s_.empty()) {
    auto mid = first_grad_s_.begin() + static_cast<std::ptrdiff_t>(first_grad_s_.size() / 2);
    std::nth_element(first_grad_s_.begin(), mid, first_grad_s_.end());
    e.first_grad_ms = *mid * 1e3;
  }
  epoch_open_ = false;
  emit(e);
  just_ended_epoch_ = e.epoch;
  if (run_over()) return finish_run();
  if (config_.eval_each_epoch && test_.given()) return start_eval(/*final=*/false);
  start_step();
}

void EventEdge::finish_run() {
  // In a federation the last steps' front joins a round too, so the run ends on the average.
  if (steps_done_ > 0 && session_->final_round_due()) return send_front(/*final=*/true, AfterAverage::Finish);
  start_eval(/*final=*/true);
}

void EventEdge::send_front(bool final, AfterAverage then) {
  const auto t0 = std::chrono::steady_clock::now();
  send_(session_->front_weights(samples_since_round_, final));
  busy_s_ += since(t0);
  samples_since_round_ = 0;
  after_average_ = then;
  state_ = State::AwaitAverage;
}

void EventEdge::start_eval(bool final) {
  final_eval_ = final;
  if (!test_.given()) {
    if (!final) return start_step();
    return say_goodbye();
  }
  state_ = State::Evaluating;
  const int64_t n = test_.count();
  eval_end_ = config_.eval_samples > 0 ? std::min(config_.eval_samples, n) : n;
  eval_next_ = eval_correct_ = eval_seen_ = 0;
  // With length buckets the evaluated samples go longest first, so each chunk runs at the
  // bucket of its own longest; how many are right does not depend on the order.
  eval_order_.clear();
  if (!test_lengths_.empty()) {
    eval_order_.resize(static_cast<std::size_t>(eval_end_));
    std::iota(eval_order_.begin(), eval_order_.end(), 0);
    std::stable_sort(eval_order_.begin(), eval_order_.end(), [&](int64_t a, int64_t b) {
      return test_lengths_[static_cast<std::size_t>(a)] > test_lengths_[static_cast<std::size_t>(b)];
    });
  }
  send_eval_batch();
}

void EventEdge::send_eval_batch() {
  if (eval_next_ >= eval_end_) {
    accuracy_ = static_cast<double>(eval_correct_) / static_cast<double>(std::max<int64_t>(eval_seen_, 1));
    EdgeEvent e = event(EdgeEvent::Kind::Evaluated);
    e.epoch = just_ended_epoch_;
    e.samples = eval_seen_;
    emit(e);
    if (!final_eval_) return start_step();
    return say_goodbye();
  }
  const int64_t count = std::min(eval_chunk_, eval_end_ - eval_next_);
  const auto t0 = std::chrono::steady_clock::now();
  eval_inputs_.resize(inputs_.size());
  const int32_t* labels = test_.labels.data() + eval_next_;
  if (eval_order_.empty()) {
    for (std::size_t k = 0; k < inputs_.size(); ++k) eval_inputs_[k] = test_.inputs[k].slice_batch(eval_next_, count);
  } else {  // the chunk's samples gathered in eval_order_
    eval_gathered_.resize(inputs_.size());
    eval_labels_.resize(static_cast<std::size_t>(count));
    for (int64_t i = 0; i < count; ++i)
      eval_labels_[static_cast<std::size_t>(i)] =
          test_.labels[static_cast<std::size_t>(eval_order_[static_cast<std::size_t>(eval_next_ + i)])];
    labels = eval_labels_.data();
    for (std::size_t k = 0; k < inputs_.size(); ++k) {
      const int64_t item = inputs_[k].shape.numel();
      Tensor& chunk = eval_gathered_[k];
      if (!chunk.defined() || chunk.shape()[0] != count) chunk = Tensor::empty(inputs_[k].shape.batched(count));
      for (int64_t i = 0; i < count; ++i)
        std::copy_n(test_.inputs[k].data() + eval_order_[static_cast<std::size_t>(eval_next_ + i)] * item, item,
                    chunk.data() + i * item);
      eval_inputs_[k] = chunk;
    }
  }
  send_(session_->eval_forward(static_cast<uint64_t>(eval_next_), eval_inputs_, labels, count));
  busy_s_ += since(t0);
  eval_next_ += count;
}

void EventEdge::say_goodbye() {
  state_ = State::Done;
  send_(session_->bye("training finished"));
  emit(event(EdgeEvent::Kind::Done));
}

EdgeEvent EventEdge::event(EdgeEvent::Kind kind) const {
  EdgeEvent e;
  e.kind = kind;
  e.epoch = position_.epoch;
  e.step = session_->step();
  e.steps_done = steps_done_;
  e.steps = config_.steps;
  e.cursor = position_.cursor;
  e.loss = last_loss_;
  e.first_loss = first_loss_;
  e.accuracy = accuracy_;
  e.edge_busy_s = busy_s_;
  e.cloud_busy_s = cloud_busy_s_;
  e.round = session_->round();
  e.aggregate_every = session_->aggregate_every();
  e.epsilon = epsilon_after(releases());
  if (kind == EdgeEvent::Kind::Done && budget_spent())
    e.text = cat("the next step would pass the privacy budget (epsilon ", config_.privacy.dp_epsilon_budget, " at delta ",
                 config_.privacy.dp_delta, ")");
  return e;
}

bool EventEdge::fail_with(const std::string& text) {
  if (finished()) return false;
  state_ = State::Failed;
  EdgeEvent e = event(EdgeEvent::Kind::Error);
  e.text = text;
  emit(e);
  return false;
}

double EventEdge::since(std::chrono::steady_clock::time_point t) const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace tandem
