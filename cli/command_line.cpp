#include "cli/command_line.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"

namespace tandem {
namespace {

constexpr const char* kConfigHelp =
    "options from a TOML file, each key named as its flag (epochs = 3); flags given here win over the file";

// Damerau-Levenshtein distance, optimal string alignment: a swap of neighbours counts once.
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

std::string did_you_mean(const std::string& typed, const std::vector<std::string>& known, const std::string& prefix) {
  const std::vector<std::string> close = closest_names(typed, known);
  if (close.empty()) return "";
  std::string out = "; did you mean ";
  for (std::size_t i = 0; i < close.size(); ++i) out += cat(i == 0 ? "" : " or ", prefix, close[i]);
  return out + "?";
}

// Adds to `values` what FILE (TOML) gives for the options of `command` that are not in `given`
// (the command line's, which win). Keys are the options' names, at the top of the file.
void read_config(const std::string& file, const Command& command, const std::set<std::string>& given,
                 std::map<std::string, std::string>& values);

// A flag's value from the command line (CLI11 gives "true", "false" or a count) or a config file.
bool flag_value(const std::string& name, std::string text, const std::string& where) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (text == "true" || text == "1" || text == "yes" || text == "on") return true;
  if (text == "false" || text == "0" || text == "no" || text == "off" || text == "-1") return false;
  if (!text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) return true;
  fail("cli", cat(where, name, " is a flag: give true or false, got '", text, "'"));
}

void read_config(const std::string& file, const Command& command, const std::set<std::string>& given,
                 std::map<std::string, std::string>& values) {
  if (!std::filesystem::is_regular_file(file))
    fail("cli", cat("--config ", file, ": no such file (paths are relative to the working directory, ",
                    std::filesystem::current_path().string(), ")"));
  std::vector<CLI::ConfigItem> items;
  try {
    items = CLI::ConfigTOML().from_file(file);
  } catch (const CLI::Error& e) {
    fail("cli", cat("--config ", file, ": ", e.what()));
  }
  const std::string& path = command.path();
  const std::vector<std::string>& known = command.names();
  for (const CLI::ConfigItem& item : items) {
    if (item.name == "++" || item.name == "--") continue;  // the opening and closing of a [section]
    const std::string key = item.fullname();
    if (!item.parents.empty())
      fail("cli", cat("--config ", file, ": key '", key, "' is inside a [section]: ", path,
                      " reads its keys at the top of the file, named as its flags"));
    if (std::find(known.begin(), known.end(), key) == known.end())
      fail("cli", cat("--config ", file, ": unknown key '", key, "'", did_you_mean(key, known, ""), " ('", path,
                      " --help' lists the options; each is a key of the same name)"));
    if (given.count(key)) continue;  // the command line wins over the file
    if (command.is_flag(key)) {
      if (flag_value(key, item.inputs.empty() ? "true" : item.inputs.front(), cat("--config ", file, ": key ")))
        values[key] = "1";
      continue;
    }
    std::string joined;  // a TOML array is a comma-separated list, as the flag takes it
    for (std::size_t i = 0; i < item.inputs.size(); ++i) joined += (i ? "," : "") + item.inputs[i];
    values[key] = joined;
  }
}

}  // namespace

std::vector<std::string> closest_names(const std::string& typed, const std::vector<std::string>& known) {
  std::size_t best = std::max<std::size_t>(2, typed.size() / 3) + 1;
  std::vector<std::string> out;
  for (const std::string& name : known) {
    std::size_t d = edit_distance(typed, name);
    // A prefix of a long name ("--check" for --checkpoint-dir) is close too.
    if (typed.size() >= 3 && name.rfind(typed, 0) == 0) d = std::min<std::size_t>(d, 1);
    if (d < best) {
      best = d;
      out = {name};
    } else if (d == best && out.size() < 3) {
      out.push_back(name);
    }
  }
  return out;
}

Command::Command(CLI::App* app, std::string path) : app_(app), path_(std::move(path)) {}

Command& Command::option(const std::string& name, const std::string& value_name, const std::string& help) {
  app_->add_option("--" + name, help)->type_name(value_name);
  names_.push_back(name);
  return *this;
}

Command& Command::flag(const std::string& name, const std::string& help) {
  app_->add_flag("--" + name, help);
  names_.push_back(name);
  flags_.insert(name);
  return *this;
}

Command& Command::positional(const std::string& name, const std::string& help) {
  app_->add_option(name, help)->required();
  return *this;
}

Command& Command::optimizer_options(bool schedule) {
  option("optimizer", "sgd|adam|adamw", "the optimizer (default sgd)");
  option("lr", "X", "learning rate (default 0.05 for sgd, 0.001 for adam and adamw)");
  option("momentum", "X", "sgd's momentum (default 0.9)");
  flag("nesterov", "sgd with Nesterov momentum");
  option("weight-decay", "X", "weight decay (default 0; 0.01 for adamw)");
  option("beta1", "X", "Adam's beta1 (default 0.9)");
  option("beta2", "X", "Adam's beta2 (default 0.999)");
  option("eps", "X", "Adam's epsilon (default 1e-8)");
  option("clip-norm", "X", "clip this shard's gradients to this global L2 norm (default 0: off)");
  if (!schedule) return *this;
  option("schedule", "constant|step|cosine", "the learning rate's schedule (default constant)");
  option("warmup-steps", "N", "linear warm-up over N steps (default 0)");
  option("step-size", "N", "step schedule: multiply by --gamma every N steps (default 1)");
  option("gamma", "X", "step schedule's factor (default 0.1)");
  option("min-lr-factor", "X", "cosine's floor, as a factor of --lr (default 0)");
  option("total-steps", "N", "cosine's length in steps (default: the whole run)");
  return *this;
}

