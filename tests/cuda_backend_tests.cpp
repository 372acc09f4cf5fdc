// The cuda backend as the registry and the cloud see it, on any machine: named in the binaries
// that link it, chosen by default only where a GPU can be used, and refused with the reason
// where none can. Its kernels' tests are the op, grad, train and split tests run with
// TANDEM_BACKEND=cuda (tests/CMakeLists.txt), which need a GPU.
#include <gtest/gtest.h>

#include <algorithm>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_budget.h"
#include "backends/registry.h"
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

}  // namespace
}  // namespace tandem::test
