#include "edge/agent/edge_agent.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>

#include "backends/registry.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/interop/torch_layout.h"
#include "core/planner.h"
#include "edge/agent/cloud_link.h"
#include "edge/agent/edge_checkpoints.h"
#include "data/epoch_order.h"
#include "data/idx_dataset.h"
#include "data/partition.h"
#include "edge/session/edge_session.h"
#include "ports/files/safetensors_file.h"
#include "cli/progress.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

struct CutChoice {
  std::string cut;
  uint32_t microbatches;
};

// --cut NODE, the spec's cut, or with --cut auto the planner's choice on this machine's edge
// backend and the given link (a resumed run keeps its checkpoint's cut).
CutChoice choose_cut(const EdgeTrainOptions& o, const Graph& graph, Backend& backend,
                     const std::optional<EdgeCheckpoints>& checkpoints) {
  CutChoice c{o.cut.empty() ? graph.default_cut() : o.cut, o.microbatches};
  if (c.cut.empty()) fail("edge", "the spec names no default cut; pass --cut NODE or --cut auto");
  if (c.cut != "auto") return c;
  if (checkpoints && checkpoints->latest()) {
    c.cut = checkpoints->latest()->meta.cut;
    std::fprintf(stderr, "--cut auto: resuming with the checkpoint's cut '%s'\n", c.cut.c_str());
    return c;
  }
  // The cloud's compute as given, else taken to be this machine's. K: powers of two up to
  // --microbatches.
  PlanOptions po;
  po.batch = o.batch;
  po.microbatches.clear();
  for (uint32_t k = 1; k <= o.microbatches && k <= o.batch; k *= 2) po.microbatches.push_back(static_cast<int>(k));
  po.uplink_mbps = o.uplink_mbps;
  po.downlink_mbps = o.downlink_mbps > 0 ? o.downlink_mbps : o.uplink_mbps;
  po.cloud_gflops = o.cloud_gflops;
  po.dtype = o.wire_dtypes.front();
  if (!(po.uplink_mbps > 0.0)) fail("edge", "--cut auto needs the link's rate: --uplink-mbps U [--downlink-mbps D]");
  std::fprintf(stderr, "planning the cut for %.1f Mbit/s up, %.1f down...\n", po.uplink_mbps, po.downlink_mbps);
  const PlanRow best = recommend(plan_split(graph, po, backend, backend));
  std::fprintf(stderr, "planned: cut=%s microbatches=%d predicted_samples_per_s=%.1f\n", best.cut.c_str(),
               best.microbatches, best.samples_per_s);
  return {best.cut, static_cast<uint32_t>(best.microbatches)};
}

// The front shard's starting weights: --init-from's (only the front's tensors are read), or
// the whole model's seeded initialisation, as the cloud's back shard gets (tandem-cloud serve).
void init_front(const EdgeTrainOptions& o, const Graph& graph, Network& front) {
  if (!o.init_from.empty()) {
    shard_from_torch(graph, read_safetensors_file(o.init_from, tensor_names(front)), front);
    std::fprintf(stderr, "front shard initialised from %s\n", o.init_from.c_str());
    return;
  }
  init_from_whole_model(graph, o.seed, front, *make_backend("reference"));
}

LabelledImages training_data(const EdgeTrainOptions& o) {
  if (o.shard_count <= 1) return load_fashion_mnist(true, o.limit);
  LabelledImages share = partition(load_fashion_mnist(true, o.limit), o.shard_index, o.shard_count, o.split);
  std::fprintf(stderr, "this edge's share: %lld samples (shard %d of %d, %s)\n",
               static_cast<long long>(share.images.shape()[0]), o.shard_index, o.shard_count, o.split.c_str());
  return share;
}

// Test-set accuracy through the cloud: the images stay here, only activations travel.
// cloud_busy gets the cloud's compute time so far.
double evaluate(CloudLink& link, EdgeSession& session, const LabelledImages& test, double& cloud_busy) {
  int64_t correct = 0, seen = 0;
  const int64_t n = test.images.shape()[0];
  for (int64_t begin = 0; begin < n; begin += 1000) {
    const int64_t count = std::min<int64_t>(1000, n - begin);
    link.send(session.eval_forward(static_cast<uint64_t>(begin), test.images.slice_batch(begin, count),
                                   test.labels.data() + begin, count));
    WireError err;
    EdgeSession::EvalResult result;
    if (!session.on_eval_result(link.await("EvalResult"), err, result)) fail("edge", err.text);
    correct += result.correct;
    seen += result.count;
    cloud_busy = result.cloud_busy_s;
  }
  return static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(seen, 1));
}

// Waits for a round's average and takes it; false (said on stderr) when the cloud refuses.
bool take_average(CloudLink& link, EdgeSession& session) {
  WireError err;
  if (session.on_aggregated(link.await("Aggregated"), err)) return true;
  std::fprintf(stderr, "\ntandem-edge: %s\n", err.text.c_str());
  return false;
}

}  // namespace

