#include "core/wire/frame.h"

#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace tandem {
namespace {

// Frames of kPooledFrameBytes and more (activations and gradients) live in tensors a pool
// recycles: a steady stream of micro-batches reuses the same few buffers instead of allocating
// megabytes each, and they are made through the tensor memory hook (core/tensor.h), so that a
// cuda backend copies activations borrowed from them by DMA (page-locked) or uses them in
// place (managed). Sizes round up to whole 64 KiB; at most kPoolCacheBytes wait for reuse.
constexpr std::size_t kPooledFrameBytes = std::size_t{64} << 10;
constexpr std::size_t kPoolCacheBytes = std::size_t{256} << 20;

class FramePool {
 public:
  std::shared_ptr<const uint8_t> take(std::size_t size) {
    const std::size_t bytes = (size + kPooledFrameBytes - 1) / kPooledFrameBytes * kPooledFrameBytes;
    Tensor t;
    {
      std::lock_guard lock(mu_);
      for (std::size_t i = 0; i < free_.size(); ++i)
        if (free_[i].bytes() == bytes) {
          t = std::move(free_[i]);
          free_[i] = std::move(free_.back());
          free_.pop_back();
          cached_ -= bytes;
          break;
        }
    }
    if (!t.defined()) t = Tensor::empty({static_cast<int64_t>(bytes / sizeof(float))});
    const auto* p = reinterpret_cast<const uint8_t*>(t.data());
    return std::shared_ptr<const uint8_t>(p, [this, t = std::move(t)](const uint8_t*) mutable { give(std::move(t)); });
  }

 private:
  void give(Tensor t) {
    std::lock_guard lock(mu_);
    if (cached_ + t.bytes() > kPoolCacheBytes) return;  // freed with the tensor
    cached_ += t.bytes();
    free_.push_back(std::move(t));
  }

  std::mutex mu_;
  std::vector<Tensor> free_;
  std::size_t cached_ = 0;
};

FramePool& frame_pool() {
  static FramePool* pool = new FramePool;  // never destroyed: frames may outlive statics
  return *pool;
}

}  // namespace

Frame Frame::copy_of(const uint8_t* data, std::size_t size) {
  Frame f;
  if (size >= kPooledFrameBytes) {
    f.bytes_ = frame_pool().take(size);
  } else {
    auto* p = static_cast<uint8_t*>(::operator new[](size == 0 ? 1 : size, std::align_val_t{kTensorAlignment}));
    f.bytes_ = std::shared_ptr<const uint8_t>(p, [](const uint8_t* q) {
      ::operator delete[](const_cast<uint8_t*>(q), std::align_val_t{kTensorAlignment});
    });
  }
  if (size) std::memcpy(const_cast<uint8_t*>(f.bytes_.get()), data, size);
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
