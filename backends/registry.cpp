#include "backends/registry.h"

#include <algorithm>
#include <cstdio>

#include "backends/portable/portable_backend.h"
#include "backends/reference/reference_backend.h"
#include "backends/cuda_module.h"
#include "core/error.h"
#ifdef TANDEM_HAVE_XNNPACK
#include "backends/xnnpack/xnnpack_backend.h"
#endif
#ifdef TANDEM_HAVE_ONEDNN
#include "backends/onednn/onednn_backend.h"
#endif

#ifdef TANDEM_CUDA_BUILT
extern "C" [[gnu::weak]] const tandem::CudaModule* tandem_cuda_module();
#endif

namespace tandem {

#ifdef TANDEM_CUDA_BUILT
// The cuda backend (backends/cuda_module.h), reached one of two ways, each a weak reference
// that is null where it is absent: the test binaries link backends/cuda's objects and so have
// its entry point; tandem-cloud, tandem and the GPU benchmarks link the loader, which loads
// libtandem-cuda.so when cuda is first asked for. Every other binary (tandem-edge) has neither
// and no cuda backend.
[[gnu::weak]] const CudaModule* load_cuda_module(std::string& problem);
[[gnu::weak]] bool cuda_driver_present();
#endif

namespace {

using Factory = std::unique_ptr<Backend> (*)(const BackendOptions&);

struct Entry {
  std::string_view name;
  Factory make;
};

// A fixed table: which CPU backends exist is decided when the build is configured (cuda, when
// the binary is linked: has_cuda()).
const Entry kBackends[] = {
    {"reference", make_reference_backend},
    {"portable", make_portable_backend},
#ifdef TANDEM_HAVE_XNNPACK
    {"xnnpack", make_xnnpack_backend},
#endif
#ifdef TANDEM_HAVE_ONEDNN
    {"onednn", make_onednn_backend},
#endif
};

#ifdef TANDEM_CUDA_BUILT
// Whether this binary can have the cuda backend at all (without loading anything).
bool has_cuda() { return tandem_cuda_module != nullptr || load_cuda_module != nullptr; }

// The cuda backend's table, or null with `problem` saying why (loading the module on the
// first call).
const CudaModule* cuda(std::string& problem) {
  if (tandem_cuda_module != nullptr) return tandem_cuda_module();
  if (load_cuda_module != nullptr) return load_cuda_module(problem);
  problem = "this binary has no cuda backend";
  return nullptr;
}
#endif

}  // namespace

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const Entry& e : kBackends) names.emplace_back(e.name);
#ifdef TANDEM_CUDA_BUILT
  if (has_cuda()) names.emplace_back("cuda");
#endif
  return names;
}

std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options) {
  for (const Entry& e : kBackends)
    if (e.name == name) return e.make(options);
#ifdef TANDEM_CUDA_BUILT
  if (name == "cuda" && has_cuda()) {
    std::string problem;
    const CudaModule* m = cuda(problem);
    if (m == nullptr) fail("cuda", cat(problem, "; this machine can train on onednn (--backend onednn)"));
    return m->make_backend(options);
  }
#endif
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
  // Where no CUDA driver is installed the module is not even loaded: a CPU cloud maps none of
  // CUDA's libraries.
  if (has_cuda() && (tandem_cuda_module != nullptr || cuda_driver_present())) {
    std::string problem;
    const CudaModule* m = cuda(problem);
    if (m != nullptr && m->device_problem().empty()) return "cuda";
    // A CUDA driver is here, so a GPU was likely meant: say why it is not used.
    if (m == nullptr) std::fprintf(stderr, "tandem: cuda is not used (%s)\n", problem.c_str());
  }
#endif
  return preferred_backend("onednn");
}

void set_gpu_memory_budget([[maybe_unused]] std::size_t bytes) {
#ifdef TANDEM_CUDA_BUILT
  std::string problem;
  if (const CudaModule* m = cuda(problem)) m->set_memory_budget(bytes);
#endif
}

GpuMemoryUse gpu_memory_use() {
#ifdef TANDEM_CUDA_BUILT
  std::string problem;
  if (const CudaModule* m = cuda(problem)) return m->memory_use();
#endif
  return {};
}

std::string gpu_summary() {
#ifdef TANDEM_CUDA_BUILT
  if (has_cuda()) {
    std::string problem;
    const CudaModule* m = cuda(problem);
    return m != nullptr ? m->device_summary() : problem;
  }
#endif
  return "";
}

}  // namespace tandem
