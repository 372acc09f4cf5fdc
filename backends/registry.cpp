#include "backends/registry.h"

#include <algorithm>

#include "backends/portable/portable_backend.h"
#include "backends/reference/reference_backend.h"
#include "core/error.h"
#ifdef TANDEM_HAVE_XNNPACK
#include "backends/xnnpack/xnnpack_backend.h"
#endif
#ifdef TANDEM_HAVE_ONEDNN
#include "backends/onednn/onednn_backend.h"
#endif

namespace tandem {

#ifdef TANDEM_CUDA_BUILT
// backends/cuda, defined only in the binaries that link it (tandem-cloud, tandem, the op, grad
// and train tests): weak references, null elsewhere, so tandem-edge needs no CUDA library.
[[gnu::weak]] std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);
[[gnu::weak]] std::string cuda_device_problem();
[[gnu::weak]] std::string cuda_device_summary();
[[gnu::weak]] void set_cuda_memory_budget(std::size_t bytes);
[[gnu::weak]] GpuMemoryUse cuda_memory_use();
#endif

namespace {

using Factory = std::unique_ptr<Backend> (*)(const BackendOptions&);

struct Entry {
  std::string_view name;
  Factory make;
};

// A fixed table: which backends exist is decided when the build is configured (and, for
// cuda, when the binary is linked: a null factory is not there).
const Entry kBackends[] = {
    {"reference", make_reference_backend},
    {"portable", make_portable_backend},
#ifdef TANDEM_HAVE_XNNPACK
    {"xnnpack", make_xnnpack_backend},
#endif
#ifdef TANDEM_HAVE_ONEDNN
    {"onednn", make_onednn_backend},
#endif
#ifdef TANDEM_CUDA_BUILT
    {"cuda", make_cuda_backend},
#endif
};

#ifdef TANDEM_CUDA_BUILT
bool has_cuda() { return make_cuda_backend != nullptr; }
#endif

}  // namespace

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const Entry& e : kBackends)
    if (e.make) names.emplace_back(e.name);
  return names;
}

std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options) {
  for (const Entry& e : kBackends)
    if (e.name == name && e.make) return e.make(options);
  std::string known;
  for (const auto& n : backend_names()) known += (known.empty() ? "" : ", ") + n;
  fail("backend", cat("unknown backend '", name, "'; this build has: ", known));
}

std::string preferred_backend(const std::string& preferred) {
  const auto names = backend_names();
  return std::find(names.begin(), names.end(), preferred) != names.end() ? preferred : "reference";
}

std::string default_cloud_backend() {
#ifdef TANDEM_CUDA_BUILT
  if (has_cuda() && cuda_device_problem().empty()) return "cuda";
#endif
  return preferred_backend("onednn");
}

void set_gpu_memory_budget([[maybe_unused]] std::size_t bytes) {
#ifdef TANDEM_CUDA_BUILT
  if (has_cuda()) set_cuda_memory_budget(bytes);
#endif
}

GpuMemoryUse gpu_memory_use() {
#ifdef TANDEM_CUDA_BUILT
  if (has_cuda()) return cuda_memory_use();
#endif
  return {};
}

std::string gpu_summary() {
#ifdef TANDEM_CUDA_BUILT
  if (has_cuda()) return cuda_device_summary();
#endif
  return "";
}

}  // namespace tandem
