// bench/capacity: N simulated edges against one tandem-cloud, each a thread speaking the real
// protocol over its own TLS WebSocket (ports/tls WssClient, a client certificate each): Hello,
// then, once every edge has its Welcome, steps of K Forwards replaying one recorded
// micro-batch (random activations of the cut's shape: no front is computed here, so what is
// measured is the cloud), each step waiting for its K Backwards. Prints one JSON line: aggregate samples/s, and the p50 and p99
// of a Forward's round trip (sent to its Backward received: the cloud's time from arrival to
// departure, plus the loopback link's). bench/gpu/capacity.sh runs it for N = 1 ... 256.
// usage: bench_capacity HOST PORT IDS_DIR SPEC EDGES [STEPS] [BATCH] [MICROBATCHES]
//   IDS_DIR/I holds edge I's identity (tandem-cloud pki issue --client edge-I --out IDS_DIR/I).
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/model_spec.h"
#include "core/wire/frame.h"
#include "core/wire/messages.h"
#include "ports/tls/wss_client.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

struct Replay {
  std::string host;
  int port = 0;
  std::string ids;
  std::array<uint8_t, 32> hash{};
  std::vector<Tensor> inputs;  // one micro-batch: the cut's activations, and the mask if one crosses
  std::vector<int32_t> labels;
  int64_t batch = 64;
  int microbatches = 4, steps = 20;
};

// The next message from the cloud, verified; an Error or a closed link throws with the reason.
const wire::Message* next_message(WssClient& link, Frame& frame, const std::string& who) {
  EndpointEvent ev;
  for (;;) {
    if (!link.next(ev, std::chrono::seconds(120))) fail("bench", cat(who, ": no message from the cloud in 120 s"));
    if (ev.kind == EndpointEvent::Kind::Closed) fail("bench", cat(who, ": the cloud closed the link (", ev.text, ")"));
    if (ev.kind == EndpointEvent::Kind::Message) break;
  }
  frame = std::move(ev.frame);
  WireError err;
  const wire::Message* m = verify_frame(frame, kDefaultMaxMessageBytes, err);
  if (!m) fail("bench", cat(who, ": ", err.text));
  if (m->payload_type() == wire::Payload::Error)
    fail("bench", cat(who, ": the cloud refused: ", m->payload_as_Error()->text() ? m->payload_as_Error()->text()->str() : ""));
  return m;
}

