#include "edge/agent/edge_agent.h"
#include "edge/agent/egress_log_file.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <thread>

#include "backends/registry.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/interop/torch_layout.h"
#include "core/planner.h"
#include "core/sha256.h"
#include "data/idx_dataset.h"
#include "data/partition.h"
#include "edge/agent/cloud_link.h"
#include "edge/agent/edge_checkpoints.h"
#include "edge/agent/run_report.h"
#include "edge/agent/sent_record.h"
#include "edge/session/event_edge.h"
#include "ports/files/release_ledger.h"
#include "ports/files/safetensors_file.h"
#include "ports/files/tensor_dataset.h"

namespace tandem {
namespace {

struct CutChoice {
  std::string cut;
  uint32_t microbatches;
};

// --cut NODE, the spec's cut, or with --cut auto the planner's choice on this machine's edge
// backend and the given link (a resumed run keeps its checkpoint's cut).
CutChoice choose_cut(const EdgeTrainOptions& o, const Graph& graph, Backend& backend,
                     const std::optional<EdgeCheckpoints>& checkpoints) {
  CutChoice c{o.cut.empty() ? graph.default_cut() : graph.cut_nodes(o.cut), o.microbatches};
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
  int64_t all = 0, trainable = 0;
  for (const Param* p : front.all_params()) all += p->value().numel();
  for (const Param* p : front.params()) trainable += p->value().numel();
  // What trains here (frozen layers and LoRA: a small part), so a user sees what fine-tuning costs.
  std::fprintf(stderr, "edge shard (%zu nodes): %lld parameters, %lld trainable (%.2f%%)\n", front.graph().nodes().size(),
               static_cast<long long>(all), static_cast<long long>(trainable),
               all > 0 ? 100.0 * static_cast<double>(trainable) / static_cast<double>(all) : 0.0);
  if (!o.init_from.empty()) {
    shard_from_torch(graph, read_safetensors_file(o.init_from, import_names(graph, front)), front);
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

}  // namespace

int train_over_wss(const EdgeTrainOptions& o) {
  check_identity_folder(o.identity_dir, !o.token.empty());  // the first thing a newcomer can get wrong
  const ModelSpec spec = load_model_spec(o.model_path);
  const Graph graph = Graph::build(spec);
  std::optional<EdgeCheckpoints> checkpoints;
  if (!o.checkpoint_dir.empty()) checkpoints.emplace(o.checkpoint_dir, o.identity_dir, o.checkpoint_every);
  EventEdgeConfig c;
  uint32_t microbatches = o.microbatches;
  {
    auto planning = make_backend(o.backend, BackendOptions{o.threads});
    const CutChoice chosen = choose_cut(o, graph, *planning, checkpoints);
    c.cut = chosen.cut;
    microbatches = chosen.microbatches;
  }
  c.client_id = o.client_id;
  c.token = o.token;
  c.batch = o.batch;
  c.microbatches = microbatches;
  c.epochs = o.epochs;
  c.steps = 0;
  c.optimizer = o.optimizer;
  c.schedule = o.schedule;
  c.seed = o.seed;
  c.backend = o.backend;
  c.threads = o.threads;
  c.dtypes = o.wire_dtypes;
  c.eval_each_epoch = true;
  c.eval_chunk = 1000;
  c.front_updates_per_round = o.front_updates_per_round;
  c.group_by_length = o.group_by_length;
  c.recompute = o.recompute;
  c.async = o.async;
  c.proximal_mu = o.proximal_mu;
  c.privacy = o.privacy;
  c.init_front = [&o](const Graph& whole, Network& front) { init_front(o, whole, front); };
  if (checkpoints) c.checkpoints = &*checkpoints;
  // The noised releases of the training set, counted durably in the checkpoint folder: a new
  // process of this edge goes on from them (replays after a restart are releases too).
  std::optional<ReleaseLedger> releases;
  if (checkpoints && o.privacy.dp_clip > 0.0f) {
    Sha256 plan;  // the terms the count is of: the model, the cut, the noise, the batch and the data
    plan.update(spec.binary.data(), spec.binary.size());
    const std::string terms = cat(" cut=", c.cut, " batch=", o.batch, " clip=", o.privacy.dp_clip, " noise=",
                                  o.privacy.dp_noise, " data=", o.data, " limit=", o.limit, " shard=", o.shard_index, "/",
                                  o.shard_count, " split=", o.split, " seed=", o.seed);
    plan.update(terms.data(), terms.size());
    const std::array<uint8_t, 32> hash = plan.finish();
    releases.emplace(o.checkpoint_dir, to_hex(hash.data(), hash.size()));
    if (releases->releases() > 0)
      std::fprintf(stderr, "%s: %llu noised releases of the training set before this process\n", releases->path().c_str(),
                   static_cast<unsigned long long>(releases->releases()));
    c.releases = &*releases;
  }
  std::optional<SentRecord> sent;
  if (!o.record_sent.empty()) {
    if (o.epochs < 1) fail("edge", "--record-sent records the last epoch's activations: give --epochs 1 or more");
    sent.emplace(o.record_sent, o.epochs, o.record_sent_limit);
    c.on_training_forward = [&sent](int64_t epoch, std::span<const int64_t> samples, std::span<const uint8_t> message) {
      sent->on_forward(epoch, samples, message);
    };
  }
  EgressLogFile egress(o.audit_log.empty() ? o.identity_dir + "/egress.jsonl" : o.audit_log);
  c.audit = &egress.audit();

  std::optional<CloudLink> link;
  RunReport report(o);
  std::optional<EventEdge> edge;
  int64_t test_images = 0;
  // The run's driver, made afresh after a dropped connection: it resumes from the newest
  // checkpoint (the cloud holds its own of that step) and reads the data again from disk
  // (no second copy held meanwhile).
  const auto make_edge = [&] {
    edge.reset();
    edge.emplace(spec, c, [&](std::span<const uint8_t> bytes) { link->send(bytes); },
                 [&](const EdgeEvent& e) { report.on_event(e); });
    if (edge->resumed())
      std::fprintf(stderr, "resuming from the checkpoint of step %llu (epoch %lld, %lld samples in)\n",
                   static_cast<unsigned long long>(edge->position().step), static_cast<long long>(edge->position().epoch),
                   static_cast<long long>(edge->position().cursor));
    if (o.data == "fashion-mnist") {
      std::fprintf(stderr, "loading Fashion-MNIST from %s\n", fashion_mnist_dir().c_str());
      LabelledImages train = training_data(o), test = load_fashion_mnist(false, o.test_limit);
      test_images = test.images.shape()[0];
      edge->set_data(false, std::move(train.images), std::move(train.labels));
      edge->set_data(true, std::move(test.images), std::move(test.labels));
    } else {
      if (o.shard_count > 1) fail("edge", "--shard partitions Fashion-MNIST only; give each edge its own --data folder");
      std::fprintf(stderr, "loading the data set in %s\n", o.data.c_str());
      LabelledInputs train = read_tensor_dataset(o.data + "/train.safetensors", graph.inputs(), o.limit);
      LabelledInputs test = read_tensor_dataset(o.data + "/test.safetensors", graph.inputs(), o.test_limit);
      test_images = static_cast<int64_t>(test.labels.size());
      edge->set_data(false, std::move(train.inputs), std::move(train.labels));
      edge->set_data(true, std::move(test.inputs), std::move(test.labels));
    }
  };
  make_edge();
  if (o.epochs > 0 && edge->position().epoch > o.epochs)
    std::fprintf(stderr, "the checkpoint is past the last epoch: nothing left to train\n");

  // Hello; then each message the cloud sends drives the run to its end. A cloud at its bound
  // on connections answers Busy ("try again later"): this edge does, after a backoff. A
  // connection that cannot be made or drops (a restarted cloud, a link down, a silent cloud)
  // is made again after a backoff, up to --reconnects times in a row, and the run resumes
  // from the newest checkpoint both sides hold; the cloud's Errors end the run as before.
  int busy_retries = 0, drops_in_a_row = 0;
  bool connected = false;  // once: a cloud that cannot be reached at the start ends the run at once
  // The cloud's addresses (one, or a replica set's): a failed or dropped connection, or Busy,
  // moves to the next; the backoff comes once every address was tried.
  std::vector<std::pair<std::string, int>> clouds{{o.host, o.port}};
  clouds.insert(clouds.end(), o.more_clouds.begin(), o.more_clouds.end());
  std::size_t at = 0, unreached = 0;
  const auto next_cloud = [&](const std::string& why) {
    if (clouds.size() < 2) return false;
    at = (at + 1) % clouds.size();
    std::fprintf(stderr, "tandem-edge: %s; trying the cloud's next address, wss://%s:%d\n", why.c_str(),
                 clouds[at].first.c_str(), clouds[at].second);
    return at != 0;  // false: every address tried since the first (back off before the next round)
  };
  uint64_t step_at_reconnect = edge->position().step;
  for (;;) {
    std::string dropped;  // why the link failed (CloudLink's Errors only; the run's own propagate)
    const auto over_link = [&dropped](auto&& step) {
      try {
        step();
        return true;
      } catch (const Error& e) {
        dropped = e.what();
        return false;
      }
    };
    if (over_link([&] { link.emplace(clouds[at].first, clouds[at].second, o.identity_dir, !o.token.empty()); })) {
      connected = true;
      report.attach(*edge, *link, microbatches);
      edge->on_open();
      std::optional<Frame> frame;
      while (!edge->finished() && edge->busy().empty() && over_link([&] { frame = link->await(edge->awaiting()); }))
        edge->on_message(*frame);
    }
    if (edge->finished()) break;
    report.detach();
    link.reset();
    if (dropped.empty()) {  // Busy
      if (next_cloud(edge->busy())) continue;  // another replica may have room
      if (++busy_retries > o.connect_retries) {
        edge->on_closed(edge->busy());
        break;
      }
      const double wait_s = busy_backoff_s(busy_retries);
      std::fprintf(stderr, "tandem-edge: %s; trying again in %.1f s (retry %d of %d)\n", edge->busy().c_str(), wait_s,
                   busy_retries, o.connect_retries);
      std::this_thread::sleep_for(std::chrono::duration<double>(wait_s));
      continue;
    }
    // A dropped link. Progress since the last reconnection starts the count again.
    if (!connected) {  // none reached yet: each address once, then the run ends
      if (++unreached < clouds.size() && next_cloud(dropped)) continue;
      fail("edge", dropped);
    }
    next_cloud(dropped);  // the replica it lost may be gone: the next one (after the backoff)
    const uint64_t reached = edge->position().step;
    if (reached > step_at_reconnect) drops_in_a_row = 0;
    if (!checkpoints && edge->steps_done() > 0)
      fail("edge", cat(dropped, ". Without --checkpoint-dir this edge cannot resume after step ", reached,
                       ": rerun with --checkpoint-dir DIR (and --checkpoint-every STEPS) to have it reconnect and resume "
                       "by itself"));
    if (++drops_in_a_row > o.reconnects)
      fail("edge", cat(dropped, o.reconnects == 0 ? " (--reconnects 0: no reconnection)"
                                                  : cat(" (gave up after ", o.reconnects, " reconnections in a row "
                                                        "without progress: --reconnects)")));
    const double wait_s = busy_backoff_s(drops_in_a_row);
    std::fprintf(stderr, "\ntandem-edge: %s; reconnecting in %.1f s (attempt %d of %d), then resuming from the newest "
                 "checkpoint both sides hold\n", dropped.c_str(), wait_s, drops_in_a_row, o.reconnects);
    std::this_thread::sleep_for(std::chrono::duration<double>(wait_s));
    if (edge->said_hello()) {  // a driver that never got to say Hello (no connection) is fresh as it is
      // An edge that came with an enrolment token spent it: the cloud's Welcome gave a new one.
      if (!edge->session().next_token().empty()) c.token = edge->session().next_token();
      make_edge();
      step_at_reconnect = edge->position().step;
      report.reconnected(reached - std::min(reached, step_at_reconnect));
    }
  }
  const std::string anchor = egress.finish(edge->failed() ? "failed" : "done");
  std::fprintf(stderr, "egress log: %s, %llu messages, %llu bytes sent; last hash %s (`tandem audit verify` checks it)\n",
               egress.path().c_str(), static_cast<unsigned long long>(egress.audit().messages()),
               static_cast<unsigned long long>(egress.audit().bytes()), anchor.c_str());
  if (edge->failed()) return 1;
  if (sent) sent->write();
  std::printf("final test accuracy: %.2f%% (%lld test images)\n", report.accuracy() * 100.0,
              static_cast<long long>(test_images));
  return 0;
}

}  // namespace tandem