int train_over_wss(const EdgeTrainOptions& o) {
  const ModelSpec spec = load_model_spec(o.model_path);
  const Graph graph = Graph::build(spec);
  auto backend = make_backend(o.backend, BackendOptions{o.threads});
  std::optional<EdgeCheckpoints> checkpoints;
  if (!o.checkpoint_dir.empty()) checkpoints.emplace(o.checkpoint_dir, o.identity_dir, o.checkpoint_every);
  const auto [cut, microbatches] = choose_cut(o, graph, *backend, checkpoints);
  Network front(graph.split(cut).first, *backend, o.seed);
  init_front(o, graph, front);
  auto optimizer = make_optimizer(front.params(), o.optimizer);
  EdgeSession session(front, *optimizer, microbatches, model_hash(spec, cut), o.client_id, o.wire_dtypes);
  session.set_proximal(o.proximal_mu);
  session.set_front_updates(o.front_updates_per_round ? EdgeSession::FrontUpdates::PerRound
                                                      : EdgeSession::FrontUpdates::PerStep);
  CheckpointMeta position;  // where training stands: step, epoch and samples of it consumed
  position.role = "edge";
  position.client_id = o.client_id;
  position.cut = cut;
  position.model_hash = model_hash(spec, cut);
  if (checkpoints)
    if (const auto resumed = checkpoints->resume(position.model_hash, front, *optimizer)) {
      position = *resumed;
      session.resume_from(position.step);
      std::fprintf(stderr, "resuming from the checkpoint of step %llu (epoch %lld, %lld samples in)\n",
                   static_cast<unsigned long long>(position.step), static_cast<long long>(position.epoch),
                   static_cast<long long>(position.cursor));
    }

  std::fprintf(stderr, "loading Fashion-MNIST from %s\n", fashion_mnist_dir().c_str());
  const LabelledImages train = training_data(o);
  const LabelledImages test = load_fashion_mnist(false, o.test_limit);
  const Shape& in = graph.inputs().at(0).shape;
  if (train.images.shape().item_numel() != in.numel())
    fail("edge", cat("the model's input is ", in.str(), " but the images are ", train.images.shape().str()));
  const int64_t n = train.images.shape()[0], item = train.images.shape().item_numel();
  if (position.cursor > n || position.epoch < 1)
    fail("edge", cat("the checkpoint stands at sample ", position.cursor, " of epoch ", position.epoch,
                     ", outside this data set of ", n, " (was --limit changed?)"));
  ScheduleOptions schedule = o.schedule;
  if (schedule.total_steps == 0) schedule.total_steps = o.epochs * ((n + o.batch - 1) / o.batch);
  validate(schedule);
  std::ofstream metrics;
  if (!o.metrics_json.empty()) {
    metrics.open(o.metrics_json, std::ios::app);
    if (!metrics) fail("edge", cat("cannot write --metrics-json ", o.metrics_json));
  }
  auto report = [&](const std::string& json) {
    std::printf("%s\n", json.c_str());
    std::fflush(stdout);
    if (metrics) metrics << json << "\n" << std::flush;
  };

  if (!o.token.empty()) session.set_token(o.token);
  CloudLink link(o.host, o.port, o.identity_dir, !o.token.empty());
  link.send(session.hello());
  WireError err;
  if (!session.on_welcome(link.await("Welcome"), err)) {
    std::fprintf(stderr, "tandem-edge: %s\n", err.text.c_str());
    return 1;
  }
  std::fprintf(stderr,
               "connected to wss://%s:%d, model %s cut at '%s', front on %s, %u micro-batches a step, %s on the wire\n",
               o.host.c_str(), o.port, spec.name.c_str(), cut.c_str(), o.backend.c_str(), microbatches,
               dtype_name(session.dtype()));
  // Split-federated: the newest average first (a late or returning edge), then one every
  // aggregate_every steps and one after the last step.
  if (session.aggregate_every() > 0)
    std::fprintf(stderr, "split-federated: front shards averaged every %u steps, the front updated %s\n",
                 session.aggregate_every(), o.front_updates_per_round ? "once a round" : "every step");
  else if (o.front_updates_per_round)
    std::fprintf(stderr, "--front-updates round: this cloud does not federate, so the front updates every step\n");
  if (session.awaiting_aggregate()) {
    if (!take_average(link, session)) return 1;
    std::fprintf(stderr, "joined at round %u: continuing from the newest average\n", session.round());
  }
  uint64_t samples_since_round = 0;

  double cloud_busy_before = 0.0, accuracy = 0.0;
  if (o.epochs == 0) {  // evaluation only, of the starting weights
    accuracy = evaluate(link, session, test, cloud_busy_before);
    report(cat("{\"epoch\":0,\"step\":", position.step, ",\"test_accuracy\":", fixed(accuracy, 5), "}"));
  } else if (position.epoch > o.epochs) {
    std::fprintf(stderr, "the checkpoint is past the last epoch: nothing left to train\n");
  }
  Tensor images = Tensor::empty(in.batched(o.batch));
  std::vector<int32_t> labels(o.batch);
  for (int64_t epoch = position.epoch; epoch <= o.epochs; ++epoch) {
    const std::vector<int64_t> order = epoch_order(n, o.seed, epoch);
    const int64_t first = epoch == position.epoch ? position.cursor : 0;
    ProgressBar bar(cat("epoch ", epoch, "/", o.epochs), n);
    const auto t0 = Clock::now();
    const uint64_t up0 = link.bytes_up(), down0 = link.bytes_down();
    const double idle0 = link.idle_seconds();
    double loss_sum = 0.0;
    for (int64_t begin = first; begin < n; begin += o.batch) {
      const int64_t count = std::min<int64_t>(o.batch, n - begin);
      for (int64_t j = 0; j < count; ++j) {
        const int64_t src = order[static_cast<std::size_t>(begin + j)];
        std::copy_n(train.images.data() + src * item, item, images.data() + j * item);
        labels[static_cast<std::size_t>(j)] = train.labels[static_cast<std::size_t>(src)];
      }
      const bool save = checkpoints && checkpoints->due(position.step + 1, begin + count == n);
      const int k = session.begin_step(count == o.batch ? images : images.slice_batch(0, count), labels.data(),
                                       lr_factor(schedule, static_cast<int64_t>(position.step)), save);
      // Every activation leaves as soon as it is computed; gradients are applied as they come.
      for (int mb = 0; mb < k; ++mb) link.send(session.forward(mb));
      for (bool done = false; !done;)
        if (!session.on_backward(link.await("Backward"), err, done)) {
          std::fprintf(stderr, "\ntandem-edge: %s\n", err.text.c_str());
          return 1;
        }
      loss_sum += session.step_loss_sum();
      position.step = session.step();
      position.cursor = begin + count;
      if (position.cursor == n) {
        position.epoch = epoch + 1;
        position.cursor = 0;
      }
      if (save) checkpoints->save(position, front, *optimizer);
      samples_since_round += static_cast<uint64_t>(count);
      if (session.aggregate_due()) {
        link.send(session.front_weights(samples_since_round));
        if (!take_average(link, session)) return 1;
        samples_since_round = 0;
      }
      bar.update(begin + count, cat("loss ", fixed(loss_sum / static_cast<double>(begin + count - first), 4)));
    }
    if (epoch == o.epochs && session.final_round_due()) {
      // The last steps' weights join a round too, so the run ends on the average.
      link.send(session.front_weights(samples_since_round, /*final=*/true));
      if (!take_average(link, session)) return 1;
    }
    const int64_t trained = n - first;  // samples this process trained in this epoch
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const uint64_t train_up = link.bytes_up() - up0, train_down = link.bytes_down() - down0;
    const double mean_loss = loss_sum / static_cast<double>(std::max<int64_t>(trained, 1));
    bar.finish(cat("loss ", fixed(mean_loss, 4)));
    double cloud_busy = cloud_busy_before;
    accuracy = evaluate(link, session, test, cloud_busy);
    const double epoch_idle = link.idle_seconds() - idle0, epoch_cloud = cloud_busy - cloud_busy_before;
    cloud_busy_before = cloud_busy;
    report(cat("{\"epoch\":", epoch, ",\"samples\":", trained, ",\"seconds\":", fixed(seconds, 3),
               ",\"samples_per_s\":", fixed(static_cast<double>(trained) / seconds, 1),
               ",\"train_loss\":", fixed(mean_loss, 5), ",\"test_accuracy\":", fixed(accuracy, 5),
               ",\"lr\":", fixed(optimizer->lr(), 6), ",\"wire_dtype\":\"", dtype_name(session.dtype()),
               "\",\"steps\":", (trained + o.batch - 1) / o.batch, ",\"step\":", position.step,
               ",\"round\":", session.round(), ",\"rounds_joined\":", session.rounds_joined(),
               ",\"bytes_up\":", link.bytes_up() - up0, ",\"bytes_down\":", link.bytes_down() - down0,
               ",\"train_bytes_up\":", train_up, ",\"train_bytes_down\":", train_down,
               ",\"edge_busy_s\":", fixed(seconds - epoch_idle, 3), ",\"edge_idle_s\":", fixed(epoch_idle, 3),
               ",\"cloud_busy_s\":", fixed(epoch_cloud, 3),
               ",\"cloud_idle_s\":", fixed(std::max(0.0, seconds - epoch_cloud), 3), "}"));
  }
  link.send(session.bye("training finished"));
  std::printf("final test accuracy: %.2f%% (%lld test images)\n", accuracy * 100.0,
              static_cast<long long>(test.images.shape()[0]));
  return 0;
}

}  // namespace tandem
