#include "edge/agent/sent_record.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "core/interop/safetensors.h"
#include "core/wire/frame.h"
#include "core/wire/tensor_codec.h"
#include "ports/files/atomic_file.h"

namespace tandem {

SentRecord::SentRecord(std::string path, int64_t epoch, int64_t limit)
    : path_(std::move(path)), epoch_(epoch), limit_(limit) {}

void SentRecord::on_forward(int64_t epoch, std::span<const int64_t> samples, std::span<const uint8_t> message) {
  if (epoch != epoch_) return;
  WireError error;
  const Frame frame = Frame::copy_of(message.data(), message.size());
  const wire::Message* m = verify_frame(frame, kDefaultMaxMessageBytes, error);
  if (!m || m->payload_type() != wire::Payload::Forward || !m->payload_as_Forward()->activations())
    fail("edge", cat("--record-sent: a training message that is not a Forward with activations (", error.text, ")"));
  const wire::TensorMsg& t = *m->payload_as_Forward()->activations();
  const auto n = static_cast<int64_t>(samples.size());
  int64_t count = 1;
  if (t.shape())
    for (const int64_t d : *t.shape()) count *= d;
  if (n == 0 || count % n != 0) fail("edge", cat("--record-sent: ", count, " values for ", n, " samples"));
  if (width_ < 0) {
    width_ = count / n;
    // A sample's shape in tandem's layout (channels last: [H, W, C] for an image's).
    sample_shape_ = "[";
    if (t.shape())
      for (flatbuffers::uoffset_t i = 1; i < t.shape()->size(); ++i)
        sample_shape_ += cat(i > 1 ? "," : "", t.shape()->Get(i));
    sample_shape_ += "]";
  }
  if (count / n != width_) fail("edge", cat("--record-sent: ", count / n, " values a sample after ", width_));
  std::vector<float> values(static_cast<std::size_t>(count));
  std::string why;
  if (!t.data() || !decode_tensor(t.dtype(), t.data()->data(), count, t.scale(), values.data(), why))
    fail("edge", cat("--record-sent: ", why));
  if (rows_.empty()) {
    rows_.resize(static_cast<std::size_t>(limit_ * width_));
    samples_.resize(static_cast<std::size_t>(limit_));
  }
  for (int64_t i = 0; i < n; ++i, ++seen_) {
    const int64_t at = seen_ % limit_;
    std::copy_n(values.data() + i * width_, width_, rows_.data() + at * width_);
    samples_[static_cast<std::size_t>(at)] = samples[static_cast<std::size_t>(i)];
  }
}

void SentRecord::write() const {
  // The ring in the order sent: from the oldest kept.
  const int64_t n = std::min(seen_, limit_), first = seen_ > limit_ ? seen_ % limit_ : 0;
  const int64_t width = std::max<int64_t>(width_, 0);
  std::vector<float> rows(static_cast<std::size_t>(n * width));
  std::vector<int64_t> samples(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t at = (first + i) % limit_;
    std::copy_n(rows_.data() + at * width, width, rows.data() + i * width);
    samples[static_cast<std::size_t>(i)] = samples_[static_cast<std::size_t>(at)];
  }
  const std::vector<uint8_t> file = write_safetensors(
      {f32_tensor("activations", {n, width}, rows.data()), i64_tensor("samples", {n}, samples.data())},
      {{"epoch", std::to_string(epoch_)}, {"sample_shape", sample_shape_}});
  write_file_atomic(path_, file);
  std::fprintf(stderr, "--record-sent: %lld samples of epoch %lld as sent (%lld values each) in %s\n",
               static_cast<long long>(n), static_cast<long long>(epoch_), static_cast<long long>(width_), path_.c_str());
}

}  // namespace tandem
