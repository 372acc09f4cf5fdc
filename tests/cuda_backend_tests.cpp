// The cuda backend as the registry and the cloud see it, on any machine: named in the binaries
// that link it, chosen by default only where a GPU can be used, and refused with the reason
// where none can. Its kernels' tests are the op, grad, train and split tests run with
// TANDEM_BACKEND=cuda (tests/CMakeLists.txt), which need a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <set>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_budget.h"
#include "backends/cuda/cuda_memory.h"
#include "backends/cuda/cuda_pool.h"
#include "backends/cuda/resident_ranges.h"
#include "backends/registry.h"
#include "core/error.h"
#include "test_support.h"

namespace tandem::test {
namespace {

TEST(CudaBackend, TheRegistryHasItAndTheCloudDefaultFollowsTheDevice) {
  const auto names = backend_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "cuda"), names.end());
  const std::string problem = cuda_device_problem();
  EXPECT_EQ(default_cloud_backend(), problem.empty() ? "cuda" : preferred_backend("onednn")) << problem;
  EXPECT_EQ(gpu_summary(), cuda_device_summary());
}

TEST(CudaBackend, WithoutADeviceItIsRefusedWithTheReason) {
  const std::string problem = cuda_device_problem();
  if (problem.empty()) {
    EXPECT_EQ(make_backend("cuda")->name(), "cuda");
    EXPECT_EQ(gpu_summary().find("no CUDA device"), std::string::npos) << gpu_summary();
    return;
  }
  EXPECT_EQ(problem.rfind("no CUDA device: ", 0), 0u) << problem;
  EXPECT_EQ(error_of([] { make_backend("cuda"); }),
            "[cuda] " + problem + "; this machine can train on onednn (--backend onednn)");
  EXPECT_EQ(gpu_summary(), problem);
}

// What kernels take for resident (used in place, not staged): a span inside one recorded
// tensor, never one that runs past its end, starts before it or straddles two tensors, never
// null, and nothing once the tensor is forgotten.
TEST(CudaBackend, ResidentRangesAnswerOnlyForSpansInsideOneTensor) {
  cuda::ResidentRanges r;
  alignas(64) static char memory[4096];
  char* a = memory + 64;    // [64, 1088)
  char* b = memory + 1088;  // [1088, 2112): right after a
  r.add(a, 1024);
  r.add(b, 1024);
  EXPECT_EQ(r.size(), 2u);
  EXPECT_TRUE(r.contains(a, 1024));
  EXPECT_TRUE(r.contains(a + 100, 924)) << "a view to the end";
  EXPECT_TRUE(r.contains(a + 1023, 1));
  EXPECT_FALSE(r.contains(a + 100, 925)) << "past a's end, into b";
  EXPECT_FALSE(r.contains(a - 1, 2)) << "starts before a";
  EXPECT_FALSE(r.contains(memory, 8)) << "before any range";
  EXPECT_FALSE(r.contains(b + 1024, 1)) << "after every range";
  EXPECT_FALSE(r.contains(nullptr, 0));
  EXPECT_TRUE(r.contains(b, 0));
  r.remove(a);
  EXPECT_FALSE(r.contains(a, 8)) << "forgotten";
  EXPECT_TRUE(r.contains(b, 1024));
  r.remove(a);  // nothing starts there any more: no change
  EXPECT_EQ(r.size(), 1u);
}

