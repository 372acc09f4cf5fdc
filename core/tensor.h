// Tensor: f32 values in 64-byte aligned shared storage, NHWC for activations. Copies and
// views (batch slices, reshapes) share storage and never allocate.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

namespace tandem {

inline constexpr std::size_t kTensorAlignment = 64;
inline constexpr int kMaxRank = 6;  // ONNX's 5-D views of an image (a channel shuffle) fit

// Up to six dimensions; for activations the first is the batch.
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  static Shape of(const int64_t* dims, int rank);

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[static_cast<std::size_t>(i)]; }
  int64_t& operator[](int i) { return dims_[static_cast<std::size_t>(i)]; }
  int64_t numel() const;
  // Whether numel() is at most `limit`, found without overflowing (for shapes from outside).
  bool numel_at_most(int64_t limit) const;
  // Elements per batch item (product of all but the first dimension).
  int64_t item_numel() const;
  // The same shape with `n` as its first dimension (a slice of a batch).
  Shape resize_batch(int64_t n) const;
  // [n, this...]: a per-sample shape with a batch dimension put in front.
  Shape batched(int64_t n) const;
  std::string str() const;  // e.g. "[64, 28, 28, 1]"

  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

// 64-byte aligned allocation; the deleter frees with the matching aligned delete.
struct AlignedFree {
  void operator()(float* p) const;
};
std::unique_ptr<float, AlignedFree> aligned_floats(std::size_t count);

// Where the storage of large tensors comes from once a GPU backend serves (core's own: 64-byte
// aligned host memory, aligned_floats). The cuda backend installs one when first made, for the
// rest of the process: page-locked host memory (its copies run by DMA) or CUDA managed memory
// (its kernels use tensors in place). Tensor::empty and zeros of at least min_bytes call
// `allocate` with the padded byte count aligned_floats takes and the bytes the values use (a
// test's guard zones follow them); it returns 64-byte aligned storage of at least `bytes` (or
// `used` plus 16 readable bytes), or null to leave this tensor to core's own. `release` gives back what it made, once the last
// view is gone. The object must outlive every tensor (static storage: a tensor's deleter keeps
// its address). Null uninstalls for tensors made later.
struct TensorMemory {
  std::size_t min_bytes;
  void* (*allocate)(std::size_t bytes, std::size_t used);
  void (*release)(void* p);
};
void set_tensor_memory(const TensorMemory* memory);
// The bytes aligned_floats(count) allocates: whole cache lines plus one spare (XNNPACK's
// kernels may read up to 16 bytes past the end of their inputs).
std::size_t padded_tensor_bytes(std::size_t count);

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape);
  static Tensor zeros(const Shape& shape);
  // A read-only view of memory kept alive by `owner` (e.g. a received frame): no copy. The
  // caller must not write through it.
  static Tensor borrow(std::shared_ptr<const void> owner, const float* data, const Shape& shape);

  const Shape& shape() const { return shape_; }
  int64_t numel() const { return shape_.numel(); }
  bool defined() const { return storage_ != nullptr; }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * sizeof(float); }

  float* data() { return storage_.get() + offset_; }
  const float* data() const { return storage_.get() + offset_; }
  float& operator[](int64_t i) { return data()[i]; }
  float operator[](int64_t i) const { return data()[i]; }

  // Items [begin, begin + count) of the first dimension, sharing storage.
  Tensor slice_batch(int64_t begin, int64_t count) const;
  // Same storage seen with another shape of equal element count.
  Tensor reshape(const Shape& shape) const;
  // Its first shape.numel() values seen as `shape` (a buffer reused for smaller tensors).
  Tensor prefix(const Shape& shape) const;
  // Deep copy into fresh storage.
  Tensor clone() const;

  void fill(float value);
  void copy_from(const Tensor& src);  // shapes must hold the same number of elements

 private:
  std::shared_ptr<float> storage_;
  int64_t offset_ = 0;
  Shape shape_;
};

// Whether every value is finite (no NaN, no infinity).
bool all_finite(const Tensor& t);

// A reused buffer: `t`, made anew (uninitialised) only when it is undefined or of another
// shape. Returns it.
inline Tensor& sized(Tensor& t, const Shape& shape) {
  if (!t.defined() || t.shape() != shape) t = Tensor::empty(shape);
  return t;
}

}  // namespace tandem
