// Loads the cuda backend's module (backends/cuda_module.h) for the binaries that may serve on
// cuda. Those binaries export tandem's symbols (tandem_loads_cuda in CMake, cuda_exports.list),
// so the module's calls into core land in the binary's own core. The module is looked for at
// TANDEM_CUDA_MODULE, else at lib/libtandem-cuda.so beside the binary's folder (the build
// tree's and an installed tree's layout: build/release/cloud/tandem-cloud and
// build/release/lib/libtandem-cuda.so, bin/ and lib/).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "backends/cuda_module.h"
#include "core/error.h"

#ifndef TANDEM_BUILD_STAMP
#error "TANDEM_BUILD_STAMP is set by the build (backends/CMakeLists.txt)"
#endif

namespace tandem {
namespace {

std::string module_path() {
  if (const char* path = std::getenv("TANDEM_CUDA_MODULE"); path != nullptr && *path != '\0') return path;
  std::string exe(4096, '\0');
  const ssize_t n = readlink("/proc/self/exe", exe.data(), exe.size() - 1);
  if (n <= 0) return kCudaModuleFile;  // the loader's own search (LD_LIBRARY_PATH)
  exe.resize(static_cast<std::size_t>(n));
  const auto slash = exe.rfind('/');
  return cat(exe.substr(0, slash == std::string::npos ? 0 : slash), "/../lib/", kCudaModuleFile);
}

struct Loaded {
  const CudaModule* module = nullptr;
  std::string problem;
};

Loaded load() {
  Loaded l;
  const std::string path = module_path();
  const std::string fix =
      "; it is built beside tandem where nvcc was found (build/<preset>/lib/), or set "
      "TANDEM_CUDA_MODULE to its path";
  // RTLD_NOW: a symbol it needs that this binary lacks is found now, not mid-step.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    // The file is there: what failed is a library it needs (cuBLAS, cuDNN) or a symbol.
    l.problem = access(path.c_str(), R_OK) == 0
                    ? cat("the cuda backend's module ", path, " could not be loaded: ", why ? why : "(no reason)",
                          "; install CUDA's cuBLAS and cuDNN or add their folder to LD_LIBRARY_PATH")
                    : cat("the cuda backend's module could not be loaded: ", why ? why : path.c_str(), fix);
    return l;
  }
  using Entry = const CudaModule* (*)();
  const auto entry = reinterpret_cast<Entry>(dlsym(handle, kCudaModuleEntry));
  if (entry == nullptr) {
    l.problem = cat("the cuda backend's module ", path, " has no entry point ", kCudaModuleEntry, fix);
    return l;  // kept loaded: unloading CUDA's libraries mid-process is not worth the risk
  }
  const CudaModule* m = entry();
  if (m == nullptr || m->build_stamp == nullptr || std::strcmp(m->build_stamp, TANDEM_BUILD_STAMP) != 0) {
    l.problem = cat("the cuda backend's module ", path, " comes from another build (stamp ",
                    m && m->build_stamp ? m->build_stamp : "none", ", this binary's ", TANDEM_BUILD_STAMP,
                    "): rebuild both, or point TANDEM_CUDA_MODULE at this build's");
    return l;
  }
  l.module = m;
  return l;
}

}  // namespace

const CudaModule* load_cuda_module(std::string& problem) {
  static const Loaded loaded = load();  // once, thread-safe
  problem = loaded.problem;
  return loaded.module;
}

bool cuda_driver_present() {
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver == nullptr) return false;
  dlclose(driver);
  return true;
}

}  // namespace tandem
