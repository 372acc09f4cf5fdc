// A deployment file: one pipeline across parties, read by every party's `tandem stage`. TOML:
// the run's options at the top (model, cut, pipeline-schedule, batch, microbatches, epochs,
// data, limit, seed and the optimizer's, each named as `tandem train`'s flag), then a
// [NAME] section a party, in the order the data flows through them: the first holds the
// data and the first stage, the last the loss. NAME is the party's identity: the common
// name of its certificate (`tandem-cloud pki issue --client NAME --hosts HOST`), which the
// parties before and after it must present. Paths are relative to the file's folder.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "cli/cli_args.h"

namespace tandem {

struct DeploymentParty {
  std::string name;
  std::string host;   // where it listens for the party before it (all but the first)
  int port = 0;
  std::string identity;  // its identity folder: client.crt, client.key (CN = name), ca.crt
  std::string backend;   // its stage's kernels ("" : the default)
  int threads = 1;
  // With later-stages = "own", the party after the first parties: its executor threads, each
  // serving some of their sessions (0: one a session).
  int executors = 0;
  std::string export_file;  // at the end, its stage's weights with PyTorch's names ("" : none)
  std::string checkpoint_dir;  // where it keeps its stage's checkpoints ("" : none)
  std::string metrics_listen;  // HOST:PORT of its Prometheus /metrics ("" : none)
  std::string egress_log;      // its egress audit: every message it sends, hash-chained ("" : none)
  // A first party's own data (a data set folder, or fashion-mnist) and how many of its samples
  // to keep, in place of the run's: each hospital's own ("" : the run's).
  std::string data, limit;
  // With later-stages = "own", a first party's own batch, micro-batches and wire dtype, in
  // place of the run's (which are then the most the later party takes): each hospital's own
  // ("" : the run's).
  std::string batch, microbatches, wire_dtype;
  // Its stage split into layer shards (tensor parallel, pipeline/layer_shards.h): S members,
  // member 0 this party's process, the others `tandem stage --party NAME --shard R`, meeting
  // in shard-set (a folder they all reach), each listening for the others on its address
  // (one for all, or one a member; private unless shard-allow-public).
  int layer_shards = 1;
  std::string shard_set;
  std::vector<std::string> shard_addresses;
  bool shard_allow_public = false;
  std::string shard_address(int rank) const {
    return shard_addresses.empty() ? "127.0.0.1" : shard_addresses[shard_addresses.size() == 1 ? 0 : rank];
  }
};

struct Deployment {
  std::string path;
  std::map<std::string, std::string> run;  // the top-level keys, as `tandem train` options
  std::vector<DeploymentParty> parties;
  CliArgs args() const { return CliArgs(run); }
  // The party named `name`, by index; an Error listing the parties otherwise.
  std::size_t index_of(const std::string& name) const;
};

Deployment read_deployment(const std::string& path);

// The run's terms a party split into layer shards (layer-shards > 1) cannot take: an Error
// naming the term, for member 0 and every other member alike.
void check_layer_shards(const Deployment& deployment, std::size_t party);

}  // namespace tandem