// TANDEM_CUDA_MEMORY picks where tensors live (no CUDA call): pinned by default,
// TANDEM_CUDA_PIN=0 still pageable, and anything else refused with the choices.
TEST(CudaBackend, TheTensorPlacementIsChosenByTheEnvironment) {
  // Puts back what the environment had (a run with TANDEM_CUDA_MEMORY=managed keeps it).
  struct Restore {
    std::pair<const char*, std::optional<std::string>> saved[2] = {{"TANDEM_CUDA_MEMORY", {}}, {"TANDEM_CUDA_PIN", {}}};
    Restore() {
      for (auto& [name, value] : saved)
        if (const char* v = std::getenv(name)) value = v;
    }
    ~Restore() {
      for (auto& [name, value] : saved)
        if (value)
          setenv(name, value->c_str(), 1);
        else
          unsetenv(name);
    }
  } restore;
  unsetenv("TANDEM_CUDA_MEMORY");
  unsetenv("TANDEM_CUDA_PIN");
  EXPECT_EQ(cuda::chosen_placement(), cuda::TensorPlacement::pinned);
  setenv("TANDEM_CUDA_PIN", "0", 1);
  EXPECT_EQ(cuda::chosen_placement(), cuda::TensorPlacement::pageable);
  setenv("TANDEM_CUDA_MEMORY", "managed", 1);
  EXPECT_EQ(cuda::chosen_placement(), cuda::TensorPlacement::managed) << "TANDEM_CUDA_MEMORY wins";
  setenv("TANDEM_CUDA_MEMORY", "pinned", 1);
  EXPECT_EQ(cuda::chosen_placement(), cuda::TensorPlacement::pinned);
  setenv("TANDEM_CUDA_MEMORY", "device", 1);
  EXPECT_EQ(error_of([] { cuda::chosen_placement(); }),
            "[cuda] TANDEM_CUDA_MEMORY='device' is not a tensor placement (pinned, managed or pageable)");
  unsetenv("TANDEM_CUDA_MEMORY");
  unsetenv("TANDEM_CUDA_PIN");
  if (!cuda_device_problem().empty())  // with a GPU, an earlier test may have installed one
    EXPECT_NE(cuda::placement_summary().find("TANDEM_CUDA_MEMORY=pinned"), std::string::npos)
      << "unset, the summary names the default: " << cuda::placement_summary();
}

// The sessions' device memory budget is bookkeeping without a CUDA call: a reservation past
// it is refused with what is left and what was asked, and what is given back can be taken again.
TEST(CudaBackend, TheMemoryBudgetRefusesWhatWouldNotFit) {
  cuda::DeviceBudget budget;
  budget.set_limit(std::size_t{100} << 20);
  budget.reserve(std::size_t{60} << 20, "session 1's kernels");
  EXPECT_EQ(error_of([&] { budget.reserve(std::size_t{50} << 20, "session 2's kernels"); }),
            "[cuda] the GPU memory budget (100 MiB for all sessions, tandem-cloud serve --gpu-memory-mb) has 40 MiB "
            "left and session 2's kernels needs 50 MiB more: this session does not fit now; try again later, or with "
            "a smaller batch");
  EXPECT_EQ(budget.reserved(), std::size_t{60} << 20) << "a refusal takes nothing";
  budget.release(std::size_t{60} << 20);
  budget.reserve(std::size_t{50} << 20, "session 2's kernels");
  EXPECT_EQ(budget.reserved(), std::size_t{50} << 20);
  budget.set_limit(0);  // no limit
  budget.reserve(std::size_t{1} << 40, "anything");
}

