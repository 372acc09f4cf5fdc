#include "cli/cli_args.h"

#include <cstdlib>

#include "core/error.h"

namespace tandem {

bool CliArgs::has(const std::string& name) const { return values_.count(name) > 0; }

std::string CliArgs::str(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

std::string CliArgs::required(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end())
    fail("cli", cat("option --", name, " is required: give it on the command line, or as ", name,
                    " = ... in the file --config names"));
  return it->second;
}

int64_t CliArgs::integer(const std::string& name, int64_t fallback, int64_t min_value) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0') fail("cli", cat("option --", name, " expects an integer, got '", it->second, "'"));
  if (v < min_value) fail("cli", cat("option --", name, " must be >= ", min_value, ", got ", v));
  return v;
}

double CliArgs::number(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end != '\0') fail("cli", cat("option --", name, " expects a number, got '", it->second, "'"));
  return v;
}

OptimizerOptions CliArgs::optimizer_options() const {
  OptimizerOptions o;
  o.kind = str("optimizer", "sgd");
  if (o.kind != "sgd" && o.kind != "adam" && o.kind != "adamw")
    fail("cli", cat("--optimizer: unknown optimizer '", o.kind, "' (known: sgd, adam, adamw)"));
  const bool sgd = o.kind == "sgd";
  o.lr = static_cast<float>(number("lr", sgd ? 0.05 : 0.001));
  o.momentum = static_cast<float>(number("momentum", sgd ? 0.9 : 0.0));
  o.nesterov = has("nesterov");
  o.weight_decay = static_cast<float>(number("weight-decay", o.kind == "adamw" ? 0.01 : 0.0));
  o.beta1 = static_cast<float>(number("beta1", 0.9));
  o.beta2 = static_cast<float>(number("beta2", 0.999));
  o.eps = static_cast<float>(number("eps", 1e-8));
  o.clip_norm = static_cast<float>(number("clip-norm", 0.0));
  if (!sgd && (has("momentum") || o.nesterov)) fail("cli", cat("--momentum and --nesterov are for sgd, not ", o.kind));
  return o;
}

ScheduleOptions CliArgs::schedule_options(int64_t total_steps) const {
  ScheduleOptions s;
  s.kind = str("schedule", "constant");
  s.warmup_steps = integer("warmup-steps", 0, 0);
  s.step_size = integer("step-size", 1, 1);
  s.gamma = static_cast<float>(number("gamma", 0.1));
  s.total_steps = integer("total-steps", total_steps, 0);
  s.min_factor = static_cast<float>(number("min-lr-factor", 0.0));
  if (s.total_steps > 0 || s.kind != "cosine") validate(s);  // else the caller fills total_steps in
  return s;
}

HostPort CliArgs::host_port(const std::string& name, const std::string& prefix) const {
  const std::string text = required(name);
  const std::string form = cat("--", name, " expects ", prefix, "HOST:PORT, got '", text, "'");
  if (text.rfind(prefix, 0) != 0) fail("cli", form);
  std::string rest = text.substr(prefix.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) fail("cli", form);
  char* end = nullptr;
  const long port = std::strtol(rest.c_str() + colon + 1, &end, 10);
  if (colon + 1 == rest.size() || *end != '\0' || port < 0 || port > 65535) fail("cli", form);
  return {rest.substr(0, colon), static_cast<int>(port)};
}

}  // namespace tandem
