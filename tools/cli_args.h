// A small command-line reader for tandem's CLIs: "--name value" and "--flag" options, with
// typed getters that throw an Error naming the option when a value is missing or malformed.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

namespace tandem {

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

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace tandem
