// A one-line progress bar for long work, redrawn in place on a terminal and printed every
// tenth of the way when the output is a file or pipe (CI logs stay readable).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace tandem {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total);
  // `done` items of `total`; `status` is shown after the bar (e.g. "loss 0.41").
  void update(int64_t done, const std::string& status);
  // The end: all of `total`, or `done` of it where the work stopped short.
  void finish(const std::string& status, int64_t done = -1);

 private:
  std::string label_;
  int64_t total_;
  bool tty_;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace tandem
