// Arriving wire messages: copied into 64-byte aligned memory, size-capped, run through the
// FlatBuffers Verifier and checked for a known payload. Never throws on peer data: problems
// come back as a WireError (code + text) for the transport to send as Error and close.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "schema/wire_generated.h"

namespace tandem {

inline constexpr uint32_t kProtocolVersion = 1;
// The wire format's version, in every Message (Message.format) and in StageHello: 2 since
// messages carry it and pipelines of stages speak StageHello, Activations and Gradients; 3
// since stages evaluate between steps (Activations.evaluation, Evaluated); 4 since stages run
// the asynchronous schedule and drain its step in flight (Drain); 5 since a run's end is
// acknowledged (Bye answered with Bye up the chain once every later stage recorded its end);
// 6 since StageHello says the run's terms (schedule, batch, K, the link's dtypes, the other
// terms' hash) and the stage after chooses the link's dtype.
inline constexpr uint32_t kWireFormat = 6;
inline constexpr std::size_t kDefaultMaxMessageBytes = 64u << 20;  // 64 MiB

struct WireError {
  wire::ErrorCode code = wire::ErrorCode::Internal;
  std::string text;
  bool ok() const { return text.empty(); }
};

// One received message in aligned memory that tensors can borrow from (Tensor::borrow). Large
// ones (activations, gradients) reuse buffers a pool keeps, made as tensors' storage.
class Frame {
 public:
  // Copies `size` bytes; the caller has already enforced the size cap while collecting them.
  static Frame copy_of(const uint8_t* data, std::size_t size);
  const uint8_t* data() const { return bytes_.get(); }
  std::size_t size() const { return size_; }
  std::shared_ptr<const void> owner() const { return bytes_; }

 private:
  std::shared_ptr<const uint8_t> bytes_;
  std::size_t size_ = 0;
};

// The verified message, or null with `error` set (Malformed or TooLarge).
const wire::Message* verify_frame(const Frame& frame, std::size_t max_bytes, WireError& error);

// "Forward", "Backward", ... for logs and errors.
const char* payload_name(wire::Payload type);

}  // namespace tandem
