// Fuzzes the cloud's handling of an arriving edge's messages: a sequence of frames through
// verify_frame and CloudSession::handle (Hello, Forward, EvalForward, FrontWeights, Bye).
#include "tests/fuzz/fuzz_setup.h"

using namespace tandem;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::model();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const fuzz::Input in = fuzz::split_input(data, size);
  fuzz::Cloud cloud(in.flags, [](std::span<const uint8_t> bytes) { fuzz::check_outgoing(bytes, "the federation"); });
  for (const auto& f : in.frames) {
    // Never an exception: every problem is an Error reply that closes the session.
    const CloudReply r = cloud.session->handle(Frame::copy_of(f.data(), f.size()));
    cloud.session->finish_step();
    fuzz::check_outgoing(r.bytes, "the cloud session");
    fuzz::check_outgoing(r.then, "the cloud session");
    if (r.close) {
      if (!cloud.session->closed()) {
        std::fprintf(stderr, "the cloud closed the connection but not its session\n");
        std::abort();
      }
      break;
    }
  }
  return 0;
}
