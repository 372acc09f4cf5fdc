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
EMSCRIPTEN_KEEPALIVE int tandem_create(const uint8_t* spec, int spec_len, const char* cut, const char* client_id,
                                       const char* token, int batch, int microbatches, int steps, float lr,
                                       float momentum, int seed, const char* wire_dtype, int eval_samples,
                                       const char* front_updates, const char* pipeline) {
  return guarded([&] {
    Page& p = page();
    ++p.run;  // a retry's timer of the run before does nothing
    p.retry_pending = false;
    p.socket.reset();
    p.edge.reset();
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
    const ModelSpec model = parse_model_binary(spec, static_cast<std::size_t>(spec_len));
    // A page's log goes on across its runs, one chain.
    const std::string prev = p.audit ? p.audit->last_hash() : EgressAudit::genesis();
    p.audit = std::make_unique<EgressAudit>([](const std::string& line) { page().egress_log += line + "\n"; }, prev);
    c.audit = p.audit.get();
    p.edge = std::make_unique<EventEdge>(
        model, c, [](std::span<const uint8_t> bytes) { page().socket->send(bytes); },
        [](const EdgeEvent& e) {
          if (e.kind == EdgeEvent::Kind::Done || e.kind == EdgeEvent::Kind::Error)
            page().audit->finish(e.kind == EdgeEvent::Kind::Done ? "done" : "failed");
          emit_to_page(e.json().c_str());
        });
  });
}

// test: 0 training images, 1 test images; pixels [n][h][w] 8-bit grey.
EMSCRIPTEN_KEEPALIVE int tandem_set_data(int test, const uint8_t* pixels, const int32_t* labels, int n, int h, int w) {
  return guarded([&] {
    if (!page().edge) fail("edge", "tandem_create first");
    page().edge->set_data(test != 0, pixels, labels, n, h, w);
  });
}

// (Re)connects the page's run to its cloud.
void connect_to_cloud();

// The page's link closed: a Busy refusal with retries left connects again later (a "retry"
// event says when); anything else ends the run.
void on_link_closed(const std::string& why) {
  Page& p = page();
  const std::string busy = p.edge->busy();
  if (p.stopped) return p.edge->stop("stopped by the page");
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
  // Later, from the page's event loop: never from inside the closing socket's own callback.
  p.retry_pending = true;
  emscripten_async_call([](void* run) {
    Page& p = page();
    if (reinterpret_cast<uintptr_t>(run) != p.run || !p.retry_pending) return;  // stopped, or another run since
    p.retry_pending = false;
    try {
      connect_to_cloud();
    } catch (const std::exception& e) {
      p.edge->stop(e.what());
    }
  }, reinterpret_cast<void*>(p.run), static_cast<int>(retry.seconds * 1000.0));
}

void connect_to_cloud() {
  BrowserSocket::Handlers h;
  h.opened = [] { page().edge->on_open(); };
  h.message = [](Frame frame) {
    if (!page().edge->on_message(frame))
      page().socket->close(page().edge->failed() ? "edge failed" : !page().edge->busy().empty() ? "busy" : "done");
  };
  h.closed = on_link_closed;
  page().socket = std::make_unique<BrowserSocket>(page().url, std::move(h), kDefaultMaxMessageBytes);
}

// url: wss://HOST:PORT/ of tandem-cloud serve --accept-tokens (or --web); connect_retries:
// how often to connect again after a Busy refusal (0: never).
EMSCRIPTEN_KEEPALIVE int tandem_start(const char* url, int connect_retries) {
  return guarded([&] {
    Page& p = page();
    if (!p.edge) fail("edge", "tandem_create first");
    if (connect_retries < 0) fail("edge", "connectRetries must be 0 or more");
    if (p.retry_pending || (p.socket && !p.socket->closed()))
      fail("edge", "a run is going on: stop it first (or wait for its done or error event)");
    ++p.run;
    p.url = url;
    p.connect_retries = connect_retries;
    p.retries_done = 0;
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
