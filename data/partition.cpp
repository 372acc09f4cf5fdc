#include "data/partition.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "data/epoch_order.h"

namespace tandem {

LabelledImages partition(const LabelledImages& all, int index, int count, const std::string& scheme) {
  if (count < 1 || index < 0 || index >= count)
    fail("data", cat("--shard ", index, "/", count, ": the index must be in [0, ", count, ")"));
  const int64_t n = all.images.shape()[0];
  std::vector<int64_t> keep;
  if (scheme == "iid") {
    const std::vector<int64_t> order = epoch_order(n, 0x1dULL, 0);  // the same deal on every edge
    for (int64_t i = index; i < n; i += count) keep.push_back(order[static_cast<std::size_t>(i)]);
    std::sort(keep.begin(), keep.end());
  } else if (scheme == "class") {
    std::vector<int64_t> by_class(static_cast<std::size_t>(n));
    std::iota(by_class.begin(), by_class.end(), 0);
    std::stable_sort(by_class.begin(), by_class.end(), [&](int64_t a, int64_t b) {
      return all.labels[static_cast<std::size_t>(a)] < all.labels[static_cast<std::size_t>(b)];
    });
    const int64_t begin = n * index / count, end = n * (index + 1) / count;
    keep.assign(by_class.begin() + begin, by_class.begin() + end);
    std::sort(keep.begin(), keep.end());
  } else {
    fail("data", cat("--split must be iid or class, got '", scheme, "'"));
  }
  if (keep.empty()) fail("data", cat("edge ", index, " of ", count, " gets no samples with --split ", scheme));
  const Shape& s = all.images.shape();
  LabelledImages out;
  out.classes = all.classes;
  out.images = Tensor::empty(Shape{static_cast<int64_t>(keep.size()), s[1], s[2], s[3]});
  const int64_t item = s.item_numel();
  for (std::size_t j = 0; j < keep.size(); ++j) {
    std::memcpy(out.images.data() + static_cast<int64_t>(j) * item, all.images.data() + keep[j] * item,
                static_cast<std::size_t>(item) * sizeof(float));
    out.labels.push_back(all.labels[static_cast<std::size_t>(keep[j])]);
  }
  return out;
}

}  // namespace tandem
