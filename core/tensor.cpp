#include "core/tensor.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <new>

#include "core/error.h"

namespace tandem {

Shape::Shape(std::initializer_list<int64_t> dims) {
  if (dims.size() > kMaxRank) fail("tensor", cat("rank ", dims.size(), " exceeds ", kMaxRank));
  for (int64_t d : dims) dims_[static_cast<std::size_t>(rank_++)] = d;
}

Shape Shape::of(const int64_t* dims, int rank) {
  if (rank < 0 || rank > kMaxRank) fail("tensor", cat("rank ", rank, " is not in [0, ", kMaxRank, "]"));
  Shape s;
  for (int i = 0; i < rank; ++i) s.dims_[static_cast<std::size_t>(i)] = dims[i];
  s.rank_ = rank;
  return s;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<std::size_t>(i)];
  return n;
}

bool Shape::numel_at_most(int64_t limit) const {
  for (int i = 0; i < rank_; ++i)
    if (dims_[static_cast<std::size_t>(i)] == 0) return limit >= 0;
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) {
    const int64_t d = dims_[static_cast<std::size_t>(i)];
    if (d < 0 || n > limit / d) return false;
    n *= d;
  }
  return n <= limit;
}

int64_t Shape::item_numel() const {
  int64_t n = 1;
  for (int i = 1; i < rank_; ++i) n *= dims_[static_cast<std::size_t>(i)];
  return n;
}

Shape Shape::resize_batch(int64_t n) const {
  Shape s = *this;
  if (s.rank_ > 0) s.dims_[0] = n;
  return s;
}

Shape Shape::batched(int64_t n) const {
  if (rank_ >= kMaxRank) fail("tensor", cat("cannot add a batch dimension to ", str(), ": rank ", kMaxRank, " at most"));
  Shape s;
  s.rank_ = rank_ + 1;
  s.dims_[0] = n;
  for (int i = 0; i < rank_; ++i) s.dims_[static_cast<std::size_t>(i + 1)] = dims_[static_cast<std::size_t>(i)];
  return s;
}

std::string Shape::str() const {
  std::string out = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i) out += ", ";
    out += std::to_string(dims_[static_cast<std::size_t>(i)]);
  }
  return out + "]";
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (dims_[static_cast<std::size_t>(i)] != o.dims_[static_cast<std::size_t>(i)]) return false;
  return true;
}

void AlignedFree::operator()(float* p) const {
  ::operator delete[](p, std::align_val_t{kTensorAlignment});
}

std::size_t padded_tensor_bytes(std::size_t count) { return ((count + 15) / 16 * 16 + 16) * sizeof(float); }

std::unique_ptr<float, AlignedFree> aligned_floats(std::size_t count) {
  auto* p = static_cast<float*>(::operator new[](padded_tensor_bytes(count), std::align_val_t{kTensorAlignment}));
  return std::unique_ptr<float, AlignedFree>(p);
}

namespace {
std::atomic<const TensorMemory*> g_memory{nullptr};
}  // namespace

void set_tensor_memory(const TensorMemory* memory) { g_memory.store(memory); }

Tensor Tensor::empty(const Shape& shape) {
  if (shape.numel() < 0) fail("tensor", cat("negative size in shape ", shape.str()));
  Tensor t;
  const auto count = static_cast<std::size_t>(shape.numel());
  const TensorMemory* memory = g_memory.load();
  void* p = memory && count * sizeof(float) >= memory->min_bytes ? memory->allocate(padded_tensor_bytes(count), count * sizeof(float)) : nullptr;
  if (p)
    t.storage_ = std::shared_ptr<float>(static_cast<float*>(p), [memory](float* q) { memory->release(q); });
  else
    t.storage_ = std::shared_ptr<float>(aligned_floats(count));
  t.shape_ = shape;
  return t;
}

Tensor Tensor::zeros(const Shape& shape) {
  Tensor t = empty(shape);
  t.fill(0.0f);
  return t;
}

Tensor Tensor::borrow(std::shared_ptr<const void> owner, const float* data, const Shape& shape) {
  Tensor t;
  // Aliasing constructor: shares ownership of `owner`, points at `data`.
  t.storage_ = std::shared_ptr<float>(std::const_pointer_cast<void>(std::move(owner)), const_cast<float*>(data));
  t.shape_ = shape;
  return t;
}

Tensor Tensor::slice_batch(int64_t begin, int64_t count) const {
  if (shape_.rank() == 0 || begin < 0 || count < 0 || begin + count > shape_[0])
    fail("tensor", cat("batch slice [", begin, ", ", begin + count, ") out of ", shape_.str()));
  Tensor t = *this;
  t.offset_ = offset_ + begin * shape_.item_numel();
  t.shape_ = shape_.resize_batch(count);
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  if (shape.numel() != numel())
    fail("tensor", cat("cannot reshape ", shape_.str(), " to ", shape.str()));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::prefix(const Shape& shape) const {
  if (shape.numel() > numel()) fail("tensor", cat("cannot see ", shape_.str(), " as the larger ", shape.str()));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_);
  if (numel() > 0) std::memcpy(t.data(), data(), bytes());
  return t;
}

void Tensor::fill(float value) { std::fill_n(data(), numel(), value); }

void Tensor::copy_from(const Tensor& src) {
  if (src.numel() != numel())
    fail("tensor", cat("copy of ", src.shape().str(), " into ", shape_.str()));
  if (numel() > 0) std::memmove(data(), src.data(), bytes());
}

bool all_finite(const Tensor& t) {
  const float* p = t.data();
  for (int64_t i = 0, n = t.numel(); i < n; ++i)
    if (!std::isfinite(p[i])) return false;
  return true;
}

}  // namespace tandem
