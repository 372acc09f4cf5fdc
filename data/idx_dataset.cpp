#include "data/idx_dataset.h"

#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <memory>

#include "core/error.h"

namespace tandem {
namespace {

constexpr std::string_view kWhere = "data";

struct GzClose {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<std::remove_pointer_t<gzFile>, GzClose>;

// Opens name.gz or name (zlib reads plain files too).
GzFile open_idx(const std::string& base, std::string& opened) {
  for (const std::string& path : {base + ".gz", base}) {
    if (!std::filesystem::exists(path)) continue;
    if (gzFile f = gzopen(path.c_str(), "rb")) {
      opened = path;
      return GzFile(f);
    }
  }
  fail(kWhere, cat("missing ", base, "[.gz]; on Debian install the package 'dataset-fashion-mnist' "
                   "(apt-get install dataset-fashion-mnist) or set TANDEM_FASHION_MNIST_DIR"));
}

void read_exact(gzFile f, void* out, std::size_t n, const std::string& path) {
  std::size_t done = 0;
  while (done < n) {
    const int got = gzread(f, static_cast<char*>(out) + done, static_cast<unsigned>(std::min<std::size_t>(n - done, 1u << 30)));
    if (got <= 0) fail(kWhere, cat(path, ": truncated or corrupt IDX file"));
    done += static_cast<std::size_t>(got);
  }
}

uint32_t read_be32(gzFile f, const std::string& path) {
  unsigned char b[4];
  read_exact(f, b, 4, path);
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
}

}  // namespace

LabelledImages read_idx_dataset(const std::string& dir, const std::string& prefix, int64_t limit) {
  std::string images_path, labels_path;
  GzFile images = open_idx(dir + "/" + prefix + "-images-idx3-ubyte", images_path);
  GzFile labels = open_idx(dir + "/" + prefix + "-labels-idx1-ubyte", labels_path);

  if (read_be32(images.get(), images_path) != 0x803) fail(kWhere, cat(images_path, ": not an IDX3 u8 image file"));
  const uint32_t count = read_be32(images.get(), images_path);
  const uint32_t rows = read_be32(images.get(), images_path);
  const uint32_t cols = read_be32(images.get(), images_path);
  if (read_be32(labels.get(), labels_path) != 0x801) fail(kWhere, cat(labels_path, ": not an IDX1 u8 label file"));
  const uint32_t label_count = read_be32(labels.get(), labels_path);
  if (label_count != count)
    fail(kWhere, cat(images_path, " has ", count, " images but ", labels_path, " has ", label_count, " labels"));
  if (rows == 0 || cols == 0 || rows > 4096 || cols > 4096) fail(kWhere, cat(images_path, ": implausible size ", rows, "x", cols));

  const int64_t n = limit > 0 ? std::min<int64_t>(limit, count) : count;
  const int64_t pixels = int64_t{rows} * cols;
  LabelledImages out;
  out.images = Tensor::empty({n, rows, cols, 1});
  std::vector<unsigned char> raw(static_cast<std::size_t>(n * pixels));
  read_exact(images.get(), raw.data(), raw.size(), images_path);
  for (std::size_t i = 0; i < raw.size(); ++i) out.images[static_cast<int64_t>(i)] = static_cast<float>(raw[i]) / 255.0f;
  std::vector<unsigned char> raw_labels(static_cast<std::size_t>(n));
  read_exact(labels.get(), raw_labels.data(), raw_labels.size(), labels_path);
  out.labels.assign(raw_labels.begin(), raw_labels.end());
  for (int32_t l : out.labels) out.classes = std::max(out.classes, l + 1);
  return out;
}

std::string fashion_mnist_dir() {
  const char* env = std::getenv("TANDEM_FASHION_MNIST_DIR");
  return env && *env ? env : "/usr/share/datasets/fashion-mnist";
}

LabelledImages load_fashion_mnist(bool train, int64_t limit) {
  return read_idx_dataset(fashion_mnist_dir(), train ? "train" : "t10k", limit);
}

}  // namespace tandem
