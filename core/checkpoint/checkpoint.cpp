#include "core/checkpoint/checkpoint.h"

#include <cstring>

#include "core/error.h"
#include "core/flatbuffer_read.h"
#include "core/sha256.h"
#include "schema/checkpoint_generated.h"

namespace tandem {
namespace {

constexpr char kMagic[8] = {'T', 'D', 'M', 'C', 'K', 'P', 'T', '1'};
constexpr uint32_t kFormatVersion = 1;
constexpr std::size_t kHeader = sizeof kMagic + sizeof(uint64_t);

using TensorOffsets = std::vector<flatbuffers::Offset<ckpt::NamedTensor>>;

flatbuffers::Offset<ckpt::NamedTensor> put(flatbuffers::FlatBufferBuilder& b, const std::string& name, const Tensor& t) {
  std::vector<int64_t> dims(static_cast<std::size_t>(t.shape().rank()));
  for (int i = 0; i < t.shape().rank(); ++i) dims[static_cast<std::size_t>(i)] = t.shape()[i];
  return ckpt::CreateNamedTensor(b, b.CreateString(name), b.CreateVector(dims),
                                 b.CreateVector(t.data(), static_cast<std::size_t>(t.numel())));
}

std::vector<NamedTensor> take(const flatbuffers::Vector<flatbuffers::Offset<ckpt::NamedTensor>>* list,
                              const char* what) {
  std::vector<NamedTensor> out;
  if (list == nullptr) return out;
  for (const ckpt::NamedTensor* t : *list) {
    if (t->name() == nullptr || t->shape() == nullptr || t->data() == nullptr)
      fail("checkpoint", cat("a ", what, " tensor lacks its name, shape or data"));
    const std::string name = t->name()->str();
    if (t->shape()->size() > static_cast<uint32_t>(kMaxRank))
      fail("checkpoint", cat(what, " '", name, "' has rank ", t->shape()->size()));
    int64_t dims[kMaxRank] = {};
    int64_t n = 1;
    for (uint32_t i = 0; i < t->shape()->size(); ++i) {
      dims[i] = int64_at(*t->shape(), i);
      if (dims[i] < 0 || dims[i] > (int64_t{1} << 32)) fail("checkpoint", cat(what, " '", name, "' has a bad shape"));
      // Found by tests/fuzz (checkpoint): a few dimensions near 2^32 overflowed the count.
      if (__builtin_mul_overflow(n, dims[i], &n))
        fail("checkpoint", cat(what, " '", name, "' has a bad shape (its element count overflows)"));
    }
    if (n != static_cast<int64_t>(t->data()->size()))
      fail("checkpoint", cat(what, " '", name, "' holds ", t->data()->size(), " values for ", n, " elements"));
    Tensor v = Tensor::empty(Shape::of(dims, static_cast<int>(t->shape()->size())));
    if (n > 0) std::memcpy(v.data(), t->data()->data(), static_cast<std::size_t>(n) * sizeof(float));
    out.push_back({name, std::move(v)});
  }
  return out;
}

// Finds `name` in `saved` with `shape`, or says which is missing or different.
const Tensor& match(const std::vector<NamedTensor>& saved, const std::string& name, const Shape& shape,
                    const char* what) {
  for (const NamedTensor& t : saved)
    if (t.name == name) {
      if (t.value.shape() != shape)
        fail("checkpoint", cat(what, " '", name, "' is ", t.value.shape().str(), " in the checkpoint but ",
                               shape.str(), " in the model"));
      return t.value;
    }
  fail("checkpoint", cat("the checkpoint has no ", what, " '", name, "' (was it written for another model or cut?)"));
}

}  // namespace

std::vector<uint8_t> encode_checkpoint(const CheckpointMeta& meta, std::span<Network* const> nets, Optimizer* optimizer) {
  flatbuffers::FlatBufferBuilder b(1 << 16);
  TensorOffsets params, buffers, state;
  std::vector<flatbuffers::Offset<ckpt::NamedCounter>> counters;
  for (Network* net : nets) {
    for (Param* p : net->params()) params.push_back(put(b, p->name(), p->value()));
    for (auto& [name, t] : net->buffers()) buffers.push_back(put(b, name, *t));
    for (auto& [name, v] : net->counters()) counters.push_back(ckpt::CreateNamedCounterDirect(b, name.c_str(), *v));
  }
  if (optimizer != nullptr) {
    int k = 0;
    for (Tensor* t : optimizer->state()) state.push_back(put(b, cat("state", k++), *t));
  }
  const auto root = ckpt::CreateCheckpoint(
      b, kFormatVersion, b.CreateString(meta.role), b.CreateString(meta.client_id),
      b.CreateVector(meta.model_hash.data(), meta.model_hash.size()), b.CreateString(meta.cut), meta.step, meta.epoch,
      meta.cursor, b.CreateString(optimizer ? optimizer->options().kind : std::string()),
      optimizer ? optimizer->steps() : 0, b.CreateVector(params), b.CreateVector(buffers), b.CreateVector(counters),
      b.CreateVector(state));
  b.Finish(root, ckpt::CheckpointIdentifier());
  const std::size_t n = b.GetSize();
  std::vector<uint8_t> out(kHeader + n + 32);
  std::memcpy(out.data(), kMagic, sizeof kMagic);
  for (int i = 0; i < 8; ++i) out[sizeof kMagic + i] = static_cast<uint8_t>(static_cast<uint64_t>(n) >> (8 * i));
  std::memcpy(out.data() + kHeader, b.GetBufferPointer(), n);
  const auto digest = sha256(b.GetBufferPointer(), n);
  std::memcpy(out.data() + kHeader + n, digest.data(), digest.size());
  return out;
}

CheckpointData decode_checkpoint(std::span<const uint8_t> bytes) {
  if (bytes.size() < kHeader || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    fail("checkpoint", "not a tandem checkpoint (bad magic; an encrypted one needs its key)");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(bytes[sizeof kMagic + i]) << (8 * i);
  if (n > bytes.size() || bytes.size() - kHeader != n + 32)
    fail("checkpoint", cat("truncated or padded: the header announces ", n, " payload bytes, the file holds ",
                           bytes.size() < kHeader + 32 ? 0 : bytes.size() - kHeader - 32));
  const uint8_t* payload = bytes.data() + kHeader;
  const auto digest = sha256(payload, n);
  if (std::memcmp(digest.data(), payload + n, 32) != 0) fail("checkpoint", "checksum mismatch: the file is corrupt");
  // The payload is copied so the verifier and the reads see aligned memory.
  std::vector<uint8_t> copy(payload, payload + n);
  flatbuffers::Verifier verifier(copy.data(), copy.size(), 64, 10'000'000);
  if (!ckpt::VerifyCheckpointBuffer(verifier)) fail("checkpoint", "the payload does not verify as a checkpoint");
  const ckpt::Checkpoint* c = ckpt::GetCheckpoint(copy.data());
  if (c->format_version() != kFormatVersion)
    fail("checkpoint", cat("format version ", c->format_version(), "; this build reads ", kFormatVersion));
  CheckpointData d;
  auto str = [](const flatbuffers::String* s) { return s ? s->str() : std::string(); };
  d.meta.role = str(c->role());
  d.meta.client_id = str(c->client_id());
  d.meta.cut = str(c->cut());
  if (c->model_hash() == nullptr || c->model_hash()->size() != 32) fail("checkpoint", "the model hash is missing");
  std::memcpy(d.meta.model_hash.data(), c->model_hash()->data(), 32);
  d.meta.step = c->step();
  d.meta.epoch = c->epoch();
  d.meta.cursor = c->cursor();
  d.optimizer_kind = str(c->optimizer_kind());
  d.optimizer_steps = c->optimizer_steps();
  d.params = take(c->params(), "parameter");
  d.buffers = take(c->buffers(), "buffer");
  d.optimizer_state = take(c->optimizer_state(), "optimizer state");
  if (c->counters())
    for (const ckpt::NamedCounter* k : *c->counters()) d.counters.emplace_back(str(k->name()), k->value());
  return d;
}

void restore_checkpoint(const CheckpointData& d, std::span<Network* const> nets, Optimizer* optimizer) {
  // Every check first, so a checkpoint that does not fit leaves the model untouched.
  std::vector<std::pair<Tensor*, const Tensor*>> copies;
  std::vector<std::pair<std::string, Tensor*>> all_buffers;
  std::vector<std::pair<std::string, uint64_t*>> all_counters;
  for (Network* net : nets) {
    for (Param* p : net->params())
      copies.emplace_back(&p->value(), &match(d.params, p->name(), p->value().shape(), "parameter"));
    for (auto& b : net->buffers()) all_buffers.push_back(b);
    for (auto& c : net->counters()) all_counters.push_back(c);
  }
  for (auto& [name, t] : all_buffers) copies.emplace_back(t, &match(d.buffers, name, t->shape(), "buffer"));
  std::vector<std::pair<uint64_t*, uint64_t>> counters;
  for (auto& [name, v] : all_counters) {
    bool found = false;
    for (auto& [saved, value] : d.counters)
      if (saved == name) {
        counters.emplace_back(v, value);
        found = true;
      }
    if (!found) fail("checkpoint", cat("the checkpoint has no counter '", name, "'"));
  }
  if (optimizer != nullptr) {
    if (d.optimizer_kind != optimizer->options().kind)
      fail("checkpoint", cat("the checkpoint's optimizer is '", d.optimizer_kind, "' but this run uses '",
                             optimizer->options().kind, "'"));
    const std::vector<Tensor*> state = optimizer->state();
    if (state.size() != d.optimizer_state.size())
      fail("checkpoint", cat("the checkpoint has ", d.optimizer_state.size(), " optimizer state tensors, this run ",
                             state.size(), " (different momentum?)"));
    for (std::size_t k = 0; k < state.size(); ++k)
      copies.emplace_back(state[k], &match(d.optimizer_state, cat("state", k), state[k]->shape(), "optimizer state"));
  }
  for (auto& [dst, src] : copies) dst->copy_from(*src);
  for (auto& [dst, v] : counters) *dst = v;
  for (Network* net : nets)
    for (Param* p : net->params()) p->bump_version();
  if (optimizer != nullptr) optimizer->set_steps(d.optimizer_steps);
}

}  // namespace tandem
