// The values a command was given (on its command line or in its --config file; see
// cli/command_line.h), with typed getters that throw an Error naming the option when a value
// is missing or malformed.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/optimizer.h"
#include "core/schedule.h"

namespace tandem {

struct HostPort {
  std::string host;
  int port = 0;
};

class CliArgs {
 public:
  // Option names (without "--") and their values; a flag that is set has the value "1".
  explicit CliArgs(std::map<std::string, std::string> values) : values_(std::move(values)) {}

  bool has(const std::string& name) const;
  std::string str(const std::string& name, const std::string& fallback) const;
  std::string required(const std::string& name) const;
  int64_t integer(const std::string& name, int64_t fallback, int64_t min_value) const;
  double number(const std::string& name, double fallback) const;
  // The options every trainer takes: --optimizer sgd|adam|adamw (sgd), --lr (0.05 for sgd,
  // 0.001 for Adam), --momentum (0.9, sgd), --nesterov (a flag), --weight-decay (0; 0.01
  // for adamw), --beta1 --beta2 --eps (Adam's 0.9, 0.999, 1e-8), --clip-norm (0: off).
  OptimizerOptions optimizer_options() const;
  // --schedule constant|step|cosine, --warmup-steps, --step-size, --gamma, --min-lr-factor;
  // cosine decays over `total_steps` unless --total-steps says otherwise (0: the caller fills
  // it in and validates).
  ScheduleOptions schedule_options(int64_t total_steps) const;
  // A required "PREFIXHOST:PORT" option (prefix such as "wss://", may be empty).
  HostPort host_port(const std::string& name, const std::string& prefix) const;

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace tandem
