#include "tools/cli_args.h"

#include <cstdio>
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

SgdOptions CliArgs::sgd_options() const {
  SgdOptions o;
  o.lr = static_cast<float>(number("lr", 0.05));
  o.momentum = static_cast<float>(number("momentum", 0.9));
  o.weight_decay = static_cast<float>(number("weight-decay", 0.0));
  return o;
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

int run_cli(int argc, char** argv, const char* program, const char* usage,
            const std::map<std::string, CliCommand>& commands) {
  const std::string command = argc > 1 ? argv[1] : "";
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(usage, stdout);
    return 0;
  }
  auto it = commands.find(command);
  if (it == commands.end()) {
    std::fputs(usage, stderr);
    return 2;
  }
  try {
    return it->second(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace tandem
