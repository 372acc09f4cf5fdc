#include "tools/cli_args.h"

#include <cstdlib>

#include "core/error.h"

namespace tandem {

CliArgs::CliArgs(int argc, char** argv, int first, const std::set<std::string>& flags) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) fail("cli", cat("unexpected argument '", arg, "'"));
    std::string name = arg.substr(2), value = "1";
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (!flags.count(name)) {
      if (i + 1 >= argc) fail("cli", cat("option --", name, " needs a value"));
      value = argv[++i];
    }
    values_[name] = value;
  }
}

bool CliArgs::has(const std::string& name) const { return values_.count(name) > 0; }

std::string CliArgs::str(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

std::string CliArgs::required(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) fail("cli", cat("option --", name, " is required"));
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

void CliArgs::reject_unknown(const std::set<std::string>& known) const {
  for (const auto& [name, value] : values_)
    if (!known.count(name)) fail("cli", cat("unknown option --", name, "; see --help"));
}

}  // namespace tandem
