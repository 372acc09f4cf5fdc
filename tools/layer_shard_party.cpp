#include "tools/layer_shard_party.h"

#include <chrono>
#include <cstdio>

#include "backends/registry.h"
#include "collective/fixed_group.h"
#include "core/checkpoint/checkpoint.h"
#include "core/error.h"
#include "core/optimizer.h"
#include "core/sha256.h"
#include "pipeline/layer_shards.h"
#include "ports/files/checkpoint_store.h"

namespace tandem {
namespace {

const DeploymentParty& self_of(const LayerShardArgs& a) { return a.deployment.parties[a.party]; }

std::string start_hint(const LayerShardArgs& a, int rank) {
  return cat("tandem stage --deployment ", a.deployment.path, " --party ", self_of(a).name, " --shard ", rank);
}

// Member `rank`'s network: its slices of the stage, initialised as every party draws the
// whole model's weights.
struct Member {
  LayerShardStage shard;
  std::unique_ptr<Network> net;
};
Member member_network(const LayerShardArgs& a, int rank) {
  const int shards = self_of(a).layer_shards;
  Member m{layer_shard_stage(a.spec, a.cuts, a.index, rank, shards), nullptr};
  m.net = std::make_unique<Network>(m.shard.graph, a.backend, a.seed);
  const std::unique_ptr<Backend> reference = make_backend("reference");
  Network whole(a.graph.partition(a.cuts)[a.index], *reference, a.seed);
  init_from_whole_model(a.graph, a.seed, whole, *reference);
  load_layer_shard(whole, *m.net, m.shard.pairs, rank, shards);
  return m;
}

// What every member must share, digested: a member of another deployment stops at once.
std::array<uint8_t, 32> shard_terms(const LayerShardArgs& a) {
  Sha256 h;
  h.update(a.spec.binary.data(), a.spec.binary.size());
  const OptimizerOptions& o = a.optimizer;
  std::string cuts;
  for (const std::string& c : a.cuts) cuts += c + ",";
  const std::string terms =
      cat(" cuts=", cuts, " stage=", a.index, " shards=", self_of(a).layer_shards, " seed=", a.seed, " optimizer=",
          o.kind, " lr=", o.lr, " momentum=", o.momentum, " dampening=", o.dampening, " weight_decay=", o.weight_decay,
          " nesterov=", o.nesterov, " betas=", o.beta1, ",", o.beta2, " eps=", o.eps, " clip_norm=", o.clip_norm);
  h.update(terms.data(), terms.size());
  return h.finish();
}

FixedGroupOptions group_options(const LayerShardArgs& a, int rank) {
  const DeploymentParty& self = self_of(a);
  FixedGroupOptions o;
  o.dir = self.shard_set;
  o.name = self.name;
  o.rank = rank;
  o.size = self.layer_shards;
  o.address = self.shard_address(rank);
  o.allow_public = self.shard_allow_public;
  o.form_timeout = std::chrono::seconds(a.wait_s);
  // A member awaits its next call while member 0 awaits its links: their silence, and a start.
  o.timeout = std::chrono::seconds(a.silence_s + a.wait_s + 60);
  o.what = "layer shards";
  return o;
}

class Leader final : public LayerShardParty {
 public:
  explicit Leader(const LayerShardArgs& a)
      : args_(a), member_(member_network(a, 0)), group_(group_options(a, 0)), reducer_(group_), leader_(group_) {
    member_.net->set_reducer(&reducer_);  // the split layers' sums
    std::fprintf(stderr, "layer shards: %d members, %zu linear pairs split; waiting up to %d s for members 1..%d "
                 "in %s\n", self_of(a).layer_shards, member_.shard.pairs.size(), a.wait_s, self_of(a).layer_shards - 1,
                 self_of(a).shard_set.c_str());
    form();
  }
  Network& network() override { return *member_.net; }
  StageMirror* mirror() override { return &leader_; }
  std::vector<uint64_t> common_steps(const std::vector<uint64_t>& mine) override { return leader_.common_steps(mine); }
  void save(uint64_t step) override { leader_.save(step); }
  void restore(uint64_t step) override { leader_.restore(step); }
  void gather(Network& whole) override {
    leader_.gather();
    gather_layer_shard(group_, *member_.net, &whole, member_.shard.pairs, 0, group_.size());
  }
  void end(bool failed) override { leader_.end(failed); }
  void reform() override { form(); }
  std::string metrics(const std::string& labels) const override {
    const Group::Stats& s = group_.stats();
    std::string out;
    const auto one = [&](const char* name, const char* type, const char* help, const std::string& value) {
      out += cat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name, "{", labels, "} ", value, "\n");
    };
    one("tandem_stage_layer_shard_collectives_total", "counter",
        "Collectives of this stage's layer shards (calls told, all-sums of the split layers).", cat(s.collectives));
    one("tandem_stage_layer_shard_bytes_total", "counter", "Bytes this member handed to those collectives.", cat(s.bytes));
    one("tandem_stage_layer_shard_seconds_total", "counter", "Seconds spent in them (network, and waiting for members).",
        cat(s.seconds));
    one("tandem_stage_layer_shard_session", "gauge", "The layer shards' session: one more each time they form again.",
        cat(group_.generation()));
    return out;
  }

