// The browser edge's C API for JavaScript (wasm/web/tandem.js wraps it): one edge per page,
// an EventEdge fed by the browser's WebSocket; events go to Module.onEvent as objects.
#include <emscripten/emscripten.h>

#include <cstdint>
#include <memory>
#include <string>

#include "core/error.h"
#include "core/model_spec.h"
#include "core/wire/egress_audit.h"
#include "core/wire/tensor_codec.h"
#include "edge/session/event_edge.h"
#include "edge/session/in_memory_checkpoints.h"
#include "ports/browser/browser_socket.h"

namespace {

using namespace tandem;

EM_JS(void, emit_to_page, (const char* json), {
  if (Module.onEvent) Module.onEvent(JSON.parse(UTF8ToString(json)));
});

struct Page {
  std::unique_ptr<EventEdge> edge;
  std::unique_ptr<BrowserSocket> socket;
  std::string error;
  // The egress log (core/wire/egress_audit.h), kept in memory for the page to offer for
  // download: every message is on it before it leaves, the run's summary when it ends.
  std::string egress_log;
  std::unique_ptr<EgressAudit> audit;
  EdgePrivacy privacy;  // for the next tandem_create (tandem_set_privacy); none by default
  // A cloud at its bound answers Busy before any Hello is read: the page connects again
  // after busy_backoff_s, at most `connect_retries` times, as tandem-edge does.
  std::string url;
  int connect_retries = 8, retries_done = 0;
  bool stopped = false;
  bool retry_pending = false;  // a retry's timer is set (the link is closed until it fires)
  uintptr_t run = 0;           // bumped by create, start and stop: a timer of an older run does nothing
  // A link lost mid-run: the page connects again after busy_backoff_s, up to `reconnects`
  // times in a row without progress, and the run goes on from its newest checkpoint (kept in
  // memory; the cloud keeps its own of the same step) with the fresh token the cloud's
  // Welcome gave (the page's own is spent), its driver made again from what tandem_create and
  // tandem_set_data were given.
  ModelSpec spec;
  EventEdgeConfig config;
  int64_t steps = 0;  // the run's (config.steps counts a driver's own)
  std::unique_ptr<InMemoryEdgeCheckpoints> checkpoints;
  struct Given {
    std::vector<uint8_t> pixels;
    std::vector<int32_t> labels;
    int64_t n = 0, h = 0, w = 0;
  } data[2];
  int reconnects = 10, drops_in_a_row = 0;
  uint64_t step_at_reconnect = 0;
  bool connected = false;  // this run's link opened once (a cloud unreachable at the start ends it)
};

Page& page() {
  static Page p;
  return p;
}

// Runs f; an Error becomes tandem_last_error() and -1.
template <typename F>
int guarded(F&& f) {
  try {
    f();
    page().error.clear();
    return 0;
  } catch (const std::exception& e) {
    page().error = e.what();
    return -1;
  }
}

// The run's driver from the page's settings, resuming from the newest checkpoint in memory.
void make_edge() {
  Page& p = page();
  if (p.edge && !p.edge->session().next_token().empty()) p.config.token = p.edge->session().next_token();
  p.edge.reset();
  EventEdgeConfig c = p.config;
  c.checkpoints = p.checkpoints.get();
  c.audit = p.audit.get();
  if (p.steps > 0) c.steps = std::max<int64_t>(1, p.steps - static_cast<int64_t>(p.checkpoints->step()));
  p.edge = std::make_unique<EventEdge>(
      p.spec, c, [](std::span<const uint8_t> bytes) { page().socket->send(bytes); },
      [](const EdgeEvent& e) {
        if (e.kind == EdgeEvent::Kind::Done || e.kind == EdgeEvent::Kind::Error)
          page().audit->finish(e.kind == EdgeEvent::Kind::Done ? "done" : "failed");
        emit_to_page(e.json().c_str());
      });
  for (int test = 0; test < 2; ++test)
    if (const Page::Given& d = p.data[test]; d.n > 0)
      p.edge->set_data(test != 0, d.pixels.data(), d.labels.data(), d.n, d.h, d.w);
}

}  // namespace

