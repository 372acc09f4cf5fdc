#include "edge/session/event_edge.h"

#include <algorithm>
#include <cstdio>

#include "backends/registry.h"
#include "core/error.h"
#include "core/graph.h"
#include "data/epoch_order.h"

namespace tandem {
namespace {

constexpr int64_t kEvalChunk = 500;  // test samples per EvalForward

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

}  // namespace

EventEdge::EventEdge(const ModelSpec& spec, EventEdgeConfig config, Send send, Emit emit)
    : config_(std::move(config)), send_(std::move(send)), emit_(std::move(emit)) {
  const Graph graph = Graph::build(spec);
  if (config_.cut.empty()) config_.cut = graph.default_cut();
  if (config_.cut.empty()) fail("edge", "the model spec names no default cut: give one");
  if (config_.steps < 1 || config_.batch < 1 || config_.microbatches < 1)
    fail("edge", "steps, batch and micro-batches must be at least 1");
  if (graph.inputs().size() != 1) fail("edge", "the browser edge trains models with one image input");
  input_ = graph.inputs()[0].shape;
  classes_ = static_cast<int32_t>(graph.classes());
  backend_ = make_backend(config_.backend);
  front_ = std::make_unique<Network>(graph.split(config_.cut).first, *backend_, config_.seed);
  init_from_whole_model(graph, config_.seed, *front_, *make_backend("reference"));  // as the cloud draws its back shard
  optimizer_ = make_optimizer(front_->params(), config_.optimizer);
  session_ = std::make_unique<EdgeSession>(*front_, *optimizer_, config_.microbatches, model_hash(spec, config_.cut),
                                           config_.client_id, config_.dtypes);
  if (!config_.token.empty()) session_->set_token(config_.token);
  if (config_.front_updates_per_round) session_->set_front_updates(EdgeSession::FrontUpdates::PerRound);
}

EventEdge::~EventEdge() = default;

void EventEdge::set_data(bool test, const uint8_t* pixels, const int32_t* labels, int64_t n, int64_t h, int64_t w) {
  if (n < 1) fail("edge", "no images given");
  if (Shape({h, w, 1}).numel() != input_.numel())
    fail("edge", cat("images of ", h, "x", w, " do not fit the model's input ", input_.str()));
  for (int64_t i = 0; i < n; ++i)
    if (labels[i] < 0 || labels[i] >= classes_)
      fail("edge", cat("label ", labels[i], " of image ", i, " is outside [0, ", classes_, ")"));
  Data d;
  d.images = Tensor::empty(input_.batched(n));
  float* out = d.images.data();
  for (int64_t i = 0, e = n * h * w; i < e; ++i) out[i] = static_cast<float>(pixels[i]) / 255.0f;
  d.labels.assign(labels, labels + n);
  (test ? test_ : train_) = std::move(d);
}

void EventEdge::on_open() {
  if (state_ != State::Idle) return;
  if (!train_.images.defined()) {
    fail_with("no training images were given");
    return;
  }
  emit_("{\"event\":\"connected\"}");
  started_ = std::chrono::steady_clock::now();
  state_ = State::AwaitWelcome;
  send_(session_->hello());
}

bool EventEdge::on_message(const Frame& frame) {
  WireError err;
  switch (state_) {
    case State::AwaitWelcome:
      if (!session_->on_welcome(frame, err)) return fail_with(err.text);
      emit_(cat("{\"event\":\"welcome\",\"start_step\":", session_->step(), ",\"dtype\":",
                quoted(dtype_name(session_->dtype())), ",\"aggregate_every\":", session_->aggregate_every(), "}"));
      if (session_->awaiting_aggregate()) {  // a late edge: the newest average comes first
        state_ = State::AwaitAverage;
        return true;
      }
      state_ = State::Training;
      start_step();
      return !finished();
    case State::Training: {
      bool done = false;
      const auto t0 = std::chrono::steady_clock::now();
      if (!session_->on_backward(frame, err, done)) return fail_with(err.text);
      busy_s_ += since(t0);
      if (!done) return true;
      const double loss = session_->step_loss_sum() / static_cast<double>(batch_images_.shape()[0]);
      if (first_loss_ < 0) first_loss_ = loss;
      last_loss_ = loss;
      ++steps_done_;
      samples_done_ += batch_images_.shape()[0];
      const double elapsed = since(started_);
      emit_(cat("{\"event\":\"step\",\"step\":", steps_done_, ",\"steps\":", config_.steps, ",\"loss\":", num(loss),
                ",\"samples_per_s\":", num(static_cast<double>(samples_done_) / std::max(elapsed, 1e-9)),
                ",\"edge_busy_s\":", num(busy_s_), ",\"elapsed_s\":", num(elapsed), "}"));
      samples_since_round_ += static_cast<uint64_t>(batch_images_.shape()[0]);
      if (session_->aggregate_due()) {
        send_front(/*final=*/false);
        return true;
      }
      start_step();
      return !finished();
    }
    case State::AwaitAverage: {
      if (!session_->on_aggregated(frame, err)) return fail_with(err.text);
      emit_(cat("{\"event\":\"round\",\"round\":", session_->round(), ",\"step\":", session_->step(), "}"));
      state_ = State::Training;
      if (final_round_)
        start_eval();
      else
        start_step();
      return !finished();
    }
    case State::Evaluating: {
      EdgeSession::EvalResult result;
      if (!session_->on_eval_result(frame, err, result)) return fail_with(err.text);
      eval_correct_ += result.correct;
      eval_seen_ += result.count;
      send_eval_batch();
      return !finished();
    }
    default:
      return fail_with(state_ == State::Idle ? "a message arrived before the connection opened"
                                             : "a message arrived after the run ended");
  }
}

void EventEdge::on_closed(const std::string& why) {
  if (!finished()) fail_with(why);
}

void EventEdge::start_step() {
  if (steps_done_ >= config_.steps) {
    // In a federation the last steps' front joins a round too, so the run ends on the average.
    if (session_->final_round_due()) return send_front(/*final=*/true);
    return start_eval();
  }
  const int64_t n = train_.images.shape()[0];
  const int64_t b = std::min<int64_t>(config_.batch, n);
  const auto t0 = std::chrono::steady_clock::now();
  if (!batch_images_.defined() || batch_images_.shape()[0] != b) batch_images_ = Tensor::empty(input_.batched(b));
  batch_labels_.resize(static_cast<std::size_t>(b));
  const int64_t item = input_.numel();
  for (int64_t i = 0; i < b; ++i) {
    if (order_.empty() || cursor_ >= n) {  // a fresh permutation each epoch
      order_ = epoch_order(n, config_.seed, epoch_++);
      cursor_ = 0;
    }
    const int64_t src = order_[static_cast<std::size_t>(cursor_++)];
    std::copy_n(train_.images.data() + src * item, item, batch_images_.data() + i * item);
    batch_labels_[static_cast<std::size_t>(i)] = train_.labels[static_cast<std::size_t>(src)];
  }
  const int k = session_->begin_step(batch_images_, batch_labels_.data());
  for (int mb = 0; mb < k; ++mb) send_(session_->forward(mb));
  busy_s_ += since(t0);
}

void EventEdge::send_front(bool final) {
  const auto t0 = std::chrono::steady_clock::now();
  send_(session_->front_weights(samples_since_round_, final));
  busy_s_ += since(t0);
  samples_since_round_ = 0;
  final_round_ = final;
  state_ = State::AwaitAverage;
}

void EventEdge::start_eval() {
  state_ = State::Evaluating;
  if (!test_.images.defined()) {
    finish(cat("{\"event\":\"done\",\"steps\":", steps_done_, ",\"first_loss\":", num(first_loss_), ",\"last_loss\":",
               num(last_loss_), "}"));
    return;
  }
  const int64_t n = test_.images.shape()[0];
  eval_end_ = config_.eval_samples > 0 ? std::min(config_.eval_samples, n) : n;
  eval_next_ = eval_correct_ = eval_seen_ = 0;
  send_eval_batch();
}

void EventEdge::send_eval_batch() {
  if (eval_next_ >= eval_end_) {
    const double accuracy = static_cast<double>(eval_correct_) / static_cast<double>(std::max<int64_t>(eval_seen_, 1));
    emit_(cat("{\"event\":\"evaluated\",\"accuracy\":", num(accuracy), ",\"samples\":", eval_seen_, "}"));
    finish(cat("{\"event\":\"done\",\"steps\":", steps_done_, ",\"first_loss\":", num(first_loss_), ",\"last_loss\":",
               num(last_loss_), ",\"test_accuracy\":", num(accuracy), "}"));
    return;
  }
  const int64_t count = std::min(kEvalChunk, eval_end_ - eval_next_);
  const auto t0 = std::chrono::steady_clock::now();
  send_(session_->eval_forward(static_cast<uint64_t>(eval_next_), test_.images.slice_batch(eval_next_, count),
                               test_.labels.data() + eval_next_, count));
  busy_s_ += since(t0);
  eval_next_ += count;
}

void EventEdge::finish(const std::string& json) {
  state_ = State::Done;
  send_(session_->bye("training finished"));
  emit_(json);
}

bool EventEdge::fail_with(const std::string& text) {
  if (finished()) return false;
  state_ = State::Failed;
  emit_(cat("{\"event\":\"error\",\"text\":", quoted(text), "}"));
  return false;
}

double EventEdge::since(std::chrono::steady_clock::time_point t) const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace tandem
