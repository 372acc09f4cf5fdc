// A small command-line reader for tandem's CLIs: "--name value" and "--flag" options, with
// typed getters that throw an Error naming the option when a value is missing or malformed.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/optimizer.h"

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
  // --lr (0.05), --momentum (0.9), --weight-decay (0): the options every trainer takes.
  SgdOptions sgd_options() const;
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
