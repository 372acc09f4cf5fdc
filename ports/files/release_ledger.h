// A party's count of noised releases of its training set, kept in its checkpoint folder
// (DIR/dp-releases) and written atomically before each release leaves: a party killed and
// started again as a new process goes on from what it released, replays included, so the
// epsilon it reports and the budget it keeps cover every release it made. The file names the
// terms it counts under (`plan`: a hash of the model, the noise, the batch and the data); a
// file of other terms, or one that is not exactly what this class writes, is refused.
#pragma once

#include <string>

#include "core/privacy/release_count.h"

namespace tandem {

class ReleaseLedger final : public ReleaseCount {
 public:
  ReleaseLedger(const std::string& dir, const std::string& plan_hex);
  uint64_t releases() const override { return releases_; }
  void count_one() override { write(releases_ + 1); }
  void at_least(uint64_t n) override {
    if (n > releases_) write(n);
  }
  const std::string& path() const { return path_; }

 private:
  void write(uint64_t count);
  std::string path_, plan_;
  uint64_t releases_ = 0;
};

}  // namespace tandem
