// Fuzzes the edge's handling of the cloud's messages: a sequence of frames through
// EventEdge::on_message (and EdgeSession: Welcome, Backward, Aggregated, EvalResult, Error).
#include "tests/fuzz/fuzz_setup.h"

using namespace tandem;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::model();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const fuzz::Input in = fuzz::split_input(data, size);
  fuzz::EdgeMemoryCheckpoints checkpoints;
  EventEdge edge(
      fuzz::model().spec, fuzz::edge_config(in.flags, &checkpoints),
      [](std::span<const uint8_t> bytes) { fuzz::check_outgoing(bytes, "the edge"); },
      [](const EdgeEvent& e) { (void)e.json(); });
  fuzz::give_data(edge);
  // Never an exception: a bad message ends the run (on_message returns false).
  edge.on_open();
  for (const auto& f : in.frames)
    if (!edge.on_message(Frame::copy_of(f.data(), f.size()))) break;
  if (!edge.finished()) edge.on_closed("the fuzz input ended");
  return 0;
}
