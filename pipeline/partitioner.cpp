#include "pipeline/partitioner.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/microbatch.h"
#include "core/ops/op.h"
#include "core/planner.h"
#include "pipeline/schedule.h"

namespace tandem {
namespace {

// What a message carries beyond its tensor (frames, TLS, TCP): bench/shaped_link.sh measured
// 1.066x on the uplink (core/planner.cpp's kWireOverhead).
constexpr double kWireOverhead = 1.066;

// Per graph node, for one sample: FLOPs of forward and of backward (as `whole` backs up),
// floats of parameters (trainable ones with gradient and state) and of the output it keeps.
struct NodeWork {
  double forward_flops = 0, backward_flops = 0;
  double param_floats = 0, kept_floats = 0;
};

// Sums over a model's prefix: everything up to and including a legal cut (its ancestors).
struct Prefix {
  NodeWork work;
  int64_t cut_floats = 0;  // the cut's output, a sample's
  std::string first_after;
};

class Model {
 public:
  Model(const Network& whole, const PartitionOptions& o) : graph_(whole.graph()) {
    const auto& nodes = graph_.nodes();
    const bool measured = !o.measured_forward_s.empty();
    if (measured && (o.measured_forward_s.size() != nodes.size() || o.measured_backward_s.size() != nodes.size() ||
                     !(o.measured_gflops > 0)))
      fail("partitioner", cat("measured costs for ", o.measured_forward_s.size(), " nodes of ", nodes.size(),
                              " (and a machine speed > 0) are needed: profile the whole model"));
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      const GraphNode& n = nodes[i];
      const OpCost cost = op_cost(n.spec, graph_.input_shapes(n), n.shape);
      NodeWork w;
      const int idx = static_cast<int>(i);
      // Measured: the FLOPs that take the measured time at the measuring machine's speed.
      w.forward_flops = measured ? o.measured_forward_s[i] * o.measured_gflops * 1e9 : cost.forward_flops;
      w.backward_flops = measured ? o.measured_backward_s[i] * o.measured_gflops * 1e9
                                  : (whole.computes_weight_grads(idx) ? cost.backward_weights_flops : 0.0) +
                                        (whole.computes_input_grads(idx) ? cost.backward_data_flops : 0.0);
      w.kept_floats = static_cast<double>(n.shape.numel());
      work_.push_back(w);
    }
    for (const Param* p : whole.all_params()) {
      const std::string node = p->name().substr(0, p->name().rfind('.'));
      const int idx = graph_.find(node);
      if (idx >= 0)
        work_[static_cast<std::size_t>(idx)].param_floats +=
            static_cast<double>(p->value().numel()) * (p->trainable() ? 2.0 + o.state_per_param : 1.0);
    }
    cuts_ = legal_cuts(graph_);
    for (const std::string& c : cuts_) prefix_.push_back(prefix_of(graph_.find(c)));
    whole_ = prefix_of(graph_.output());
  }
  const std::vector<std::string>& cuts() const { return cuts_; }
  const Prefix& at(std::size_t cut) const { return prefix_[cut]; }
  const Prefix& whole() const { return whole_; }
  const Graph& graph() const { return graph_; }
  std::size_t index_of(const std::string& cut) const {
    const auto it = std::find(cuts_.begin(), cuts_.end(), cut);
    if (it == cuts_.end()) fail("partitioner", cat("'", cut, "' is not a legal cut of ", graph_.name()));
    return static_cast<std::size_t>(it - cuts_.begin());
  }

 private:
  Prefix prefix_of(int node) const {
    const auto& nodes = graph_.nodes();
    const std::vector<bool> in = graph_.ancestors(node);
    Prefix p;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      if (!in[i]) {
        if (p.first_after.empty()) p.first_after = nodes[i].spec.name;
        continue;
      }
      p.work.forward_flops += work_[i].forward_flops;
      p.work.backward_flops += work_[i].backward_flops;
      p.work.param_floats += work_[i].param_floats;
      p.work.kept_floats += work_[i].kept_floats;
    }
    p.cut_floats = nodes[static_cast<std::size_t>(node)].shape.numel();
    return p;
  }
  const Graph& graph_;
  std::vector<NodeWork> work_;
  std::vector<std::string> cuts_;
  std::vector<Prefix> prefix_;
  Prefix whole_;
};

void check_nodes(const std::vector<PipelineNode>& nodes) {
  if (nodes.empty()) fail("partitioner", "no machines: give at least one node");
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const PipelineNode& n = nodes[i];
    if (!(n.gflops > 0) || !std::isfinite(n.gflops))
      fail("partitioner", cat("node '", n.name, "': gflops must be > 0 (what it sustains in training; `tandem profile` "
                              "measures it)"));
    if (!(n.memory_mb >= 0)) fail("partitioner", cat("node '", n.name, "': memory_mb must be >= 0 (0: no bound)"));
    if (i + 1 < nodes.size() && !(n.link_mbps > 0))
      fail("partitioner", cat("node '", n.name, "': link_mbps (to '", nodes[i + 1].name, "') must be > 0"));
  }
}

