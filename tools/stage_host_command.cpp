#include "tools/stage_host_command.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>

#include "backends/registry.h"
#include "core/checkpoint/checkpoint.h"
#include "core/error.h"
#include "core/interop/safetensors.h"
#include "core/interop/torch_layout.h"
#include "edge/agent/egress_log_file.h"
#include "pipeline/stage_host.h"
#include "ports/files/atomic_file.h"
#include "ports/files/checkpoint_store.h"
#include "ports/lws/http_listener.h"
#include "ports/lws/lws_endpoint.h"

namespace tandem {

TlsIdentity deployment_tls(const DeploymentParty& p) {
  return {p.identity + "/client.crt", p.identity + "/client.key", p.identity + "/ca.crt"};
}

namespace {

using Clock = std::chrono::steady_clock;

// One first party's last stage: drawn as every party draws its stage (the whole model's
// seeded initialisation), on the host's one backend.
struct SessionStage final : HostedStage {
  std::unique_ptr<Network> net;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<Stage> stage_;
  std::vector<uint8_t> initial;  // its checkpoint of step 0
  std::unique_ptr<CheckpointStore> store;
  Stage& stage() override { return *stage_; }
};

// `file` with "-NAME" before its extension: cloud.safetensors -> cloud-hospital-a.safetensors.
std::string per_session(const std::string& file, const std::string& name) {
  const std::filesystem::path p(file);
  return (p.parent_path() / cat(p.stem().string(), "-", name, p.extension().string())).string();
}

}  // namespace

int run_stage_host(const StageHostRun& r) {
  const DeploymentParty& self = r.deployment.parties[r.party];
  std::vector<std::string> firsts;
  for (std::size_t p = 0; p < r.party; ++p) firsts.push_back(r.deployment.parties[p].name);
  std::string names;
  for (const std::string& n : firsts) names += cat(names.empty() ? "'" : ", '", n, "'");
  if (r.checkpoint_every > 0 && self.checkpoint_dir.empty())
    fail("cli", cat(r.deployment.path, ": checkpoint-every = ", r.checkpoint_every, " but [", self.name,
                    "] has no checkpoint-dir = \"DIR\" (it keeps a folder of checkpoints for each first party there)"));

  CheckpointMeta meta;
  meta.role = "stage";
  meta.cut = r.cut;
  meta.model_hash = r.plan.run;
  std::unique_ptr<Backend> reference = make_backend("reference");
  StageHostHooks hooks;
  // The executors (tools/stage_command.cpp: one a session, or the party's `executors`), each
  // with a backend of its own (its thread alone uses it).
  std::vector<std::unique_ptr<Backend>> backends;
  for (std::size_t e = 0; e < r.executors; ++e) backends.push_back(r.make_backend());
  hooks.make = [&](const std::string& name, std::size_t executor) {
    auto s = std::make_unique<SessionStage>();
    s->net = std::make_unique<Network>(r.stages[1], *backends[executor], r.seed);
    init_from_whole_model(r.graph, r.seed, *s->net, *reference);  // as every party draws it
    s->optimizer = make_optimizer(s->net->params(), r.optimizer);
    s->stage_ = std::make_unique<Stage>(*s->net, s->optimizer.get());
    CheckpointMeta m = meta;
    m.client_id = name;
    s->initial = encode_checkpoint(m, *s->net, s->optimizer.get());
    if (!self.checkpoint_dir.empty())
      s->store = std::make_unique<CheckpointStore>((std::filesystem::path(self.checkpoint_dir) / name).string(), "stage1");
    std::fprintf(stderr, "'%s' linked: a last stage of its own (%lld parameters)\n", name.c_str(),
                 static_cast<long long>(s->net->param_count()));
    return s;
  };
  hooks.checkpoints = [&](const std::string&, HostedStage& h) {
    auto& s = static_cast<SessionStage&>(h);
    return s.store ? s.store->steps() : std::vector<uint64_t>{};
  };
  const std::string out = r.cli.str("export", self.export_file);
  // A first party's end of run, recorded in its checkpoint folder: a host restarted after it
  // does not wait for that party again.
  const auto finished_marker = [&](const std::string& name) {
    return (std::filesystem::path(self.checkpoint_dir) / name / "finished").string();
  };
  hooks.restore = [&](const std::string& name, uint64_t step, HostedStage& h) {
    auto& s = static_cast<SessionStage&>(h);
    if (s.store) std::filesystem::remove(finished_marker(name));  // it runs again
    const CheckpointData state = step == 0 ? decode_checkpoint(s.initial) : s.store->load_step(step);
    if (state.meta.model_hash != r.plan.run || state.meta.step != step || state.meta.role != "stage" ||
        state.meta.client_id != name)
      fail("stage", cat(s.store ? s.store->dir() : std::string("memory"), " holds a checkpoint of step ",
                        state.meta.step, " of another plan or first party: move it away"));
    restore_checkpoint(state, *s.net, s.optimizer.get());
    std::fprintf(stderr, "'%s': starting at step %llu\n", name.c_str(), static_cast<unsigned long long>(step));
  };
  if (!self.checkpoint_dir.empty())
    hooks.save = [&](const std::string& name, uint64_t step, HostedStage& h) {
      auto& s = static_cast<SessionStage&>(h);
      CheckpointMeta m = meta;
      m.client_id = name;
      m.step = step;
      s.store->save(step, encode_checkpoint(m, *s.net, s.optimizer.get()));
    };
  // At a session's end: its export now (a crash of this process later keeps it), and the record.
  hooks.ended = [&](const std::string& name, const std::string& error, HostedStage& h, uint64_t steps) {
    if (!error.empty()) {
      std::fprintf(stderr, "'%s': %s (it may link again)\n", name.c_str(), error.c_str());
      return;
    }
    auto& s = static_cast<SessionStage&>(h);
    std::fprintf(stderr, "'%s' ended its run at step %llu\n", name.c_str(), static_cast<unsigned long long>(steps));
    if (!out.empty()) {
      const std::vector<SafeTensor> tensors = shard_to_torch(r.graph, *s.net, static_cast<int64_t>(steps));
      const std::string file = per_session(out, name);
      write_file_atomic(file, write_safetensors(tensors, {{"format", "pt"}, {"tandem_model", r.spec.name},
                                                          {"tandem_cut", r.cut}, {"tandem_stage", "1"},
                                                          {"tandem_session", name}, {"tandem_step", cat(steps)},
                                                          {"tandem_layout", "pytorch (OIHW, NCHW flatten order)"}}));
      std::fprintf(stderr, "wrote %s: '%s''s last stage, %zu tensors\n", file.c_str(), name.c_str(), tensors.size());
    }
    if (s.store) {
      const std::string text = cat(steps, "\n");
      write_file_atomic(finished_marker(name), std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
    }
  };

  std::unique_ptr<EgressLogFile> egress;
  if (!self.egress_log.empty()) {
    egress = std::make_unique<EgressLogFile>(self.egress_log);
    egress->audit().begin_run(self.name, r.spec.name, r.cut, r.plan.run);
  }
  EndpointOptions options;
  options.idle_hangup_s = r.silence_s;
  std::unique_ptr<LwsEndpoint> endpoint = LwsEndpoint::listen(self.host, self.port, deployment_tls(self), options);
  std::atomic<uint64_t> sent{0}, received{0};
  std::mutex send_mu;
  std::set<uint64_t> closing;  // connections sent their last message, until they are closed
  // A session's frames waiting for its stage: a step's micro-batches and the next one's, and
  // a few more (an honest first party sends no more ahead).
  StageHostOptions host_options{&r.schedule, r.plan, firsts, firsts.size(), r.executors, 2 * r.plan.microbatches + 4};
  StageHost host(host_options, hooks, [&](uint64_t connection, std::span<const uint8_t> bytes, bool close) {
    std::lock_guard lock(send_mu);  // from every executor: the audit's chain in the order sent
    if (egress) egress->audit().record(bytes);
    sent += bytes.size();
    if (close) closing.insert(connection);
    endpoint->send(connection, bytes, close);
  });
  std::size_t ended_before = 0;
  if (!self.checkpoint_dir.empty())
    for (const std::string& name : firsts) {
      std::ifstream marker(finished_marker(name));
      uint64_t steps = 0;
      if (!(marker >> steps)) continue;
      host.mark_finished(name, steps);
      ++ended_before;
      std::fprintf(stderr, "'%s' ended its run before this process, at step %llu (%s)\n", name.c_str(),
                   static_cast<unsigned long long>(steps), finished_marker(name).c_str());
    }
  // Every first party ended its run here before: nothing is left to train, but a party whose
  // last Bye was lost (its record of the end unanswered) may link again to hear it. The host
  // answers each that links with Bye, and the run is over once nobody has linked for silence-s.
  const bool over = ended_before == firsts.size();
  if (over)
    std::fprintf(stderr, "every first party has ended its run here before (%s/NAME/finished): nothing is left to "
                 "train; answering any that links again with Bye for %d s (to train again, start from an empty "
                 "checkpoint-dir)\n", self.checkpoint_dir.c_str(), r.silence_s);
  std::fprintf(stderr, "listening on wss://%s:%d for %s, each with a last stage of its own, on %zu executor%s\n",
               self.host.c_str(), endpoint->port(), names.c_str(), r.executors, r.executors == 1 ? "" : "s");

  const auto started = Clock::now();
  std::unique_ptr<HttpListener> http;
  const std::string metrics_at = r.cli.str("metrics-listen", self.metrics_listen);
  if (!metrics_at.empty()) {
    const HostPort hp = CliArgs({{"metrics-listen", metrics_at}}).host_port("metrics-listen", "");
    http = HttpListener::listen(hp.host, hp.port, [&](const std::string& path) -> HttpResponse {
      if (path == "/healthz") return {200, "text/plain; charset=utf-8", "ok\n"};
      if (path != "/metrics") return {404, "text/plain; charset=utf-8", "not found: try /metrics or /healthz\n"};
      std::string out;
      const auto family = [&](const char* name, const char* type, const char* help) {
        out += cat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
      };
      const std::vector<StageHost::SessionState> states = host.sessions();
      const auto each = [&](const char* name, const auto& value) {
        for (const StageHost::SessionState& s : states)
          out += cat(name, "{party=\"", self.name, "\",session=\"", s.identity, "\"} ", value(s), "\n");
      };
      family("tandem_stage_session_steps", "gauge", "The step each first party's session trains next.");
      each("tandem_stage_session_steps", [](const StageHost::SessionState& s) { return s.steps; });
      family("tandem_stage_session_linked", "gauge", "1 while a connection serves the session.");
      each("tandem_stage_session_linked", [](const StageHost::SessionState& s) { return s.linked ? 1 : 0; });
      family("tandem_stage_session_runs_total", "counter", "Times the first party linked (1 + its restarts).");
      each("tandem_stage_session_runs_total", [](const StageHost::SessionState& s) { return s.runs; });
      family("tandem_stage_session_busy_seconds_total", "counter", "Seconds the session's stage computed.");
      each("tandem_stage_session_busy_seconds_total", [](const StageHost::SessionState& s) { return fixed(s.busy_s, 3); });
      family("tandem_stage_executor_busy_seconds_total", "counter",
             "Seconds each executor ran its sessions' work (one after another).");
      const std::vector<double> busy = host.executor_busy_s();
      for (std::size_t e = 0; e < busy.size(); ++e)
        out += cat("tandem_stage_executor_busy_seconds_total{party=\"", self.name, "\",executor=\"", e, "\"} ",
                   fixed(busy[e], 3), "\n");
      family("tandem_stage_uptime_seconds", "gauge", "Seconds since this party started.");
      out += cat("tandem_stage_uptime_seconds{party=\"", self.name, "\"} ",
                 fixed(std::chrono::duration<double>(Clock::now() - started).count(), 3), "\n");
      return {200, "text/plain; version=0.0.4; charset=utf-8", out};
    });
    std::fprintf(stderr, "metrics for Prometheus on http://%s:%d/metrics\n", hp.host.c_str(), http->port());
  }

  // The transport's events go to the host's queue; the run ends when every first party has
  // ended its run, or fails after silence-s with nothing from any of them (a run over before
  // this process: ends then).
  auto last_heard = Clock::now();
  EndpointEvent ev;
  while (over || !host.all_finished()) {
    if (!endpoint->next(ev, std::chrono::milliseconds(200))) {
      if (Clock::now() - last_heard > std::chrono::seconds(r.silence_s)) {
        if (over) {  // (a Bye still on its way goes out below)
          std::fprintf(stderr, "nobody linked within %d s: the run is over\n", r.silence_s);
          break;
        }
        std::string waiting;
        for (const StageHost::SessionState& s : host.sessions())
          if (!s.finished) waiting += cat(waiting.empty() ? "'" : ", '", s.identity, "'");
        fail("stage", cat("nothing from the first parties within ", r.silence_s, " s; ",
                          waiting.empty() ? cat("none of ", names, " linked") : cat(waiting, " did not finish"),
                          ": are their tandem stages running, and do they reach this party's address?"));
      }
      continue;
    }
    last_heard = Clock::now();
    switch (ev.kind) {
      case EndpointEvent::Kind::Connected:
        host.connected(ev.connection, ev.text);
        break;
      case EndpointEvent::Kind::Message:
        received += ev.frame.size();
        host.received(ev.connection, std::move(ev.frame));
        break;
      case EndpointEvent::Kind::Closed: {
        std::lock_guard lock(send_mu);
        closing.erase(ev.connection);
      }
        host.closed(ev.connection, ev.text);
        break;
      default:
        break;
    }
  }
  // The last Byes out before the endpoint goes (each first party waits for its own), 2 s at most.
  for (const auto deadline = Clock::now() + std::chrono::seconds(2); Clock::now() < deadline;) {
    {
      std::lock_guard lock(send_mu);
      if (closing.empty()) break;
    }
    if (endpoint->next(ev, std::chrono::milliseconds(100)) && ev.kind == EndpointEvent::Kind::Closed) {
      std::lock_guard lock(send_mu);
      closing.erase(ev.connection);
    }
  }

  const double wall = std::chrono::duration<double>(Clock::now() - started).count();
  for (const StageHost::SessionState& s : host.sessions())
    std::printf("{\"party\":\"%s\",\"session\":\"%s\",\"stage\":1,\"steps\":%llu,\"runs\":%llu,\"busy_s\":%s,"
                "\"idle_s\":%s}\n",
                self.name.c_str(), s.identity.c_str(), static_cast<unsigned long long>(s.steps),
                static_cast<unsigned long long>(s.runs), fixed(s.busy_s, 3).c_str(), fixed(s.idle_s, 3).c_str());
  std::string busy;
  for (double b : host.executor_busy_s()) busy += cat(busy.empty() ? "" : ",", fixed(b, 3));
  std::printf("{\"party\":\"%s\",\"stage\":1,\"sessions\":%zu,\"sent_bytes\":%llu,\"received_bytes\":%llu,"
              "\"executors_busy_s\":[%s],\"wall_s\":%s}\n",
              self.name.c_str(), firsts.size(), static_cast<unsigned long long>(sent.load()),
              static_cast<unsigned long long>(received.load()), busy.c_str(), fixed(wall, 3).c_str());
  std::fflush(stdout);
  if (egress) std::fprintf(stderr, "egress log %s: last hash %s\n", egress->path().c_str(), egress->finish("completed").c_str());
  return 0;
}

}  // namespace tandem
