// What the stage peer's harness (stage_peer_fuzz.cpp) and its seeds (make_seeds.cpp) share:
// the middle of three stages of the small sequence model (cuts pos,enc0: the mask and the
// labels travel through it).
//
// A stage input is one flags byte, then frames as in fuzz_setup.h; each frame's first byte
// says whose it is (even: from the stage before, odd: from the stage after), the rest is the
// message. The harness runs the middle stage on them: connect, then steps until a link runs
// dry, then reset and connect again, as a restart does.
#pragma once

#include "pipeline/stage_peer.h"
#include "tests/fuzz/fuzz_setup.h"
#include "tests/memory_link.h"

namespace tandem::fuzz {

inline constexpr const char* kStageCuts = "pos,enc0";
inline constexpr uint32_t kStageBatch = 8, kStageMicrobatches = 2;

enum StageFlags : uint8_t {
  kStageDtypeMask = 3,            // the links' dtype: 0 F32, 1 F16, 2 BF16, 3 I8
  kLabelsAtFirst = 1 << 2,        // labels = "first-party": none travel
  kStageHasCheckpoints = 1 << 3,  // the middle stage has checkpoints of steps 1 and 2
  kStageAsync = 1 << 4,           // the async schedule: a step in flight, Drain
  kStageShared = 1 << 5,          // two first parties share the middle stage, averaged every round (not async)
  kStageEnded = 1 << 6,           // the middle stage recorded the run's end at step 2 (StagePeer::set_ended)
};

inline wire::DType stage_dtype(uint8_t flags) {
  constexpr wire::DType kinds[] = {wire::DType::F32, wire::DType::F16, wire::DType::BF16, wire::DType::I8};
  return kinds[flags & kStageDtypeMask];
}

struct StageModel {
  ModelSpec spec = parse_model_json(kSequenceSpec);
  Graph graph = Graph::build(spec);
  std::vector<Graph> parts = graph.partition(cut_list(kStageCuts));
  std::unique_ptr<Backend> backend = make_backend("reference");
};

inline StageModel& stage_model() {
  static StageModel m;
  return m;
}

// One stage of the three, its network from the whole model's seeded weights.
struct StageUnderTest {
  std::unique_ptr<Network> net;
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<Stage> stage;
  std::unique_ptr<PipelineSchedule> owned_schedule;
  const PipelineSchedule& schedule;
  StagePlan plan;
  // `member`: which first party a first stage is, where two share the next (kStageShared).
  StageUnderTest(std::size_t index, uint8_t flags, uint32_t member = 0)
      : owned_schedule(make_pipeline_schedule((flags & kStageAsync) && !(flags & kStageShared) ? "async" : "gpipe")),
        schedule(*owned_schedule) {
    StageModel& m = stage_model();
    Network whole(m.graph, *m.backend, kSeed);
    net = std::make_unique<Network>(m.parts[index], *m.backend, kSeed);
    for (Param* p : net->all_params()) {
      p->value().copy_from(whole.param(p->name()).value());
      p->bump_version();
    }
    opt = make_optimizer(net->params(), OptimizerOptions{});
    stage = std::make_unique<Stage>(*net, opt.get());
    plan = make_stage_plan(m.spec.binary, m.graph, kStageCuts, m.parts, index, schedule, kStageBatch,
                           kStageMicrobatches, stage_dtype(flags), (flags & kLabelsAtFirst) == 0, "",
                           FirstParties{(flags & kStageShared) ? 2u : 1u, 1});
    plan.member = member;
  }
  // The first stage's parameters, for a shared stage that averages them (set_first_stage).
  static NamedTensors first_stage(uint8_t flags) {
    StageUnderTest front(0, flags);
    NamedTensors out;
    for (Param* p : front.net->params()) out.emplace_back(p->name(), p->value().clone());
    return out;
  }
};

}  // namespace tandem::fuzz
