#include "backends/cuda/cuda_memory.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string_view>

#include "backends/cuda/cuda_context.h"
#include "backends/cuda/resident_ranges.h"
#include "core/error.h"
#include "core/tensor.h"

namespace tandem::cuda {
namespace {

// Tensors under these sizes stay in core's own memory: page-locking or a managed allocation
// costs a driver call and at least a page, and small tensors' staged copies are cheap.
constexpr std::size_t kPinnedMinBytes = std::size_t{256} << 10;
constexpr std::size_t kManagedMinBytes = std::size_t{64} << 10;

// Page-locked: core's alignment, registered on the chosen device (the thread that makes a
// tensor, a wire decoder, may never have used the GPU) and portably (for every context).
void* pinned_allocate(std::size_t bytes, std::size_t) {
  void* p = ::operator new[](bytes, std::align_val_t{kTensorAlignment});
  if (cudaSetDevice(chosen_device()) == cudaSuccess && cudaHostRegister(p, bytes, cudaHostRegisterPortable) == cudaSuccess)
    return p;
  cudaGetLastError();  // not sticky, but clear it: the next launch's check must not see it
  ::operator delete[](p, std::align_val_t{kTensorAlignment});
  return nullptr;  // core's own, pageable
}
// The thread that drops a tensor's last view may never have used the GPU either: the chosen
// device first, so no context is made on device 0.
void pinned_release(void* p) {
  if (cudaSetDevice(chosen_device()) != cudaSuccess || cudaHostUnregister(p) != cudaSuccess)
    cudaGetLastError();  // before the pages go back
  ::operator delete[](p, std::align_val_t{kTensorAlignment});
}

// Managed: cudaMallocManaged aligns to at least 256 bytes; the range is recorded, so that
// kernels (cuda::Call, DeviceWeights, the VectorKernel) use the tensor in place.
void* managed_allocate(std::size_t bytes, std::size_t) {
  void* p = nullptr;
  if (cudaSetDevice(chosen_device()) != cudaSuccess || cudaMallocManaged(&p, bytes, cudaMemAttachGlobal) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;  // core's own: staged, as pageable memory
  }
  resident_ranges().add(p, bytes);
  return p;
}
// cudaFree of managed memory waits for the whole device: tensors are made once a shape and
// received frames are pooled, so this runs when a session ends, not in a step.
void managed_release(void* p) {
  resident_ranges().remove(p);  // first: no kernel call may take it for resident once freed
  if (cudaSetDevice(chosen_device()) != cudaSuccess || cudaFree(p) != cudaSuccess) cudaGetLastError();
}

constexpr TensorMemory kPinned{kPinnedMinBytes, pinned_allocate, pinned_release};
// TANDEM_CUDA_MANAGED_MIN_BYTES lowers the threshold, for tests whose tensors are all small
// (device_check.sh runs the network tests with calls running ahead on every tensor).
TensorMemory g_managed{kManagedMinBytes, managed_allocate, managed_release};

}  // namespace

TensorPlacement chosen_placement() {
  const char* memory = std::getenv("TANDEM_CUDA_MEMORY");
  if (!memory || !*memory) {
    const char* pin = std::getenv("TANDEM_CUDA_PIN");
    return pin && std::string_view(pin) == "0" ? TensorPlacement::pageable : TensorPlacement::pinned;
  }
  const std::string_view m(memory);
  if (m == "pinned") return TensorPlacement::pinned;
  if (m == "managed") return TensorPlacement::managed;
  if (m == "pageable") return TensorPlacement::pageable;
  fail("cuda", cat("TANDEM_CUDA_MEMORY='", m, "' is not a tensor placement (pinned, managed or pageable)"));
}

namespace {

std::string words(TensorPlacement placement) {
  switch (placement) {
    case TensorPlacement::pageable:
      return "tensors in pageable host memory (TANDEM_CUDA_MEMORY=pageable)";
    case TensorPlacement::pinned:
      return cat("tensors of ", kPinnedMinBytes >> 10, " KiB and more page-locked (TANDEM_CUDA_MEMORY=pinned)");
    case TensorPlacement::managed:
      return cat("tensors of ", g_managed.min_bytes, " bytes and more in managed memory, used in place by kernels ",
                 "(TANDEM_CUDA_MEMORY=managed)");
  }
  return "";
}

std::mutex g_mu;
std::string g_installed;  // the words of what install_tensor_memory installed
std::atomic<bool> g_run_ahead{false};

}  // namespace

void install_tensor_memory() {
  std::lock_guard lock(g_mu);
  if (!g_installed.empty()) return;
  TensorPlacement placement = chosen_placement();
  if (placement == TensorPlacement::managed) {
    int concurrent = 0;
    check(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, chosen_device()),
          "cudaDeviceGetAttribute");
    if (!concurrent) {
      std::fprintf(stderr, "tandem: [cuda] TANDEM_CUDA_MEMORY=managed, but this device does not let the host touch "
                           "managed memory while kernels run: page-locked tensors instead\n");
      placement = TensorPlacement::pinned;
    }
  }
  if (placement == TensorPlacement::pinned) set_tensor_memory(&kPinned);
  if (placement == TensorPlacement::managed) {
    if (const char* min = std::getenv("TANDEM_CUDA_MANAGED_MIN_BYTES"); min && *min)
      g_managed.min_bytes = static_cast<std::size_t>(std::strtoull(min, nullptr, 10));
    set_tensor_memory(&g_managed);
  }
  g_installed = words(placement);
  const char* run_ahead = std::getenv("TANDEM_CUDA_ASYNC");
  if (run_ahead && std::string_view(run_ahead) == "1") {
    if (placement == TensorPlacement::managed) {
      g_run_ahead = true;
      g_installed += "; calls on managed tensors run ahead of the host (TANDEM_CUDA_ASYNC=1)";
    } else {
      std::fprintf(stderr, "tandem: [cuda] TANDEM_CUDA_ASYNC=1 runs calls ahead only on managed tensors (%s): every "
                           "call waits\n",
                   chosen_placement() == TensorPlacement::managed ? "which this device cannot use"
                                                                  : "TANDEM_CUDA_MEMORY=managed");
    }
  }
}

bool calls_run_ahead() { return g_run_ahead.load(std::memory_order_relaxed); }

std::string placement_summary() {
  {
    std::lock_guard lock(g_mu);
    if (!g_installed.empty()) return g_installed;
  }
  return words(chosen_placement());
}

}  // namespace tandem::cuda
