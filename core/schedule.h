// Learning-rate schedules as a factor of the base rate per optimizer step: constant, step
// decay, cosine annealing, each with an optional linear warm-up. In split training the edge
// evaluates it and sends the factor with every Forward, so both sides follow one schedule.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

struct ScheduleOptions {
  std::string kind = "constant";  // constant | step | cosine
  int64_t warmup_steps = 0;       // factor rises linearly to 1 over these steps
  int64_t step_size = 0;          // step: multiply by gamma every step_size steps (after warm-up)
  float gamma = 0.1f;
  int64_t total_steps = 0;        // cosine: steps from start to the end of the decay
  float min_factor = 0.0f;        // cosine: the factor it ends at
};

// Throws naming the option when the combination is unusable (e.g. cosine without total steps).
void validate(const ScheduleOptions& s);

// The factor for 0-based optimizer step `step`.
float lr_factor(const ScheduleOptions& s, int64_t step);

}  // namespace tandem
