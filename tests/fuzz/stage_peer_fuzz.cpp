// Fuzzes a stage of a pipeline across parties (pipeline/stage_peer.h): the middle of three
// stages takes arbitrary frames from the stage before (or, shared, from either of two first
// stages taking turns and averaged every round: FrontWeights) and the stage after (stage_setup.h):
// StageHello, Activations (of steps and evaluation batches), Gradients, Evaluated, Drain (under
// the async schedule), Bye, Error. Every problem must be an Error (a refusal
// on the link) or a lost link, never a crash, a sanitizer report or another exception; every
// message it sends must verify.
#include "tests/fuzz/stage_setup.h"

using namespace tandem;

namespace {

// A link that hands out the input's frames for its side and checks what the stage sends.
class ScriptedLink final : public StageLink {
 public:
  std::deque<std::span<const uint8_t>> frames;
  void send(std::span<const uint8_t> bytes) override { fuzz::check_outgoing(bytes, "the stage peer"); }
  Frame receive(const char* awaiting) override {
    if (frames.empty()) throw LinkLost(cat("no more input while awaiting ", awaiting));
    const std::span<const uint8_t> f = frames.front();
    frames.pop_front();
    return Frame::copy_of(f.data(), f.size());
  }
  void refuse(const WireError& error) override {
    if (error.ok()) {
      std::fprintf(stderr, "the stage refused a message without saying why\n");
      std::abort();
    }
    frames.clear();  // the link is closed
  }
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::stage_model();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const fuzz::Input in = fuzz::split_input(data, size);
  fuzz::StageUnderTest middle(1, in.flags);
  // A frame's first byte: bit 0 from the stage after, else bit 1 from the second first stage
  // (where two share this one).
  ScriptedLink up[2], down;
  const bool shared = (in.flags & fuzz::kStageShared) != 0;
  for (const auto& f : in.frames) {
    if (f.empty()) continue;
    ((f[0] & 1) ? down : up[shared && (f[0] & 2) ? 1 : 0]).frames.push_back(f.subspan(1));
  }
  StageLink* const ups[2] = {&up[0], &up[1]};
  StagePeer peer(*middle.stage, middle.schedule, middle.plan, std::span<StageLink* const>(ups, shared ? 2 : 1), &down);
  if (shared) peer.set_first_stage(fuzz::StageUnderTest::first_stage(in.flags));
  if (in.flags & fuzz::kStageEnded) peer.set_ended(2, true);
  const std::vector<uint64_t> checkpoints =
      (in.flags & fuzz::kStageHasCheckpoints) ? std::vector<uint64_t>{1, 2} : std::vector<uint64_t>{};
  for (int round = 0; round < 3 && (!up[0].frames.empty() || !up[1].frames.empty() || !down.frames.empty()); ++round) {
    try {
      peer.connect(checkpoints);
      StepStats stats;
      while (peer.follow_step(stats)) {
      }
      break;
    } catch (const LinkLost&) {
      peer.reset();  // as a restart does; the rest of the input is the next round's
    } catch (const Error&) {
      break;  // refused, or the neighbour ended the run
    }
  }
  return 0;
}