// The pool is bookkeeping over a raw allocator (cudaMalloc and cudaFree in the backend; host
// memory here): a buffer given back serves the next of its size class without a new
// allocation, cached bytes count against the budget and are given back when a reservation or
// the device would otherwise fail, and a refusal takes nothing.
TEST(CudaBackend, ThePoolReusesWhatKernelsGiveBackWithinTheBudget) {
  constexpr std::size_t MiB = std::size_t{1} << 20;
  struct Device {
    std::set<void*> held;
    int allocations = 0, frees = 0;
    bool full = false;  // the next allocation fails as cudaMalloc would
  } device;
  cuda::DeviceBudget budget;
  budget.set_limit(10 * MiB);
  {
    cuda::DevicePool pool({[&](std::size_t bytes) -> void* {
                             if (device.full) fail("cuda", "cudaMalloc: out of memory");
                             ++device.allocations;
                             void* p = std::malloc(bytes);
                             device.held.insert(p);
                             return p;
                           },
                           [&](void* p) {
                             ++device.frees;
                             device.held.erase(p);
                             std::free(p);
                           }},
                          budget);
    EXPECT_EQ(cuda::DevicePool::size_class(1), 512u);
    EXPECT_EQ(cuda::DevicePool::size_class(513), 1024u);
    EXPECT_EQ(cuda::DevicePool::size_class(MiB), MiB);
    EXPECT_EQ(cuda::DevicePool::size_class(MiB + 1), 2 * MiB);
    EXPECT_EQ(pool.take(0, "nothing"), nullptr);

    void* a = pool.take(3 * MiB, "session 1's kernels");
    EXPECT_EQ(budget.reserved(), 3 * MiB);
    pool.give(a);
    EXPECT_EQ(pool.use().live, 0u);
    EXPECT_EQ(pool.use().cached, 3 * MiB);
    EXPECT_EQ(budget.reserved(), 3 * MiB) << "cached bytes stay counted";
    void* b = pool.take(3 * MiB - 100, "session 2's kernels");  // the same class: the same block
    EXPECT_EQ(b, a);
    EXPECT_EQ(device.allocations, 1);
    EXPECT_EQ(pool.use().reuses, 1u);
    void* big = pool.take(4 * MiB, "session 2's kernels");
    EXPECT_NE(big, b);
    EXPECT_EQ(pool.use().live, 7 * MiB);
    void* c = pool.take(3 * MiB, "session 3's kernels");  // b is taken: a new block
    EXPECT_NE(c, b);
    EXPECT_EQ(budget.reserved(), 10 * MiB);

    // A block much larger than asked is not handed out: 1 MiB wants its own.
    pool.give(big);
    void* e = pool.take(MiB, "session 4's kernels");  // the budget is full: the cache gives way
    EXPECT_NE(e, nullptr);
    EXPECT_EQ(device.frees, 1) << "the 4 MiB block was freed for the new one";
    EXPECT_EQ(budget.reserved(), 7 * MiB);
    EXPECT_EQ(pool.use().cached, 0u);

    // Past the budget with nothing cached: the budget's refusal, and nothing taken.
    EXPECT_EQ(error_of([&] { pool.take(4 * MiB, "session 5's kernels"); }),
              "[cuda] the GPU memory budget (10 MiB for all sessions, tandem-cloud serve --gpu-memory-mb) has 3 MiB "
              "left and session 5's kernels needs 4 MiB more: this session does not fit now; try again later, or with "
              "a smaller batch");
    EXPECT_EQ(budget.reserved(), 7 * MiB);

    // The device out of memory: the cache is given back and the allocation tried again; with
    // nothing to give back, the device's error, and the budget as it was.
    pool.give(c);
    device.full = true;
    EXPECT_EQ(error_of([&] { pool.take(2 * MiB, "session 6's kernels"); }), "[cuda] cudaMalloc: out of memory");
    EXPECT_EQ(pool.use().cached, 0u) << "the cache was given back before the second try";
    EXPECT_EQ(budget.reserved(), 4 * MiB);
    device.full = false;
    void* d = pool.take(2 * MiB, "session 6's kernels");
    EXPECT_EQ(budget.reserved(), 6 * MiB);
    pool.give(b);
    pool.give(d);
    EXPECT_FALSE(pool.give(&device)) << "a block the pool did not make";
    EXPECT_EQ(pool.use().cached, 5 * MiB);
  }
  EXPECT_EQ(budget.reserved(), 1 * MiB) << "the pool frees what it caches when it goes; session 4's block is still taken";
  EXPECT_EQ(device.held.size(), 1u);
  for (void* p : device.held) std::free(p);
}

}  // namespace
}  // namespace tandem::test
