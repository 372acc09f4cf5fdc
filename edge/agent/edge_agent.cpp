#include "edge/agent/edge_agent.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <optional>

#include "core/error.h"
#include "core/planner.h"
#include "core/graph.h"
#include "core/interop/torch_layout.h"
#include "edge/agent/edge_checkpoints.h"
#include "edge/data/epoch_order.h"
#include "edge/data/idx_dataset.h"
#include "edge/data/partition.h"
#include "edge/session/edge_session.h"
#include "ports/files/safetensors_file.h"
#include "ports/lws/lws_endpoint.h"
#include "tools/progress.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kReplyTimeout = std::chrono::seconds(120);

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// Waits for the next message; a close or a timeout becomes an Error naming what was awaited.
Frame await_message(LwsEndpoint& link, const char* awaiting, uint64_t& bytes_down, double& idle_s) {
  const auto t0 = Clock::now();
  EndpointEvent ev;
  for (;;) {
    if (!link.next(ev, kReplyTimeout)) fail("edge", cat("no ", awaiting, " from the cloud within 120 s"));
    if (ev.kind == EndpointEvent::Kind::Message) break;
    if (ev.kind == EndpointEvent::Kind::Closed)
      fail("edge", cat("the cloud closed the connection while this edge waited for ", awaiting, " (", ev.text, ")"));
  }
  idle_s += std::chrono::duration<double>(Clock::now() - t0).count();
  bytes_down += ev.frame.size();
  return std::move(ev.frame);
}

}  // namespace

