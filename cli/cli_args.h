// A small command-line reader for tandem's CLIs: "--name value" and "--flag" options, with
// typed getters that throw an Error naming the option when a value is missing or malformed.
#pragma once

#include <functional>
#include <map>
#include <set>
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
  // argv[first..] are options; `flags` are the options that take no value.
  CliArgs(int argc, char** argv, int first, const std::set<std::string>& flags);

  bool has(const std::string& name) const;
  std::string str(const std::string& name, const std::string& fallback) const;
  std::string required(const std::string& name) const;
  int64_t integer(const std::string& name, int64_t fallback, int64_t min_value) const;
  double number(const std::string& name, double fallback) const;
  // Throws naming any option not in `known` (catches typos such as --epoch).
  void reject_unknown(const std::set<std::string>& known) const;
  // The options every trainer takes: --optimizer sgd|adam|adamw (sgd), --lr (0.05 for sgd,
  // 0.001 for Adam), --momentum (0.9, sgd), --nesterov (a flag), --weight-decay (0; 0.01
  // for adamw), --beta1 --beta2 --eps (Adam's 0.9, 0.999, 1e-8), --clip-norm (0: off).
  OptimizerOptions optimizer_options() const;
  // --schedule constant|step|cosine, --warmup-steps, --step-size, --gamma, --min-lr-factor;
  // cosine decays over `total_steps` unless --total-steps says otherwise (0: the caller fills
  // it in and validates).
  ScheduleOptions schedule_options(int64_t total_steps) const;
  // `names` plus the optimizer's (and the schedule's) option names, for reject_unknown.
  static std::set<std::string> with_optimizer_options(std::set<std::string> names, bool schedule);
  // A required "PREFIXHOST:PORT" option (prefix such as "wss://", may be empty).
  HostPort host_port(const std::string& name, const std::string& prefix) const;

 private:
  std::map<std::string, std::string> values_;
};

// The shared main of tandem's CLIs: runs commands[argv[1]], prints `usage` for help or an
// unknown command (exit 2), and an Error as "program: [where] what" (exit 1).
using CliCommand = std::function<int(int argc, char** argv)>;
int run_cli(int argc, char** argv, const char* program, const char* usage,
            const std::map<std::string, CliCommand>& commands);

}  // namespace tandem