// The plan for the stages between `bounds` (indices into the legal cuts; the last stage
// ends at the output) at K micro-batches.
PipelinePlan plan_for(const Model& model, const std::vector<PipelineNode>& nodes, const std::vector<std::size_t>& cuts,
                      int k, const PartitionOptions& o, const PipelineSchedule& schedule) {
  PipelinePlan plan;
  plan.microbatches = k;
  const double m = static_cast<double>(microbatch_range(o.batch, k, 0).count);
  std::vector<StageCost> costs;
  Prefix none;
  for (std::size_t s = 0; s < nodes.size(); ++s) {
    const Prefix& from = s == 0 ? none : model.at(cuts[s - 1]);
    const Prefix& to = s + 1 < nodes.size() ? model.at(cuts[s]) : model.whole();
    const double speed = nodes[s].gflops * 1e9;
    PlannedStage st;
    st.node = nodes[s].name;
    st.first = s == 0 ? model.graph().nodes().front().spec.name : from.first_after;
    st.last = s + 1 < nodes.size() ? model.cuts()[cuts[s]] : model.graph().nodes()[static_cast<std::size_t>(model.graph().output())].spec.name;
    st.forward_s = (to.work.forward_flops - from.work.forward_flops) * m / speed;
    st.backward_s = (to.work.backward_flops - from.work.backward_flops) * m / speed;
    if (s + 1 < nodes.size())
      st.link_s = static_cast<double>(to.cut_floats) * m * sizeof(float) * 8.0 * kWireOverhead / (nodes[s].link_mbps * 1e6);
    if (s + 1 < nodes.size()) plan.cuts.push_back(model.cuts()[cuts[s]]);
    // Weight gradients: about half of a backward's FLOPs where both halves run (split evenly
    // for the simulation; a stage that defers none runs them in place all the same).
    costs.push_back({st.forward_s, st.backward_s / 2, st.backward_s / 2, st.link_s});
    plan.stages.push_back(st);
  }
  const ScheduleSimulation sim = simulate(schedule, costs, k);
  plan.step_s = sim.length;
  plan.bubble = sim.bubble;
  plan.samples_per_s = plan.step_s > 0 ? static_cast<double>(o.batch) / plan.step_s : 0.0;
  for (std::size_t s = 0; s < nodes.size(); ++s) {
    const Prefix& from = s == 0 ? none : model.at(cuts[s - 1]);
    const Prefix& to = s + 1 < nodes.size() ? model.at(cuts[s]) : model.whole();
    const double kept = to.work.kept_floats - from.work.kept_floats + static_cast<double>(from.cut_floats);
    const double in_flight = static_cast<double>(sim.peak_in_flight[s]) * m;
    PlannedStage& st = plan.stages[s];
    st.memory_mb = (to.work.param_floats - from.work.param_floats + kept * in_flight) * sizeof(float) / (1 << 20);
    st.fits = nodes[s].memory_mb <= 0 || st.memory_mb <= nodes[s].memory_mb;
    plan.fits = plan.fits && st.fits;
  }
  return plan;
}

}  // namespace

PipelinePlan predict_pipeline(const Network& whole, const std::vector<PipelineNode>& nodes,
                              const std::vector<std::string>& cuts, int microbatches, const PartitionOptions& options) {
  check_nodes(nodes);
  const Model model(whole, options);
  if (microbatches < 1 || microbatches > options.batch)
    fail("partitioner", cat("micro-batches must be in [1, batch ", options.batch, "], got ", microbatches));
  if (cuts.size() + 1 != nodes.size())
    fail("partitioner", cat(cuts.size(), " cuts make ", cuts.size() + 1, " stages for ", nodes.size(), " machines"));
  std::vector<std::size_t> at;
  for (const std::string& c : cuts) {
    at.push_back(model.index_of(c));
    if (at.size() > 1 && at.back() <= at[at.size() - 2])
      fail("partitioner", cat("cut '", c, "' must come after '", cuts[at.size() - 2], "'"));
  }
  return plan_for(model, nodes, at, microbatches, options, *make_pipeline_schedule(options.schedule));
}

std::vector<PipelinePlan> plan_pipeline(const Network& whole, const std::vector<PipelineNode>& nodes,
                                        const PartitionOptions& options) {
  check_nodes(nodes);
  const Model model(whole, options);
  const std::size_t need = nodes.size() - 1, legal = model.cuts().size();
  if (need > legal)
    fail("partitioner", cat(nodes.size(), " machines need ", need, " cuts, and ", model.graph().name(), " has ", legal,
                            " legal ones: use fewer machines"));
  const auto schedule = make_pipeline_schedule(options.schedule);
  std::vector<PipelinePlan> plans;
  // Every increasing choice of `need` cuts among the legal ones (PipeDream searches the same
  // space by dynamic programming; a chain of a few machines over a model's few dozen legal
  // cuts is small enough to simulate every choice with the schedule itself).
  std::vector<std::size_t> at(need);
  for (std::size_t i = 0; i < need; ++i) at[i] = i;
  while (true) {
    for (int k : options.microbatches)
      if (k >= 1 && k <= options.batch) plans.push_back(plan_for(model, nodes, at, k, options, *schedule));
    std::size_t i = need;
    while (i > 0 && at[i - 1] == legal - need + i - 1) --i;
    if (i == 0) break;
    ++at[i - 1];
    for (std::size_t j = i; j < need; ++j) at[j] = at[j - 1] + 1;
  }
  std::stable_sort(plans.begin(), plans.end(), [](const PipelinePlan& a, const PipelinePlan& b) {
    if (a.fits != b.fits) return a.fits;
    return a.samples_per_s > b.samples_per_s;
  });
  return plans;
}

}  // namespace tandem