// Every edge starts its steps once all have their Welcome, so the rate is the steady state's,
// not the handshakes' (`failed`: one never will).
struct StartLine {
  std::atomic<int> welcomed{0}, failed{0};
  void arrive_and_wait(int edges) {
    ++welcomed;
    while (welcomed.load() < edges && failed.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
};

// One edge's run; its round trips (seconds) appended to `trips`.
void run_edge(const Replay& r, int index, int edges, StartLine& start, std::vector<double>& trips) {
  const std::string who = cat("edge-", index), dir = cat(r.ids, "/", index);
  auto link = WssClient::connect(r.host, r.port, {dir + "/client.crt", dir + "/client.key", dir + "/ca.crt"});
  EndpointEvent ev;
  if (!link->next(ev, std::chrono::seconds(60)) || ev.kind != EndpointEvent::Kind::Connected)
    fail("bench", cat(who, ": cannot connect: ", ev.text));
  MessageWriter writer;
  Frame frame;
  link->send(0, writer.hello(who, r.hash));
  if (next_message(*link, frame, who)->payload_type() != wire::Payload::Welcome) fail("bench", who + ": no Welcome");
  start.arrive_and_wait(edges);
  const int64_t rows = r.inputs[0].shape()[0];
  std::vector<Clock::time_point> sent(static_cast<std::size_t>(r.microbatches));
  for (int step = 0; step < r.steps; ++step) {
    for (int mb = 0; mb < r.microbatches; ++mb) {
      sent[static_cast<std::size_t>(mb)] = Clock::now();
      link->send(0, writer.forward(static_cast<uint64_t>(step), static_cast<uint32_t>(mb), static_cast<uint64_t>(step),
                                   r.inputs[0], std::span<const int32_t>(r.labels.data(), static_cast<std::size_t>(rows)),
                                   static_cast<uint32_t>(r.batch), static_cast<uint32_t>(r.microbatches),
                                   wire::DType::F32, 1.0f, false, r.inputs.size() > 1 ? &r.inputs[1] : nullptr));
    }
    for (int got = 0; got < r.microbatches; ++got) {
      const wire::Message* m = next_message(*link, frame, who);
      if (m->payload_type() != wire::Payload::Backward) fail("bench", who + ": expected a Backward");
      const uint32_t mb = m->payload_as_Backward()->microbatch();
      if (mb >= sent.size()) fail("bench", cat(who, ": a Backward for micro-batch ", mb));
      trips.push_back(std::chrono::duration<double>(Clock::now() - sent[mb]).count());
    }
  }
  link->send(0, writer.bye("done"), /*close_after=*/true);
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  const auto at = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(at), v.end());
  return v[at];
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) try {
  using namespace tandem;
  if (argc < 6) {
    std::fprintf(stderr, "usage: bench_capacity HOST PORT IDS_DIR SPEC EDGES [STEPS] [BATCH] [MICROBATCHES]\n");
    return 2;
  }
  Replay r;
  r.host = argv[1];
  r.port = std::atoi(argv[2]);
  r.ids = argv[3];
  const ModelSpec spec = load_model_spec(argv[4]);
  const int edges = std::max(1, std::atoi(argv[5]));
  r.steps = argc > 6 ? std::max(1, std::atoi(argv[6])) : 20;
  r.batch = argc > 7 ? std::max(1, std::atoi(argv[7])) : 64;
  r.microbatches = argc > 8 ? std::max(1, std::atoi(argv[8])) : 4;
  const Graph whole = Graph::build(spec);
  const std::string cut = whole.default_cut();
  r.hash = model_hash(spec, cut);
  const Graph back = whole.split(cut).second;
  const int64_t rows = r.batch / r.microbatches;
  if (rows * r.microbatches != r.batch) fail("bench", "BATCH must be a multiple of MICROBATCHES");
  Rng rng(11);
  r.inputs = bench::back_shard_inputs(back, rows, rng);
  r.labels = bench::random_labels(rows, back.classes(), rng);

  std::vector<std::vector<double>> trips(static_cast<std::size_t>(edges));
  std::vector<std::string> errors(static_cast<std::size_t>(edges));
  std::vector<std::thread> threads;
  StartLine start;
  for (int i = 0; i < edges; ++i)
    threads.emplace_back([&, i] {
      try {
        run_edge(r, i, edges, start, trips[static_cast<std::size_t>(i)]);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(i)] = e.what();
        ++start.failed;
      }
    });
  while (start.welcomed.load() < edges && start.failed.load() == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto t0 = Clock::now();
  for (auto& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  for (const std::string& e : errors)
    if (!e.empty()) fail("bench", e);
  std::vector<double> all;
  for (const auto& t : trips) all.insert(all.end(), t.begin(), t.end());
  std::printf("{\"bench\":\"capacity\",\"model\":\"%s\",\"edges\":%d,\"steps\":%d,\"batch\":%lld,\"microbatches\":%d,"
              "\"samples_per_s\":%.1f,\"p50_ms\":%.2f,\"p99_ms\":%.2f}\n",
              spec.name.c_str(), edges, r.steps, static_cast<long long>(r.batch), r.microbatches,
              static_cast<double>(edges) * r.steps * static_cast<double>(r.batch) / seconds,
              quantile(all, 0.5) * 1e3, quantile(all, 0.99) * 1e3);
  return 0;
} catch (const tandem::Error& e) {
  std::fprintf(stderr, "bench_capacity: %s\n", e.what());
  return 1;
}
