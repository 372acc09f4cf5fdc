// Fuzzes safetensors parsing: read_safetensors on the bytes, read_safetensors_file on them as
// a file, and shard_from_torch (a PyTorch export's tensors into a shard's layout).
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "tests/fuzz/fuzz_setup.h"
#include "core/interop/safetensors.h"
#include "core/interop/torch_layout.h"
#include "ports/files/atomic_file.h"
#include "ports/files/safetensors_file.h"

using namespace tandem;

namespace {
std::string* dir = nullptr;
std::string* path = nullptr;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::model();
  char tmpl[] = "/tmp/tandem-safetensors-fuzz-XXXXXX";
  if (!mkdtemp(tmpl)) std::abort();
  dir = new std::string(tmpl);
  path = new std::string(*dir + "/weights.safetensors");
  std::atexit([] { std::filesystem::remove_all(*dir); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  fuzz::Model& m = fuzz::model();
  try {
    std::map<std::string, std::string> metadata;
    const std::vector<SafeTensor> tensors = read_safetensors(std::span<const uint8_t>(data, size), &metadata);
    Network front(m.shards.first, *m.backend, 1);
    try {
      shard_from_torch(m.graph, tensors, front);
    } catch (const Error&) {
    }
    Network back(m.shards.second, *m.backend, 1);
    try {
      shard_from_torch(m.graph, tensors, back);
    } catch (const Error&) {
    }
  } catch (const Error&) {
  }
  try {
    write_file_atomic(*path, std::span<const uint8_t>(data, size));
    Network front(m.shards.first, *m.backend, 1);
    (void)read_safetensors_file(*path, tensor_names(front));
    (void)read_safetensors_file(*path, {});
  } catch (const Error&) {
  }
  return 0;
}
