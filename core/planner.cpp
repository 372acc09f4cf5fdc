#include "core/planner.h"

#include <algorithm>

#include <map>
#include <optional>

#include "core/error.h"
#include "core/microbatch.h"
#include "core/network.h"
#include "core/ops/op.h"
#include "core/profiler.h"

namespace tandem {
namespace {

constexpr int64_t kFramingBytes = 256;  // a Forward's or Backward's fields around the tensor
// What the link carries besides the message: per 1448-byte TCP segment (MTU 1500) 52 bytes of
// TCP/IP headers with timestamps and 14 of Ethernet, TLS records' 29 per 16 KiB, and the
// acknowledgements of the other direction's data. Measured with tc's counters on the shaped
// link (bench/shaped_link.sh): 1.066x tandem's bytes on the uplink.
constexpr double kWireOverhead = 1.066;

struct ShardCost {
  double forward_s = 0, backward_s = 0;
  double weights_s = 0;  // of backward_s: the weight gradients
};

// A shard's cost for `m` samples from its ops' FLOPs (core/ops) at `gflops`: of backward,
// only what `net` computes (its input gradient as set, frozen parameters without theirs, so a
// LoRA front backs up to its first adapter and no further).
ShardCost estimate(const Network& net, int64_t m, double gflops) {
  ShardCost c;
  const double scale = static_cast<double>(m) / (gflops * 1e9);
  const Graph& g = net.graph();
  for (std::size_t i = 0; i < g.nodes().size(); ++i) {
    const GraphNode& n = g.nodes()[i];
    const OpCost cost = op_cost(n.spec, g.input_shapes(n), n.shape);
    const double weights = net.computes_weight_grads(static_cast<int>(i)) ? cost.backward_weights_flops : 0.0;
    c.forward_s += cost.forward_flops * scale;
    c.backward_s += (weights + (net.computes_input_grads(static_cast<int>(i)) ? cost.backward_data_flops : 0.0)) * scale;
    // (Batch norm computes its few weight-gradient FLOPs with its input gradient; counted
    // here as deferred all the same.)
    c.weights_s += weights * scale;
  }
  return c;
}

ShardCost measure(const Graph& g, Backend& backend, int64_t m, int iterations, bool input_grad) {
  Network net(g, backend, 1);
  if (!input_grad) net.set_recompute(true);  // a front runs as the edge does by default (EventEdgeConfig::recompute)
  ShardCost c;
  for (const LayerProfile& l : profile_layers(net, m, iterations, 1, input_grad)) {
    c.forward_s += l.forward_s;
    c.backward_s += l.backward_s;
    c.weights_s += l.weights_s;
  }
  return c;
}


// Each side's idle time in a step of t.step_s: the step less its busy time.
void set_idle(const std::vector<MicrobatchCost>& mbs, StepTimeline& t) {
  double edge_busy = 0, cloud_busy = 0;
  for (const MicrobatchCost& m : mbs) {
    edge_busy += m.edge_forward_s + m.edge_backward_s;
    cloud_busy += m.cloud_s + m.cloud_deferred_s;
  }
  t.edge_idle_s = std::max(0.0, t.step_s - edge_busy);
  t.cloud_idle_s = std::max(0.0, t.step_s - cloud_busy);
}

}  // namespace

StepTimeline simulate_step(const std::vector<MicrobatchCost>& mbs) {
  if (mbs.empty()) return {};
  double edge = 0, up = 0, cloud = 0, down = 0;
  std::vector<double> arrived(mbs.size());
  std::size_t deferred_next = 0;  // the oldest micro-batch whose weight gradients wait
  for (std::size_t i = 0; i < mbs.size(); ++i) {
    edge += mbs[i].edge_forward_s;
    up = std::max(up, edge) + mbs[i].up_s;
    while (deferred_next < i && cloud < up) cloud += mbs[deferred_next++].cloud_deferred_s;  // idle until then
    cloud = std::max(cloud, up) + mbs[i].cloud_s;
    down = std::max(down, cloud) + mbs[i].down_s;
    arrived[i] = down;
  }
  while (deferred_next < mbs.size()) cloud += mbs[deferred_next++].cloud_deferred_s;  // before the update
  StepTimeline t;
  t.first_grad_s = std::max(arrived[0], edge) - mbs[0].edge_forward_s;
  // Gradients arrive in order; each backward starts when it is in and the edge is free.
  for (std::size_t i = 0; i < mbs.size(); ++i) edge = std::max(edge, arrived[i]) + mbs[i].edge_backward_s;
  // The next step's first activations reach the cloud edge_forward + up after this step ends.
  t.step_s = std::max(edge, cloud - mbs[0].edge_forward_s - mbs[0].up_s);
  set_idle(mbs, t);
  return t;
}

StepTimeline simulate_async_steps(const std::vector<MicrobatchCost>& mbs) {
  if (mbs.empty()) return {};
  constexpr int kSteps = 10, kFirst = 3, kLast = 7;  // steady state: the step times of 4..7
  const std::size_t k = mbs.size();
  double edge = 0, up = 0, cloud = 0, down = 0;
  std::vector<std::vector<double>> arrived(kSteps, std::vector<double>(k));
  std::vector<double> first_sent(kSteps), first_taken(kSteps), done(kSteps);
  std::vector<double> deferred;  // weight-gradient work the cloud still owes, oldest first
  std::size_t deferred_next = 0;
  const auto forwards = [&](int s) {
    for (std::size_t i = 0; i < k; ++i) {
      edge += mbs[i].edge_forward_s;
      if (i == 0) first_sent[static_cast<std::size_t>(s)] = edge;
      up = std::max(up, edge) + mbs[i].up_s;
      if (i == 0)  // the step before is updated first: all its weight gradients
        while (deferred_next < deferred.size()) cloud += deferred[deferred_next++];
      while (deferred_next < deferred.size() && cloud < up) cloud += deferred[deferred_next++];  // while idle
      cloud = std::max(cloud, up) + mbs[i].cloud_s;
      deferred.push_back(mbs[i].cloud_deferred_s);
      down = std::max(down, cloud) + mbs[i].down_s;
      arrived[static_cast<std::size_t>(s)][i] = down;
    }
  };
  const auto backwards = [&](int s) {
    for (std::size_t i = 0; i < k; ++i) {
      edge = std::max(edge, arrived[static_cast<std::size_t>(s)][i]);
      if (i == 0) first_taken[static_cast<std::size_t>(s)] = edge;
      edge += mbs[i].edge_backward_s;
    }
    done[static_cast<std::size_t>(s)] = edge;
  };
  forwards(0);
  for (int s = 0; s < kSteps; ++s) {
    if (s + 1 < kSteps) forwards(s + 1);
    backwards(s);
  }
  StepTimeline t;
  t.step_s = (done[kLast] - done[kFirst]) / (kLast - kFirst);
  t.first_grad_s = first_taken[kLast] - first_sent[kLast];
  set_idle(mbs, t);
  return t;
}

const PlanRow& recommend(const std::vector<PlanRow>& rows) {
  const PlanRow* best = nullptr;
  for (const PlanRow& r : rows)
    if (r.fits && (!best || r.samples_per_s > best->samples_per_s)) best = &r;
  if (!best) fail("planner", "no cut fits in the edge's memory; raise --edge-memory-mb or use a smaller batch");
  return *best;
}

std::vector<std::string> legal_cuts(const Graph& graph) {
  std::vector<std::string> cuts;
  for (std::size_t i = 0; i < graph.nodes().size(); ++i) {
    if (static_cast<int>(i) == graph.output()) continue;
    try {
      (void)graph.split(graph.nodes()[i].spec.name);
      cuts.push_back(graph.nodes()[i].spec.name);
    } catch (const Error&) {  // crossed by more than one tensor
    }
  }
  return cuts;
}

double training_memory_bytes(Network& shard, int64_t batch, int64_t microbatch, int state_per_param) {
  const auto floats = [](int64_t n) { return static_cast<double>(n); };
  double params = 0;
  for (Param* p : shard.all_params())
    params += floats(p->value().numel()) * (p->trainable() ? 2.0 + state_per_param : 1.0);
  const Network::ActivationFloats acts = shard.activation_floats();
  return (params + floats(acts.kept * batch) + 2.0 * floats(acts.all * microbatch)) * sizeof(float);
}

std::vector<PlanRow> plan_split(const Graph& graph, const PlanOptions& o, Backend& edge, Backend& cloud) {
  if (!(o.uplink_mbps > 0.0) || !(o.downlink_mbps > 0.0)) fail("planner", "the link's rates must be > 0 Mbit/s");
  const std::vector<std::string> cuts = o.cuts.empty() ? legal_cuts(graph) : o.cuts;
  std::vector<PlanRow> rows;
  for (const std::string& cut : cuts) {
    const auto shards = graph.split(cut);  // not a structured binding: the lambda below captures it
    const Graph& front = shards.first;
    const Graph& back = shards.second;
    const Shape& act = front.nodes()[static_cast<std::size_t>(front.output())].shape;
    // A mask the back shard reads goes up too, a byte a token (Graph::split, read_mask).
    const int64_t mask_bytes = back.inputs().size() > 1 ? back.inputs()[1].shape.numel() : 0;
    // The front as the edge trains it (no input gradient), for its FLOPs and its memory.
    Network probe(front, edge, 1);
    probe.set_input_gradient(false);
    std::optional<Network> back_net;  // the back shard, for its FLOPs
    if (o.cloud_gflops > 0) back_net.emplace(back, cloud, 1);
    std::map<int64_t, std::pair<ShardCost, ShardCost>> at;  // micro-batch size -> (edge, cloud)
    auto cost = [&](int64_t m) -> const std::pair<ShardCost, ShardCost>& {
      auto it = at.find(m);
      if (it != at.end()) return it->second;
      const ShardCost e = o.edge_gflops > 0 ? estimate(probe, m, o.edge_gflops)
                                          : measure(front, edge, m, o.iterations, false);
      const ShardCost c = o.cloud_gflops > 0 ? estimate(*back_net, m, o.cloud_gflops)
                                           : measure(back, cloud, m, o.iterations, true);
      return at.emplace(m, std::pair{e, c}).first->second;
    };
    // Edge memory: parameters with their gradients and momentum; what the K slots keep for
    // backward; one micro-batch's forward and backward.
    for (int k : o.microbatches) {
      if (k > o.batch) continue;
      const double peak_mb = training_memory_bytes(probe, o.batch, microbatch_range(o.batch, k, 0).count, 1) / (1 << 20);
      std::vector<MicrobatchCost> mbs;
      PlanRow row;
      row.cut = cut;
      row.microbatches = k;
      for (int i = 0; i < k; ++i) {
        const int64_t m = microbatch_range(o.batch, k, i).count;
        const auto& [e, c] = cost(m);
        const auto bytes_up =
            static_cast<int64_t>(encoded_bytes(o.dtype, m * act.numel())) + (4 + mask_bytes) * m + kFramingBytes;
        const auto bytes_down = static_cast<int64_t>(encoded_bytes(o.dtype, m * act.numel())) + kFramingBytes;
        MicrobatchCost mc{e.forward_s, e.backward_s, c.forward_s + c.backward_s - c.weights_s, c.weights_s,
                          static_cast<double>(bytes_up) * kWireOverhead * 8.0 / (o.uplink_mbps * 1e6),
                          static_cast<double>(bytes_down) * kWireOverhead * 8.0 / (o.downlink_mbps * 1e6)};
        mbs.push_back(mc);
        row.edge_s += mc.edge_forward_s + mc.edge_backward_s;
        row.cloud_s += mc.cloud_s + mc.cloud_deferred_s;
        row.up_s += mc.up_s;
        row.down_s += mc.down_s;
        row.bytes_up_per_step += bytes_up;
      }
      const StepTimeline t = o.async ? simulate_async_steps(mbs) : simulate_step(mbs);
      row.step_s = t.step_s;
      row.first_grad_s = t.first_grad_s;
      row.edge_idle_s = t.edge_idle_s;
      row.cloud_idle_s = t.cloud_idle_s;
      row.samples_per_s = static_cast<double>(o.batch) / row.step_s;
      row.edge_peak_mb = peak_mb;
      row.fits = o.edge_memory_mb <= 0.0 || peak_mb <= o.edge_memory_mb;
      rows.push_back(row);
    }
  }

  return rows;
}

}  // namespace tandem