extern "C" {

EMSCRIPTEN_KEEPALIVE const char* tandem_last_error() { return page().error.c_str(); }

// Privacy for the runs tandem_create makes from now on (EdgePrivacy: as
// tandem-edge's --dp-clip, --dp-noise, --dp-delta, --dp-epsilon-budget, --dp-eval, --nopeek,
// and for a U-shaped cut --grad-clip, --grad-noise and --label-noise): dp_clip 0 turns noise
// on the cut off, nopeek 0 the penalty, grad_clip and label_noise 0 the labels' noise.
EMSCRIPTEN_KEEPALIVE int tandem_set_privacy(float dp_clip, float dp_noise, double dp_delta, double dp_epsilon_budget,
                                            int noise_evaluation, float nopeek, float grad_clip, float grad_noise,
                                            float label_noise) {
  return guarded([&] {
    EdgePrivacy privacy;
    privacy.dp_clip = dp_clip;
    privacy.dp_noise = dp_noise;
    privacy.dp_delta = dp_delta;
    privacy.dp_epsilon_budget = dp_epsilon_budget;
    privacy.dp_noise_evaluation = noise_evaluation != 0;
    privacy.nopeek = nopeek;
    privacy.grad_clip = grad_clip;
    privacy.grad_noise = grad_noise;
    privacy.label_noise = label_noise;
    if (const std::string why = privacy.problem(); !why.empty()) fail("edge", cat("privacy: ", why));
    page().privacy = privacy;
  });
}

// spec: the binary model spec (tandem pack-spec). wire_dtype: f32, f16, bf16 or i8.
// front_updates (in a federation): step or round. pipeline: sync or async (tandem-edge's
// --pipeline: the next step's forwards before this one's gradients are in).
// checkpoint_every: the front's checkpoint, in memory, every this many steps and at each
// epoch's end (the cloud saves its own of the same steps), which a run goes on from after a
// lost link; 0: at epochs' ends only.
EMSCRIPTEN_KEEPALIVE int tandem_create(const uint8_t* spec, int spec_len, const char* cut, const char* client_id,
                                       const char* token, int batch, int microbatches, int steps, float lr,
                                       float momentum, int seed, const char* wire_dtype, int eval_samples,
                                       const char* front_updates, const char* pipeline, int checkpoint_every) {
  return guarded([&] {
    Page& p = page();
    ++p.run;  // a retry's timer of the run before does nothing
    p.retry_pending = false;
    p.socket.reset();
    p.edge.reset();
    p.data[0] = p.data[1] = Page::Given{};
    EventEdgeConfig c;
    c.cut = cut;
    c.client_id = client_id;
    c.token = token;
    c.batch = static_cast<uint32_t>(batch);
    c.microbatches = static_cast<uint32_t>(microbatches);
    c.steps = steps;
    c.optimizer.lr = lr;
    c.optimizer.momentum = momentum;
    c.seed = static_cast<uint64_t>(seed);
    c.eval_samples = eval_samples;
    c.privacy = p.privacy;
    const std::string updates = front_updates;
    if (updates != "step" && updates != "round")
      fail("edge", cat("unknown front updates '", updates, "' (known: step, round)"));
    c.front_updates_per_round = updates == "round";
    const std::string schedule = pipeline;
    if (schedule != "sync" && schedule != "async")
      fail("edge", cat("unknown pipeline '", schedule, "' (known: sync, async)"));
    c.async = schedule == "async";
    const auto dtype = parse_dtype(wire_dtype);
    if (!dtype) fail("edge", cat("unknown wire dtype '", wire_dtype, "' (known: f32, f16, bf16, i8)"));
    c.dtypes = {*dtype};
    if (*dtype != wire::DType::F32) c.dtypes.push_back(wire::DType::F32);
    p.spec = parse_model_binary(spec, static_cast<std::size_t>(spec_len));
    // A page's log goes on across its runs, one chain.
    const std::string prev = p.audit ? p.audit->last_hash() : EgressAudit::genesis();
    p.audit = std::make_unique<EgressAudit>([](const std::string& line) { page().egress_log += line + "\n"; }, prev);
    p.checkpoints = std::make_unique<InMemoryEdgeCheckpoints>(checkpoint_every);
    p.config = c;
    p.steps = steps;
    make_edge();
  });
}

// test: 0 training images, 1 test images; pixels [n][h][w] 8-bit grey.
EMSCRIPTEN_KEEPALIVE int tandem_set_data(int test, const uint8_t* pixels, const int32_t* labels, int n, int h, int w) {
  return guarded([&] {
    if (!page().edge) fail("edge", "tandem_create first");
    page().edge->set_data(test != 0, pixels, labels, n, h, w);  // checks them
    Page::Given& d = page().data[test != 0];  // kept, for a driver made again after a lost link
    d.pixels.assign(pixels, pixels + static_cast<int64_t>(n) * h * w);
    d.labels.assign(labels, labels + n);
    d.n = n, d.h = h, d.w = w;
  });
}

// (Re)connects the page's run to its cloud.
void connect_to_cloud();

// Later, from the page's event loop (never from inside the closing socket's own callback):
// connects again, after making the run's driver again first when `again`.
void connect_later(double seconds, bool again) {
  Page& p = page();
  p.retry_pending = true;
  emscripten_async_call([](void* arg) {
    Page& p = page();
    const uintptr_t tag = reinterpret_cast<uintptr_t>(arg);
    if ((tag >> 1) != p.run || !p.retry_pending) return;  // stopped, or another run since
    p.retry_pending = false;
    try {
      if (tag & 1) make_edge();
      connect_to_cloud();
    } catch (const std::exception& e) {
      p.edge->stop(e.what());
    }
  }, reinterpret_cast<void*>((p.run << 1) | (again ? 1 : 0)), static_cast<int>(seconds * 1000.0));
}

// A link lost mid-run (not a refusal: the cloud's Errors fail the run before the close): with
// a checkpoint to go on from (or nothing trained yet) and reconnects left, a "reconnect"
// event says when the page connects again; true when one is due.
bool reconnect_after(const std::string& why) {
  Page& p = page();
  if (!p.connected || p.edge->finished()) return false;
  const uint64_t reached = p.edge->position().step;
  if (reached > p.step_at_reconnect) p.drops_in_a_row = 0;
  if (p.edge->steps_done() > 0 && p.checkpoints->empty()) return false;
  if (p.drops_in_a_row >= p.reconnects) return false;
  const bool again = p.edge->said_hello();
  EdgeEvent e;
  e.kind = EdgeEvent::Kind::Reconnect;
  e.attempt = ++p.drops_in_a_row;
  e.attempts = p.reconnects;
  e.seconds = busy_backoff_s(e.attempt);
  e.step = again ? p.checkpoints->step() : reached;
  e.steps_done = static_cast<int64_t>(reached - std::min(reached, e.step));
  e.text = why;
  if (again) p.step_at_reconnect = e.step;
  emit_to_page(e.json().c_str());
  connect_later(e.seconds, again);
  return true;
}

// The page's link closed: a Busy refusal with retries left connects again later (a "retry"
// event says when), a lost link too (a "reconnect" event); anything else ends the run.
void on_link_closed(const std::string& why) {
  Page& p = page();
  const std::string busy = p.edge->busy();
  if (p.stopped) return p.edge->stop("stopped by the page");
  if (busy.empty() && reconnect_after(why)) return;
  if (busy.empty() || p.edge->finished() || p.retries_done >= p.connect_retries) {
    p.edge->on_closed(why);
    return;
  }
  EdgeEvent retry;
  retry.kind = EdgeEvent::Kind::Retry;
  retry.attempt = ++p.retries_done;
  retry.attempts = p.connect_retries;
  retry.seconds = busy_backoff_s(retry.attempt);
  retry.text = busy;
  emit_to_page(retry.json().c_str());
  connect_later(retry.seconds, /*again=*/false);
}

void connect_to_cloud() {
  BrowserSocket::Handlers h;
  h.opened = [] {
    page().connected = true;
    page().edge->on_open();
  };
  h.message = [](Frame frame) {
    if (!page().edge->on_message(frame))
      page().socket->close(page().edge->failed() ? "edge failed" : !page().edge->busy().empty() ? "busy" : "done");
  };
  h.closed = on_link_closed;
  page().socket = std::make_unique<BrowserSocket>(page().url, std::move(h), kDefaultMaxMessageBytes);
}

// url: wss://HOST:PORT/ of tandem-cloud serve --accept-tokens (or --web); connect_retries:
// how often to connect again after a Busy refusal (0: never); reconnects: how often in a row,
// without progress, after a lost link (0: never).
EMSCRIPTEN_KEEPALIVE int tandem_start(const char* url, int connect_retries, int reconnects) {
  return guarded([&] {
    Page& p = page();
    if (!p.edge) fail("edge", "tandem_create first");
    if (connect_retries < 0) fail("edge", "connectRetries must be 0 or more");
    if (reconnects < 0) fail("edge", "reconnects must be 0 or more");
    if (p.retry_pending || (p.socket && !p.socket->closed()))
      fail("edge", "a run is going on: stop it first (or wait for its done or error event)");
    ++p.run;
    p.url = url;
    p.connect_retries = connect_retries;
    p.retries_done = 0;
    p.reconnects = reconnects;
    p.drops_in_a_row = 0;
    p.step_at_reconnect = p.edge->position().step;
    p.connected = false;
    p.stopped = false;
    connect_to_cloud();
  });
}

// The page's egress log so far: JSON lines, `tandem audit verify` checks a download of it.
EMSCRIPTEN_KEEPALIVE const char* tandem_egress_log() { return page().egress_log.c_str(); }

EMSCRIPTEN_KEEPALIVE void tandem_stop() {
  Page& p = page();
  p.stopped = true;
  ++p.run;  // a retry's timer does nothing now
  if (p.retry_pending) {  // no link to close: the run ends here
    p.retry_pending = false;
    if (p.edge) p.edge->stop("stopped by the page");
    return;
  }
  if (p.socket) p.socket->close("stopped by the page");
}

}  // extern "C"
