// The test binaries' main: GoogleTest's, except that a run whose every selected case skipped
// (GTEST_SKIP: a backend without the kernel, cuda without a GPU) and none failed exits with 77,
// which ctest reports as skipped (SKIP_RETURN_CODE); with gtest_main it would say Passed. A run
// where some cases pass and others skip passes, its skips listed in the output.
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  const testing::UnitTest& run = *testing::UnitTest::GetInstance();
  if (rc == 0 && run.test_to_run_count() > 0 && run.skipped_test_count() == run.test_to_run_count()) return 77;
  return rc;
}
