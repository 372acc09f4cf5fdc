#include "core/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace tandem {

void validate(const ScheduleOptions& s) {
  if (s.kind != "constant" && s.kind != "step" && s.kind != "cosine")
    fail("schedule", cat("unknown schedule '", s.kind, "' (known: constant, step, cosine)"));
  if (s.warmup_steps < 0) fail("schedule", cat("warm-up steps must be >= 0, got ", s.warmup_steps));
  if (s.kind == "step" && (s.step_size < 1 || !(s.gamma >= 0.0f)))
    fail("schedule", cat("step decay needs step size >= 1 and gamma >= 0, got ", s.step_size, " and ", s.gamma));
  if (s.kind == "cosine" && (s.total_steps <= s.warmup_steps || !(s.min_factor >= 0.0f && s.min_factor <= 1.0f)))
    fail("schedule", cat("cosine needs total steps (", s.total_steps, ") above the warm-up (", s.warmup_steps,
                         ") and a final factor in [0, 1], got ", s.min_factor));
}

float lr_factor(const ScheduleOptions& s, int64_t step) {
  if (step < s.warmup_steps) return static_cast<float>(step + 1) / static_cast<float>(s.warmup_steps);
  const int64_t t = step - s.warmup_steps;
  if (s.kind == "step") return std::pow(s.gamma, static_cast<float>(t / s.step_size));
  if (s.kind == "cosine") {
    const double span = static_cast<double>(s.total_steps - s.warmup_steps);
    const double progress = std::min(1.0, static_cast<double>(t) / span);
    return static_cast<float>(s.min_factor + (1.0 - s.min_factor) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));
  }
  return 1.0f;
}

}  // namespace tandem
