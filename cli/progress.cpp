#include "cli/progress.h"

#include <unistd.h>

#include <cstdio>

namespace tandem {

ProgressBar::ProgressBar(std::string label, int64_t total)
    : label_(std::move(label)), total_(total > 0 ? total : 1), tty_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

void ProgressBar::update(int64_t done, const std::string& status) {
  const auto now = std::chrono::steady_clock::now();
  const double frac = static_cast<double>(done) / static_cast<double>(total_);
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double eta = frac > 0 ? elapsed * (1.0 - frac) / frac : 0.0;
  if (tty_) {
    if (done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r%s [%s] %3d%% %lld/%lld %.0fs<%.0fs %s\033[K", label_.c_str(), bar.c_str(),
                 static_cast<int>(frac * 100), static_cast<long long>(done), static_cast<long long>(total_), elapsed,
                 eta, status.c_str());
  } else {
    const int decile = static_cast<int>(frac * 10);
    if (decile == last_decile_) return;
    last_decile_ = decile;
    std::fprintf(stderr, "%s %3d%% %lld/%lld %.0fs elapsed %s\n", label_.c_str(), decile * 10,
                 static_cast<long long>(done), static_cast<long long>(total_), elapsed, status.c_str());
  }
  std::fflush(stderr);
}

void ProgressBar::finish(const std::string& status, int64_t done) {
  update(done < 0 ? total_ : done, status);
  if (tty_) std::fprintf(stderr, "\n");
}

}  // namespace tandem