 private:
  // A session of the members, and the hello that checks their terms. A session whose meeting
  // fails (a member gone between its announcement and the meeting) is tried again, up to three
  // times, each waiting up to --wait-s for the members' announcements.
  void form() {
    for (int attempt = 1;; ++attempt) {
      try {
        group_.form();
        leader_.restart();
        leader_.hello(shard_terms(args_));
        break;
      } catch (const GroupLost& e) {
        if (attempt == 3)
          fail("stage", cat(e.what(), ": start each missing member with `", start_hint(args_, 1), "` (R from 1 to ",
                            group_.size() - 1, ")"));
        std::fprintf(stderr, "layer shards: %s; forming again\n", e.what());
      }
    }
    std::fprintf(stderr, "layer shards: %d members met (session %llu)\n", group_.size(),
                 static_cast<unsigned long long>(group_.generation()));
  }

  LayerShardArgs args_;
  Member member_;
  FixedGroup group_;
  GroupReducer reducer_;
  LayerShardLeader leader_;
};

}  // namespace

std::unique_ptr<LayerShardParty> LayerShardParty::lead(const LayerShardArgs& args) {
  return std::make_unique<Leader>(args);
}

int run_layer_shard_member(const CliArgs& cli) {
  const Deployment deployment = read_deployment(cli.required("deployment"));
  const CliArgs args = deployment.args();
  const std::string party_name = cli.required("party");
  const std::size_t party = deployment.index_of(party_name);
  const DeploymentParty& self = deployment.parties[party];
  const int rank = static_cast<int>(cli.integer("shard", 1, 1));
  if (self.layer_shards < 2)
    fail("cli", cat(deployment.path, ": [", party_name, "] is not split into layer shards (add layer-shards = S)"));
  if (rank >= self.layer_shards)
    fail("cli", cat("--shard ", rank, ": [", party_name, "] has layer-shards = ", self.layer_shards, ", members 1 to ",
                    self.layer_shards - 1, " (member 0 is tandem stage --party ", party_name, " without --shard)"));
  const auto members = static_cast<std::size_t>(args.integer("first-parties", 1, 1));
  const std::size_t index = party - members + 1;
  const ModelSpec spec = load_model_spec(args.required("model"));
  const Graph graph = Graph::build(spec);
  const std::string cut = graph.cut_nodes(args.str("cut", graph.default_cut()));
  const uint64_t seed = static_cast<uint64_t>(args.integer("seed", 1, 0));
  const int wait_s = static_cast<int>(cli.integer("wait-s", 120, 1));
  const int silence_s = static_cast<int>(cli.integer("silence-s", 300, 5));
  const int max_restarts = static_cast<int>(cli.integer("restarts", 10, 0));
  check_layer_shards(deployment, party);
  BackendOptions backend_options;
  backend_options.threads = self.threads;
  const std::unique_ptr<Backend> backend =
      make_backend(!self.backend.empty() ? self.backend : preferred_backend("onednn"), backend_options);
  const OptimizerOptions opt = args.optimizer_options();
  const LayerShardArgs a{deployment, party, spec, graph, cut_list(cut), index, *backend, seed, opt, wait_s, silence_s};
  Member m = member_network(a, rank);
  std::unique_ptr<Optimizer> optimizer = make_optimizer(m.net->params(), opt);
  Stage stage(*m.net, optimizer.get());
  std::fprintf(stderr, "party %s, layer shard %d of %d: stage %zu (%lld parameters, %s)\n", party_name.c_str(), rank,
               self.layer_shards, index, static_cast<long long>(m.net->param_count()),
               std::string(backend->name()).c_str());

  // Its own checkpoints of its slices, beside member 0's in the party's checkpoint-dir.
  std::unique_ptr<CheckpointStore> store;
  if (!self.checkpoint_dir.empty())
    store = std::make_unique<CheckpointStore>(self.checkpoint_dir,
                                              cat("stage", index, ".shard", rank, "-of-", self.layer_shards));
  CheckpointMeta meta;
  meta.role = "layer-shard";
  meta.client_id = cat(party_name, ".shard", rank);
  meta.cut = cut;
  {
    Sha256 h;
    h.update(spec.binary.data(), spec.binary.size());
    const std::string terms = cat(" cut=", cut, " stage=", index, " shard=", rank, "/", self.layer_shards);
    h.update(terms.data(), terms.size());
    meta.model_hash = h.finish();
  }
  const std::vector<uint8_t> initial = encode_checkpoint(meta, *m.net, optimizer.get());

  FixedGroup group(group_options(a, rank));
  GroupReducer reducer(group);
  m.net->set_reducer(&reducer);  // the split layers' sums
  LayerShardFollower follower;
  follower.has = [&](uint64_t step) {
    if (step == 0) return true;
    if (!store) return false;
    for (uint64_t s : store->steps())
      if (s == step) return true;
    return false;
  };
  follower.save = [&](uint64_t step) {
    if (!store) fail("stage", cat("member 0 saves a checkpoint, and [", party_name, "] has no checkpoint-dir"));
    meta.step = step;
    store->save(step, encode_checkpoint(meta, *m.net, optimizer.get()));
  };
  follower.restore = [&](uint64_t step) {
    if (step != 0 && !store)
      fail("stage", cat("member 0 restores step ", step, ", and [", party_name, "] has no checkpoint-dir here"));
    const CheckpointData state = step == 0 ? decode_checkpoint(initial) : store->load_step(step);
    if (state.meta.model_hash != meta.model_hash || state.meta.step != step || state.meta.role != meta.role)
      fail("stage", cat(self.checkpoint_dir, " holds a checkpoint of step ", state.meta.step, " from another plan or "
                        "member: move it away, or start this deployment in an empty checkpoint-dir"));
    restore_checkpoint(state, *m.net, optimizer.get());
    std::fprintf(stderr, "layer shard %d: at step %llu\n", rank, static_cast<unsigned long long>(step));
  };
  follower.gather = [&] { gather_layer_shard(group, *m.net, nullptr, m.shard.pairs, rank, self.layer_shards); };
  follower.terms = shard_terms(a);
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t calls = 0;
  int losses = 0;
  for (;;) {
    try {
      group.form();
      std::fprintf(stderr, "layer shard %d: the %d members met (session %llu)\n", rank, self.layer_shards,
                   static_cast<unsigned long long>(group.generation()));
      calls += follow_layer_shard(stage, group, follower);
      break;
    } catch (const GroupLost& e) {
      stage.reset();  // the step in flight is dropped; member 0 says where to go on from
      if (++losses > max_restarts)
        fail("stage", cat(e.what(), " (", max_restarts, " losses in this run; --restarts N allows more)"));
      std::fprintf(stderr, "layer shard %d: %s; waiting up to %d s for the group to form again (%d of at most %d)\n",
                   rank, e.what(), wait_s, losses, max_restarts);
    }
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const Group::Stats& s = group.stats();
  std::printf("{\"party\":\"%s\",\"shard\":%d,\"stage\":%zu,\"steps\":%lld,\"losses\":%d,\"calls\":%llu,"
              "\"collectives\":%llu,\"collective_bytes\":%llu,\"collective_s\":%.3f,\"busy_s\":%.3f,\"wall_s\":%.3f}\n",
              party_name.c_str(), rank, index, static_cast<long long>(optimizer->steps()), losses,
              static_cast<unsigned long long>(calls), static_cast<unsigned long long>(s.collectives), static_cast<unsigned long long>(s.bytes), s.seconds,
              stage.busy_s(), wall);
  return 0;
}

}  // namespace tandem