Command& Command::details(const std::string& text) {
  app_->footer(text);
  return *this;
}

Command& Command::run(Handler handler) {
  if (!names_.empty()) add_config_option();  // last in --help, after the command's own options
  handler_ = std::move(handler);
  return *this;
}

Command& Command::command(const std::string& name, const std::string& description) {
  CLI::App* sub = app_->add_subcommand(name, description);
  sub->allow_extras();
  children_.push_back(std::make_unique<Command>(sub, cat(path_, " ", name)));
  return *children_.back();
}

void Command::add_config_option() {
  if (config_added_) return;
  config_added_ = true;
  app_->add_option("--config", kConfigHelp)->type_name("FILE");
}

Command* Command::child(const CLI::App* app) {
  for (auto& c : children_)
    if (c->app_ == app) return c.get();
  return nullptr;
}

Program::Program(const std::string& name, const std::string& description)
    : name_(name), app_(std::make_unique<CLI::App>(description, name)) {
  app_->allow_extras();
  // A repeated option takes its last value: a script's defaults, then the user's arguments.
  app_->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app_->set_version_flag("--version", cat(name, " ", tandem_version()), "print the version and the commit, and exit");
  auto format = std::make_shared<CLI::Formatter>();
  format->column_width(36);
  app_->formatter(format);  // subcommands made later share it
  root_ = std::make_unique<Command>(app_.get(), name);
}

Program::~Program() = default;

Command& Program::command(const std::string& name, const std::string& description) {
  return root_->command(name, description);
}

int Program::main(int argc, char** argv) {
  try {
    app_->parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app_->exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app_->exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app_->exit(e);
  } catch (const CLI::ParseError& e) {
    std::string path = name_;  // the command the parse had reached
    for (CLI::App* app = app_.get(); !app->get_subcommands().empty();) {
      app = app->get_subcommands().front();
      path += " " + app->get_name();
    }
    std::fprintf(stderr, "%s: %s ('%s --help' says more)\n", path.c_str(), e.what(), path.c_str());
    return 2;
  }
  // The command that was chosen: the deepest parsed.
  CLI::App* app = app_.get();
  Command* command = root_.get();
  while (!app->get_subcommands().empty() && command) {
    app = app->get_subcommands().front();
    command = command->child(app);
  }
  if (!command) return 2;  // not reached: every subcommand is a Command
  const std::string& path = command->path();
  const std::vector<std::string> extras = app_->remaining(true);
  const auto usage_error = [&](const std::string& what) {
    std::fprintf(stderr, "%s: %s\n", name_.c_str(), what.c_str());
    return 2;
  };
  if (!extras.empty()) {
    const std::string& first = extras.front();
    if (first.rfind("--", 0) == 0 && first.size() > 2) {
      std::string typed = first.substr(2);
      typed = typed.substr(0, typed.find('='));
      return usage_error(cat("unknown option --", typed, did_you_mean(typed, command->names(), "--"), " ('", path,
                             " --help' lists the options)"));
    }
    std::vector<std::string> commands;
    for (const CLI::App* sub : app->get_subcommands({})) commands.push_back(sub->get_name());
    if (!commands.empty() && !first.empty() && first[0] != '-')
      return usage_error(cat("unknown command '", first, "'", did_you_mean(first, commands, ""), " ('", path,
                             " --help' lists the commands)"));
    return usage_error(cat("unexpected argument '", first, "' ('", path, " --help' says what it takes)"));
  }
  try {
    if (!command->handler()) {
      std::fputs(app->help().c_str(), stderr);
      std::fprintf(stderr, "%s: give a command\n", path.c_str());
      return 2;
    }
    std::map<std::string, std::string> values;  // a flag has "1" when set
    std::set<std::string> given;                 // on the command line, true or false
    for (const std::string& name : command->names()) {
      const CLI::Option* o = app->get_option("--" + name);
      if (o->count() == 0) continue;
      given.insert(name);
      const std::string value = o->results().back();
      if (!command->is_flag(name))
        values[name] = value;
      else if (flag_value(name, value, "--"))
        values[name] = "1";
    }
    for (const CLI::Option* o : app->get_options([](const CLI::Option* o) { return o->get_positional(); }))
      if (o->count()) values[o->get_name()] = o->results().back();
    const CLI::Option* config = app->get_option_no_throw("--config");
    if (config && config->count()) read_config(config->results().back(), *command, given, values);
    return command->handler()(CliArgs(std::move(values)));
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: %s\n", name_.c_str(), e.what());
    return 1;
  }
}

}  // namespace tandem
