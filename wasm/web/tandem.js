// tandem's browser edge as a small JavaScript API over the WebAssembly module
// (tandem_edge.js): load a model spec and cut, give it images, connect to the cloud over wss
// with an enrolment token, train, and follow progress and metrics as events.
"use strict";

class TandemEdge {
  // options: spec (Uint8Array, the binary model spec from `tandem pack-spec`), cut ("" for the
  // spec's own), clientId, token, batch, microbatches, steps, lr, momentum, seed, wireDtype
  // ("f32", "f16", "bf16", "i8"), evalSamples (0: all test images), frontUpdates ("step" or
  // "round": in a split-federated cloud, the front updated every step or once a round),
  // pipeline ("sync", or "async": the next step's forwards before this one's gradients are in,
  // as tandem-edge's --pipeline async),
  // privacy ({ dpClip, dpNoise, dpDelta, dpEpsilonBudget, dpEval: "noised" or "clean",
  // nopeek, and with a U-shaped cut ("A,B": the labels stay in the page) gradClip, gradNoise,
  // labelNoise }, as tandem-edge's --dp-*, --nopeek, --grad-* and --label-noise; absent:
  // none), connectRetries (default 8: how often to connect again, after 1, 2, 4 ... up to 30 s,
  // when the cloud is at its bound and answers Busy; 0: never), checkpointEvery (default 10:
  // the front's checkpoint, kept in memory, every this many steps; the cloud keeps its own of
  // the same steps), reconnects (default 10: after a lost link, how often in a row without
  // progress to connect again, after the same backoff, going on from the newest checkpoint;
  // 0: never), onEvent(event). Events: connected, welcome, step (with dp_epsilon and dcor when
  // on), round, evaluated, done, error, retry (attempt, of, wait_s, text: the cloud's
  // refusal), reconnect (attempt, of, wait_s, step: the checkpoint's, steps_redone, text: the
  // link's words).
  static async create(options) {
    const edge = new TandemEdge(options.onEvent || (() => {}));
    edge.connectRetries = options.connectRetries ?? 8;
    edge.reconnects = options.reconnects ?? 10;
    edge.module = await createTandemModule({
      onEvent: (event) => edge.dispatch(event),
      print: (text) => console.log(text),
      printErr: (text) => console.warn(text),
    });
    const m = edge.module;
    const privacy = options.privacy || {};
    edge.check(m.ccall("tandem_set_privacy", "number",
      ["number", "number", "number", "number", "number", "number", "number", "number", "number"],
      [privacy.dpClip || 0, privacy.dpNoise || 0, privacy.dpDelta || 1e-5, privacy.dpEpsilonBudget || 0,
       privacy.dpEval === "clean" ? 0 : 1, privacy.nopeek || 0, privacy.gradClip || 0, privacy.gradNoise || 0,
       privacy.labelNoise || 0]));
    const spec = edge.copyIn(options.spec, 1);
    const rc = m.ccall("tandem_create", "number",
      ["number", "number", "string", "string", "string", "number", "number", "number", "number", "number", "number", "string", "number",
       "string", "string", "number"],
      [spec, options.spec.length, options.cut || "", options.clientId || "browser", options.token || "",
       options.batch || 32, options.microbatches || 4, options.steps || 50, options.lr ?? 0.05, options.momentum ?? 0.9,
       options.seed || 1, options.wireDtype || "f32", options.evalSamples || 0, options.frontUpdates || "step",
       options.pipeline || "sync", options.checkpointEvery ?? 10]);
    m._free(spec);
    edge.check(rc);
    return edge;
  }

  constructor(onEvent) {
    this.onEvent = onEvent;
    this.finished = null;
  }

  // pixels: Uint8Array of n images of h x w 8-bit grey values; labels: n class indices.
  setTrainingData(pixels, labels, h = 28, w = 28) { this.setData(0, pixels, labels, h, w); }
  setTestData(pixels, labels, h = 28, w = 28) { this.setData(1, pixels, labels, h, w); }

  // Connects to url (wss://HOST:PORT/) and trains; resolves with the "done" event, rejects
  // with the cloud's or the link's reason.
  train(url) {
    const done = new Promise((resolve, reject) => { this.finished = { resolve, reject }; });
    this.check(this.module.ccall("tandem_start", "number", ["string", "number", "number"],
      [url, this.connectRetries, this.reconnects]));
    return done;
  }

  stop() { this.module._tandem_stop(); }

  // The egress log: a hash-chained JSON line for every message this edge sent, and each
  // run's summary (`tandem audit verify` checks it).
  egressLog() { return this.module.UTF8ToString(this.module._tandem_egress_log()); }

  setData(test, pixels, labels, h, w) {
    const n = labels.length;
    if (pixels.length !== n * h * w) throw new Error(`${pixels.length} pixels for ${n} images of ${h}x${w}`);
    const p = this.copyIn(pixels, 1);
    const l = this.copyIn(Int32Array.from(labels), 4);
    const rc = this.module._tandem_set_data(test, p, l, n, h, w);
    this.module._free(p);
    this.module._free(l);
    this.check(rc);
  }

  copyIn(array, bytesPerItem) {
    const ptr = this.module._malloc(Math.max(1, array.length * bytesPerItem));
    if (bytesPerItem === 4) this.module.HEAP32.set(array, ptr >> 2);
    else this.module.HEAPU8.set(array, ptr);
    return ptr;
  }

  check(rc) {
    if (rc !== 0) throw new Error(this.module.UTF8ToString(this.module._tandem_last_error()));
  }

  dispatch(event) {
    this.onEvent(event);
    if (!this.finished) return;
    if (event.event === "done") this.finished.resolve(event);
    if (event.event === "error") this.finished.reject(new Error(event.text));
  }
}