int train_over_wss(const EdgeTrainOptions& o) {
  const ModelSpec spec = load_model_spec(o.model_path);
  const Graph graph = Graph::build(spec);
  auto backend = make_backend(o.backend, BackendOptions{o.threads});
  std::string cut = o.cut.empty() ? graph.default_cut() : o.cut;
  if (cut.empty()) fail("edge", "the spec names no default cut; pass --cut NODE or --cut auto");
  uint32_t microbatches = o.microbatches;
  std::optional<EdgeCheckpoints> checkpoints;
  if (!o.checkpoint_dir.empty()) checkpoints.emplace(o.checkpoint_dir, o.identity_dir, o.checkpoint_every);
  if (cut == "auto" && checkpoints && checkpoints->latest()) {
    cut = checkpoints->latest()->meta.cut;  // a resumed run keeps the cut it was planned with
    std::fprintf(stderr, "--cut auto: resuming with the checkpoint's cut '%s'\n", cut.c_str());
  } else if (cut == "auto") {
    // The planner on this machine's edge backend and the given link; the cloud's compute as
    // given, else taken to be this machine's. K: powers of two up to --microbatches.
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
    const PlanRow best = recommend(plan_split(graph, po, *backend, *backend));
    cut = best.cut;
    microbatches = static_cast<uint32_t>(best.microbatches);
    std::fprintf(stderr, "planned: cut=%s microbatches=%d predicted_samples_per_s=%.1f\n", cut.c_str(),
                 best.microbatches, best.samples_per_s);
  }
  auto [front_graph, back_graph] = graph.split(cut);
  Network front(front_graph, *backend, o.seed);
  if (!o.init_from.empty()) {
    shard_from_torch(graph, read_safetensors_file(o.init_from, tensor_names(front)), front);
    std::fprintf(stderr, "front shard initialised from %s\n", o.init_from.c_str());
  } else {  // the same initial weights as the whole model (see tandem-cloud serve)
    auto reference = make_backend("reference");
    Network whole(graph, *reference, o.seed);
    for (Param* p : front.params()) {
      p->value().copy_from(whole.param(p->name()).value());
      p->bump_version();
    }
  }
  auto optimizer = make_optimizer(front.params(), o.optimizer);
  EdgeSession session(front, *optimizer, microbatches, model_hash(spec, cut), o.client_id, o.wire_dtypes);
  session.set_proximal(o.proximal_mu);
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
  const LabelledImages train = o.shard_count > 1
                                    ? partition(load_fashion_mnist(true, o.limit), o.shard_index, o.shard_count, o.split)
                                    : load_fashion_mnist(true, o.limit);
  if (o.shard_count > 1)
    std::fprintf(stderr, "this edge's share: %lld samples (shard %d of %d, %s)\n",
                 static_cast<long long>(train.images.shape()[0]), o.shard_index, o.shard_count, o.split.c_str());
  const LabelledImages test = load_fashion_mnist(false, o.test_limit);
  const Shape& in = graph.inputs().at(0).shape;
  if (train.images.shape().item_numel() != in.numel())
    fail("edge", cat("the model's input is ", in.str(), " but the images are ", train.images.shape().str()));

  const TlsIdentity id{o.identity_dir + "/client.crt", o.identity_dir + "/client.key", o.identity_dir + "/ca.crt"};
  auto link = LwsEndpoint::connect(o.host, o.port, id);
  uint64_t up = 0, down = 0;
  double idle_s = 0.0;
  {
    EndpointEvent ev;
    if (!link->next(ev, std::chrono::seconds(30)) || ev.kind != EndpointEvent::Kind::Connected)
      fail("edge", cat("cannot connect to wss://", o.host, ":", o.port, ": ",
                       ev.text.empty() ? "no answer within 30 s" : ev.text,
                       " (is tandem-cloud serve running, and was this identity issued by its CA?)"));
  }
  auto send = [&](std::span<const uint8_t> bytes) {
    up += bytes.size();
    link->send(0, bytes);
  };
  send(session.hello());
  WireError err;
  if (!session.on_welcome(await_message(*link, "Welcome", down, idle_s), err)) {
    std::fprintf(stderr, "tandem-edge: %s\n", err.text.c_str());
    return 1;
  }
  std::fprintf(stderr,
               "connected to wss://%s:%d, model %s cut at '%s', front on %s, %u micro-batches a step, %s on the wire\n",
               o.host.c_str(), o.port, spec.name.c_str(), cut.c_str(), o.backend.c_str(), o.microbatches,
               dtype_name(session.dtype()));
  // Split-federated: the newest average first (a late or returning edge), then one every
  // aggregate_every steps.
  auto take_average = [&]() {
    if (!session.on_aggregated(await_message(*link, "Aggregated", down, idle_s), err)) {
      std::fprintf(stderr, "\ntandem-edge: %s\n", err.text.c_str());
      return false;
    }
    return true;
  };
  if (session.aggregate_every() > 0)
    std::fprintf(stderr, "split-federated: front shards averaged every %u steps\n", session.aggregate_every());
  if (session.awaiting_aggregate()) {
    if (!take_average()) return 1;
    std::fprintf(stderr, "joined at round %u: continuing from the newest average\n", session.round());
  }
  uint64_t samples_since_round = 0;

  std::ofstream metrics;
  if (!o.metrics_json.empty()) {
    metrics.open(o.metrics_json, std::ios::app);
    if (!metrics) fail("edge", cat("cannot write --metrics-json ", o.metrics_json));
  }
  const int64_t n = train.images.shape()[0], item = train.images.shape().item_numel();
  Tensor images = Tensor::empty(Shape{o.batch, in[0], in[1], in[2]});
  std::vector<int32_t> labels(o.batch);
  double cloud_busy_before = 0.0, accuracy = 0.0;
  ScheduleOptions schedule = o.schedule;
  if (schedule.total_steps == 0) schedule.total_steps = o.epochs * ((n + o.batch - 1) / o.batch);
  validate(schedule);
  if (position.cursor > n || position.epoch < 1)
    fail("edge", cat("the checkpoint stands at sample ", position.cursor, " of epoch ", position.epoch,
                     ", outside this data set of ", n, " (was --limit changed?)"));
  // Evaluation through the cloud: the test images stay here, only activations travel.
  auto evaluate = [&](double& cloud_busy) {
    int64_t correct = 0, seen = 0;
    for (int64_t begin = 0; begin < test.images.shape()[0]; begin += 1000) {
      const int64_t count = std::min<int64_t>(1000, test.images.shape()[0] - begin);
      send(session.eval_forward(static_cast<uint64_t>(begin), test.images.slice_batch(begin, count),
                                test.labels.data() + begin, count));
      Frame reply = await_message(*link, "EvalResult", down, idle_s);
      const wire::Message* m = verify_frame(reply, kDefaultMaxMessageBytes, err);
      if (!m || m->payload_type() != wire::Payload::EvalResult)
        fail("edge", m && m->payload_type() == wire::Payload::Error
                         ? cat("the cloud refused: ", m->payload_as_Error()->text()->str())
                         : std::string("expected EvalResult"));
      correct += m->payload_as_EvalResult()->correct();
      seen += m->payload_as_EvalResult()->count();
      cloud_busy = m->payload_as_EvalResult()->cloud_busy_s();
    }
    return static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(seen, 1));
  };
  if (o.epochs == 0) {  // evaluation only, of the starting weights
    double busy = 0.0;
    accuracy = evaluate(busy);
    const std::string json = cat("{\"epoch\":0,\"step\":", position.step, ",\"test_accuracy\":", fixed(accuracy, 5), "}");
    std::printf("%s\n", json.c_str());
    if (metrics) metrics << json << "\n" << std::flush;
  }
  if (o.epochs > 0 && position.epoch > o.epochs) std::fprintf(stderr, "the checkpoint is past the last epoch: nothing left to train\n");
  for (int64_t epoch = position.epoch; epoch <= o.epochs; ++epoch) {
    const std::vector<int64_t> order = epoch_order(n, o.seed, epoch);
    const int64_t first = epoch == position.epoch ? position.cursor : 0;
    ProgressBar bar(cat("epoch ", epoch, "/", o.epochs), n);
    const auto t0 = Clock::now();
    const uint64_t up0 = up, down0 = down;
    const double idle0 = idle_s;
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
      for (int mb = 0; mb < k; ++mb) send(session.forward(mb));
      bool done = false;
      while (!done)
        if (!session.on_backward(await_message(*link, "Backward", down, idle_s), err, done)) {
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
        send(session.front_weights(samples_since_round));
        if (!take_average()) return 1;
        samples_since_round = 0;
      }
      bar.update(begin + count, cat("loss ", fixed(loss_sum / static_cast<double>(begin + count - first), 4)));
    }
    if (epoch == o.epochs && session.aggregate_every() > 0 && session.step() > 0 && !session.exchanged_now()) {
      // The last steps' weights join a round too, so the run ends on the average.
      send(session.front_weights(samples_since_round, /*final=*/true));
      if (!take_average()) return 1;
    }
    const int64_t trained = n - first;  // samples this process trained in this epoch
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const uint64_t train_up = up - up0, train_down = down - down0;
    const int64_t steps = (trained + o.batch - 1) / o.batch;
    bar.finish(cat("loss ", fixed(loss_sum / static_cast<double>(std::max<int64_t>(trained, 1)), 4)));
    double cloud_busy = cloud_busy_before;
    accuracy = evaluate(cloud_busy);
    const double epoch_idle = idle_s - idle0, epoch_cloud = cloud_busy - cloud_busy_before;
    cloud_busy_before = cloud_busy;
    const std::string json = cat(
        "{\"epoch\":", epoch, ",\"samples\":", trained, ",\"seconds\":", fixed(seconds, 3),
        ",\"samples_per_s\":", fixed(static_cast<double>(trained) / seconds, 1),
        ",\"train_loss\":", fixed(loss_sum / static_cast<double>(std::max<int64_t>(trained, 1)), 5), ",\"test_accuracy\":", fixed(accuracy, 5),
        ",\"lr\":", fixed(optimizer->lr(), 6),
        ",\"wire_dtype\":\"", dtype_name(session.dtype()), "\",\"steps\":", steps, ",\"step\":", position.step, ",\"round\":", session.round(),
        ",\"rounds_joined\":", session.rounds_joined(), ",\"bytes_up\":", up - up0, ",\"bytes_down\":", down - down0,
        ",\"train_bytes_up\":", train_up, ",\"train_bytes_down\":", train_down,
        ",\"edge_busy_s\":", fixed(seconds - epoch_idle, 3), ",\"edge_idle_s\":", fixed(epoch_idle, 3),
        ",\"cloud_busy_s\":", fixed(epoch_cloud, 3), ",\"cloud_idle_s\":", fixed(std::max(0.0, seconds - epoch_cloud), 3),
        "}");
    std::printf("%s\n", json.c_str());
    std::fflush(stdout);
    if (metrics) metrics << json << "\n" << std::flush;
  }
  send(session.bye("training finished"));
  std::printf("final test accuracy: %.2f%% (%lld test images)\n", accuracy * 100.0,
              static_cast<long long>(test.images.shape()[0]));
  return 0;
}

}  // namespace tandem
