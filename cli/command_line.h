// tandem's command lines on CLI11: a program of commands (and commands of commands), each with
// the options it takes and a line of help for each, its own --help, --config FILE (TOML read by
// CLI11, a key for every option under the flag's own name; flags win over the file), the
// program's --version with the commit, and a suggestion for a mistyped option or command.
// A command's handler reads its values through CliArgs, which names the option in every error.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cli/cli_args.h"

namespace CLI {
class App;
}

namespace tandem {

class Command {
 public:
  using Handler = std::function<int(const CliArgs&)>;

  // --NAME VALUE (also --NAME=VALUE, and NAME = VALUE in a config file).
  Command& option(const std::string& name, const std::string& value_name, const std::string& help);
  // --NAME, no value (NAME = true in a config file).
  Command& flag(const std::string& name, const std::string& help);
  // A required argument without a name (tandem audit verify LOG): read as args.required(NAME).
  Command& positional(const std::string& name, const std::string& help);
  // The optimizer's options (and the learning-rate schedule's): CliArgs::optimizer_options.
  Command& optimizer_options(bool schedule);
  // What --help prints after the options: how the command behaves, beyond one option.
  Command& details(const std::string& text);
  Command& run(Handler handler);
  // A command of this command (tandem-cloud pki issue).
  Command& command(const std::string& name, const std::string& description);

  // Internal to the program: the values given on the command line and in --config.
  Command(CLI::App* app, std::string path);
  CLI::App* app() const { return app_; }
  const std::string& path() const { return path_; }
  Command* child(const CLI::App* app);
  const Handler& handler() const { return handler_; }
  bool is_flag(const std::string& name) const { return flags_.count(name) > 0; }
  const std::vector<std::string>& names() const { return names_; }

 private:
  void add_config_option();
  CLI::App* app_;
  std::string path_;  // "tandem-cloud pki issue"
  Handler handler_;
  std::vector<std::string> names_;  // options, in the order declared
  std::set<std::string> flags_;
  bool config_added_ = false;
  std::vector<std::unique_ptr<Command>> children_;
};

class Program {
 public:
  Program(const std::string& name, const std::string& description);
  ~Program();
  Command& command(const std::string& name, const std::string& description);
  // The program's own options, for a program without commands (a benchmark's binary).
  Command& root() { return *root_; }
  // Parses, runs the command, and returns its exit status: 0 for --help and --version,
  // 2 for a command line that does not parse (with the reason and a suggestion), 1 for an
  // Error the command throws ("program: [where] what").
  int main(int argc, char** argv);

 private:
  std::string name_;
  std::unique_ptr<CLI::App> app_;
  std::unique_ptr<Command> root_;
};

// "0.1.0 (commit 0123abcd4567, 2026-11-26)": the version and the commit this was built from.
std::string tandem_version();

// The closest names to `typed` among `known` (edit distance, transpositions counted once):
// what "did you mean" offers; empty when none is close.
std::vector<std::string> closest_names(const std::string& typed, const std::vector<std::string>& known);

}  // namespace tandem
