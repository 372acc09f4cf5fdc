// Linked into the test binaries that run the cuda backend: with TANDEM_BACKEND=cuda on a
// machine without a usable CUDA device (CI's), every test skips with the reason, and ctest
// reports them Skipped (tests/CMakeLists.txt), never passed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <string_view>

#include "backends/cuda/cuda_backend.h"

namespace {

class CudaDeviceGate : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* backend = std::getenv("TANDEM_BACKEND");
    if (backend == nullptr || std::string_view(backend) != "cuda") return;
    if (const std::string why = tandem::cuda_device_problem(); !why.empty())
      GTEST_SKIP() << "the cuda backend's tests need a GPU: " << why;
  }
};

[[maybe_unused]] ::testing::Environment* const gate = ::testing::AddGlobalTestEnvironment(new CudaDeviceGate);

}  // namespace
