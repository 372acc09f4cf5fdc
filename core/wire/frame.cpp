#include "core/wire/frame.h"

#include <cstring>
#include <new>

#include "core/error.h"
#include "core/tensor.h"

namespace tandem {

Frame Frame::copy_of(const uint8_t* data, std::size_t size) {
  Frame f;
  auto* p = static_cast<uint8_t*>(::operator new[](size == 0 ? 1 : size, std::align_val_t{kTensorAlignment}));
  if (size) std::memcpy(p, data, size);
  f.bytes_ = std::shared_ptr<const uint8_t>(p, [](const uint8_t* q) {
    ::operator delete[](const_cast<uint8_t*>(q), std::align_val_t{kTensorAlignment});
  });
  f.size_ = size;
  return f;
}

const wire::Message* verify_frame(const Frame& frame, std::size_t max_bytes, WireError& error) {
  error = {};
  if (frame.size() > max_bytes) {
    error = {wire::ErrorCode::TooLarge, cat("message of ", frame.size(), " bytes exceeds the limit of ", max_bytes)};
    return nullptr;
  }
  if (frame.size() < 8 || !flatbuffers::BufferHasIdentifier(frame.data(), wire::MessageIdentifier())) {
    error = {wire::ErrorCode::Malformed, "not a tandem wire message (missing identifier 'TDMW')"};
    return nullptr;
  }
  // Depth and table limits keep a hostile buffer from costing more than its size.
  flatbuffers::Verifier verifier(frame.data(), frame.size(), /*max_depth=*/16, /*max_tables=*/64);
  if (!wire::VerifyMessageBuffer(verifier)) {
    error = {wire::ErrorCode::Malformed, "message failed FlatBuffers verification (truncated or corrupt)"};
    return nullptr;
  }
  const wire::Message* m = wire::GetMessage(frame.data());
  const auto type = m->payload_type();
  if (type == wire::Payload::NONE || type > wire::Payload::MAX || m->payload() == nullptr) {
    error = {wire::ErrorCode::Malformed, cat("message has no known payload (type ", static_cast<int>(type), ")")};
    return nullptr;
  }
  return m;
}

const char* payload_name(wire::Payload type) {
  if (type > wire::Payload::MAX) return "unknown";
  return wire::EnumNamePayload(type);
}

}  // namespace tandem
