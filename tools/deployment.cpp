#include "tools/deployment.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cli/command_line.h"
#include "core/error.h"

namespace tandem {
namespace {

// The run's keys: the options of `tandem train` that a pipeline across parties shares.
const std::vector<std::string>& run_keys() {
  static const std::vector<std::string> keys = {
      "model", "cut", "pipeline-schedule", "batch", "microbatches", "epochs", "data", "limit", "test-limit", "seed", "checkpoint-every",
      "wire-dtype", "labels", "dp-clip", "dp-noise", "dp-delta", "dp-epsilon-budget", "dp-seed", "nopeek", "grad-clip",
      "grad-noise", "label-noise", "first-parties", "average-every", "later-stages",
      "optimizer", "lr", "momentum", "nesterov", "weight-decay", "beta1", "beta2", "eps", "clip-norm",
      "schedule", "warmup-steps", "step-size", "gamma", "min-lr-factor", "total-steps"};
  return keys;
}

const std::vector<std::string>& party_keys() {
  static const std::vector<std::string> keys = {"address", "identity", "backend", "threads", "executors", "export",
                                                "checkpoint-dir", "metrics-listen", "egress-log", "data", "limit",
                                                "batch", "microbatches", "wire-dtype", "layer-shards", "shard-set", "shard-addresses", "shard-allow-public"};
  return keys;
}

std::string suggestion(const std::string& key, const std::vector<std::string>& known) {
  const std::vector<std::string> close = closest_names(key, known);
  return close.empty() ? "" : cat(" (did you mean '", close.front(), "'?)");
}

}  // namespace

std::size_t Deployment::index_of(const std::string& name) const {
  std::string names;
  for (std::size_t i = 0; i < parties.size(); ++i) {
    if (parties[i].name == name) return i;
    names += cat(i ? ", " : "", parties[i].name);
  }
  fail("cli", cat(path, " names no party '", name, "' (its parties: ", names, ")"));
}

Deployment read_deployment(const std::string& path) {
  namespace fs = std::filesystem;
  std::ifstream in(path);
  if (!in) fail("cli", cat("cannot read the deployment file ", path, " (--deployment)"));
  std::vector<CLI::ConfigItem> items;
  try {
    items = CLI::ConfigTOML().from_config(in);
  } catch (const CLI::Error& e) {
    fail("cli", cat(path, ": ", e.what()));
  }
  const fs::path folder = fs::path(path).parent_path();
  const auto relative = [&](const std::string& p) { return fs::path(p).is_absolute() ? p : (folder / p).string(); };
  Deployment d;
  d.path = path;
  std::map<std::string, std::size_t> at;
  for (const CLI::ConfigItem& item : items) {
    if (item.name == "++" || item.name == "--") continue;  // CLI11's marks of a section's start and end
    std::string value;
    for (std::size_t i = 0; i < item.inputs.size(); ++i) value += (i ? "," : "") + item.inputs[i];
    if (item.parents.empty()) {
      if (std::find(run_keys().begin(), run_keys().end(), item.name) == run_keys().end())
        fail("cli", cat(path, ": unknown key '", item.name, "'", suggestion(item.name, run_keys()),
                        "; the run's keys are tandem train's options, a party's go under its [NAME]"));
      d.run[item.name] = (item.name == "model" || (item.name == "data" && value != "fashion-mnist")) ? relative(value)
                                                                                                    : value;
      continue;
    }
    if (item.parents.size() != 1)
      fail("cli", cat(path, ": [", item.parents[0], ".", item.parents[1], "]: a party's section is one name"));
    const std::string& name = item.parents[0];
    if (!at.count(name)) {
      at[name] = d.parties.size();
      d.parties.emplace_back();
      d.parties.back().name = name;
    }
    DeploymentParty& p = d.parties[at[name]];
    if (item.name == "address") {
      const auto colon = value.rfind(':');
      char* end = nullptr;
      const long port = colon == std::string::npos ? -1 : std::strtol(value.c_str() + colon + 1, &end, 10);
      if (colon == std::string::npos || colon == 0 || colon + 1 == value.size() || *end != '\0' || port < 1 ||
          port > 65535)
        fail("cli", cat(path, ": [", name, "] address = '", value, "' is not HOST:PORT"));
      p.host = value.substr(0, colon);
      p.port = static_cast<int>(port);
    } else if (item.name == "identity") {
      p.identity = relative(value);
    } else if (item.name == "backend") {
      p.backend = value;
    } else if (item.name == "threads") {
      p.threads = std::atoi(value.c_str());
      if (p.threads < 1) fail("cli", cat(path, ": [", name, "] threads = '", value, "' is not a count of 1 or more"));
    } else if (item.name == "executors") {
      p.executors = std::atoi(value.c_str());
      if (p.executors < 1) fail("cli", cat(path, ": [", name, "] executors = '", value, "' is not a count of 1 or more"));
    } else if (item.name == "export") {
      p.export_file = relative(value);
    } else if (item.name == "checkpoint-dir") {
      p.checkpoint_dir = relative(value);
    } else if (item.name == "metrics-listen") {
      p.metrics_listen = value;
    } else if (item.name == "egress-log") {
      p.egress_log = relative(value);
    } else if (item.name == "data") {
      p.data = value == "fashion-mnist" ? value : relative(value);
    } else if (item.name == "limit") {
      p.limit = value;
    } else if (item.name == "batch") {
      p.batch = value;
    } else if (item.name == "microbatches") {
      p.microbatches = value;
    } else if (item.name == "wire-dtype") {
      p.wire_dtype = value;
    } else if (item.name == "layer-shards") {
      p.layer_shards = std::atoi(value.c_str());
      if (p.layer_shards < 1 || p.layer_shards > 64)
        fail("cli", cat(path, ": [", name, "] layer-shards = '", value, "' is not a count from 1 to 64"));
    } else if (item.name == "shard-set") {
      p.shard_set = relative(value);
    } else if (item.name == "shard-addresses") {
      p.shard_addresses.clear();
      for (std::size_t i = 0; i <= value.size();) {
        const std::size_t comma = std::min(value.find(',', i), value.size());
        p.shard_addresses.push_back(value.substr(i, comma - i));
        i = comma + 1;
      }
    } else if (item.name == "shard-allow-public") {
      if (value != "true" && value != "false")
        fail("cli", cat(path, ": [", name, "] shard-allow-public = '", value, "' is not true or false"));
      p.shard_allow_public = value == "true";
    } else {
      fail("cli", cat(path, ": [", name, "] has an unknown key '", item.name, "'", suggestion(item.name, party_keys()),
                      " (a party's keys: address, identity, backend, threads, executors, export, checkpoint-dir, metrics-listen, egress-log, "
                      "layer-shards, shard-set, shard-addresses, shard-allow-public, and a first party's data and limit, "
                      "and with later-stages = \"own\" its batch, microbatches and wire-dtype)"));
    }
  }
  if (d.parties.size() < 2)
    fail("cli", cat(path, ": a pipeline needs two parties or more, a [NAME] section each in data order; it has ",
                    d.parties.size()));
  if (!d.run.count("model")) fail("cli", cat(path, ": no model = \"SPEC\" at the top"));
  // first-parties = U: the first U parties connect to the next; they listen for nobody.
  const std::size_t first_parties =
      d.run.count("first-parties") ? static_cast<std::size_t>(std::max(1L, std::atol(d.run["first-parties"].c_str()))) : 1;
  for (std::size_t i = 0; i < d.parties.size(); ++i) {
    const DeploymentParty& p = d.parties[i];
    if (p.identity.empty()) fail("cli", cat(path, ": [", p.name, "] has no identity = \"DIR\" (its certificate folder)"));
    if (i >= first_parties && p.port == 0)
      fail("cli", cat(path, ": [", p.name, "] has no address = \"HOST:PORT\": the party before it connects there"));
    if (p.layer_shards > 1 && i < first_parties)
      fail("cli", cat(path, ": [", p.name, "] layer-shards = ", p.layer_shards, ": a first party's stage runs where "
                      "its data is; split a later party's stage"));
    if (p.layer_shards > 1 && p.shard_set.empty())
      fail("cli", cat(path, ": [", p.name, "] layer-shards = ", p.layer_shards, " needs shard-set = \"DIR\": the "
                      "folder its members meet in (shared storage when they run on several machines)"));
    if (p.shard_addresses.size() > 1 && p.shard_addresses.size() != static_cast<std::size_t>(p.layer_shards))
      fail("cli", cat(path, ": [", p.name, "] shard-addresses names ", p.shard_addresses.size(), " addresses for ",
                      p.layer_shards, " members: one for all, or one a member (member 0's first)"));
    const bool own = d.run.count("later-stages") && d.run.at("later-stages") == "own";
    for (const auto& [key, value] : {std::pair<const char*, const std::string&>{"batch", p.batch},
                                     {"microbatches", p.microbatches}, {"wire-dtype", p.wire_dtype}})
      if (!value.empty() && (i >= first_parties || !own))
        fail("cli", cat(path, ": [", p.name, "] gives ", key, ": a party's own batch, microbatches and wire-dtype are "
                        "a first party's with later-stages = \"own\" (each trains a model of its own); elsewhere every "
                        "party takes the run's, at the top"));
    if (i >= first_parties && (!p.data.empty() || !p.limit.empty()))
      fail("cli", cat(path, ": [", p.name, "] gives ", p.data.empty() ? "limit" : "data", ": only a first party reads "
                      "data (the run's data and limit are at the top)"));
  }
  return d;
}

void check_layer_shards(const Deployment& d, std::size_t party) {
  const DeploymentParty& p = d.parties[party];
  if (p.layer_shards < 2) return;
  const CliArgs args = d.args();
  if (args.str("later-stages", "shared") == "own")
    fail("cli", cat(d.path, ": [", p.name, "] layer-shards: with later-stages = \"own\" the party keeps a stage a "
                    "first party; split a stage the first parties share"));
  if (const float clip = args.optimizer_options().clip_norm; clip > 0)
    fail("cli", cat(d.path, ": clip-norm = ", clip, " clips by the global norm, and each layer shard of [", p.name,
                    "] holds a slice of the gradients: leave it off where a stage is split"));
}

}  // namespace tandem
