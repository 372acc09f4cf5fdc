// Reads image classification data in the IDX format (MNIST, Fashion-MNIST), gzipped or
// plain, into NHWC f32 images scaled to [0, 1] and int32 labels; errors say what to install.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tandem {

struct LabelledImages {
  Tensor images;  // [N, H, W, 1], values in [0, 1]
  std::vector<int32_t> labels;
  int32_t classes = 0;
};

// Reads <dir>/<prefix>-images-idx3-ubyte[.gz] and <dir>/<prefix>-labels-idx1-ubyte[.gz].
// `limit` > 0 keeps only the first `limit` samples.
LabelledImages read_idx_dataset(const std::string& dir, const std::string& prefix, int64_t limit = 0);

// Fashion-MNIST from Debian's dataset-fashion-mnist (train: "train", test: "t10k"); the
// folder can be overridden with TANDEM_FASHION_MNIST_DIR.
std::string fashion_mnist_dir();
LabelledImages load_fashion_mnist(bool train, int64_t limit = 0);

}  // namespace tandem
