// The demo page: picks the bundled Fashion-MNIST subset or local image files, trains through
// TandemEdge against the cloud that serves this page, and charts loss and accuracy live.
// window.tandemDemo holds the run's events (the browser test reads them).
"use strict";

const CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"];
const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const chart = new LossChart($("chart"));
const local = { pixels: [], labels: [] };  // images added from files, 28x28 grey each
window.tandemDemo = { events: [], state: "idle" };

$("url").value = params.get("cloud") || `wss://${location.host}/`;
$("token").value = params.get("token") || "";
$("client").value = params.get("client") || "browser";
if (params.get("steps")) $("steps").value = params.get("steps");
if (params.get("frontUpdates")) $("frontUpdates").value = params.get("frontUpdates");
if (params.get("pipeline")) $("pipeline").value = params.get("pipeline");
if (params.get("model")) $("model").value = params.get("model");
for (const id of ["lr", "batch"]) if (params.get(id)) $(id).value = params.get(id);
for (const id of ["dpClip", "dpNoise", "nopeek"]) if (params.get(id)) $(id).value = params.get(id);
CLASSES.forEach((name, i) => $("fileLabel").add(new Option(`${i} ${name}`, i)));

function status(text, isError = false) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

async function fetchBytes(name) {
  const r = await fetch(name);
  if (!r.ok) throw new Error(`cannot fetch ${name}: HTTP ${r.status}`);
  return new Uint8Array(await r.arrayBuffer());
}

// An image file as 28x28 grey pixels: scaled to fit, centred, optionally inverted so the
// object is light on dark like Fashion-MNIST.
async function toPixels(file, invert) {
  const bitmap = await createImageBitmap(file);
  const canvas = document.createElement("canvas");
  canvas.width = canvas.height = 28;
  const c = canvas.getContext("2d");
  c.fillStyle = invert ? "#fff" : "#000";
  c.fillRect(0, 0, 28, 28);
  const scale = Math.min(28 / bitmap.width, 28 / bitmap.height);
  const w = bitmap.width * scale, h = bitmap.height * scale;
  c.drawImage(bitmap, (28 - w) / 2, (28 - h) / 2, w, h);
  const rgba = c.getImageData(0, 0, 28, 28).data;
  const out = new Uint8Array(784);
  for (let i = 0; i < 784; ++i) {
    const grey = 0.299 * rgba[4 * i] + 0.587 * rgba[4 * i + 1] + 0.114 * rgba[4 * i + 2];
    out[i] = invert ? 255 - grey : grey;
  }
  return out;
}

$("addFiles").addEventListener("click", async () => {
  const label = Number($("fileLabel").value);
  for (const file of $("files").files) {
    local.pixels.push(await toPixels(file, $("invert").checked));
    local.labels.push(label);
  }
  $("fileCount").textContent = `${local.labels.length} images added`;
  document.querySelector("input[value=files]").checked = true;
});

function onEvent(event) {
  window.tandemDemo.events.push(event);
  if (event.event === "step") {
    chart.addLoss(event.step, event.loss);
    const privacy = (event.dp_epsilon !== undefined ? `, epsilon ${event.dp_epsilon === null ? "unbounded" : event.dp_epsilon.toFixed(3)}` : "") +
      (event.dcor !== undefined ? `, distance correlation ${event.dcor.toFixed(3)}` : "");
    status(`step ${event.step} of ${event.steps}: loss ${event.loss.toFixed(4)}, ${event.samples_per_s.toFixed(1)} samples/s${privacy}`);
  } else if (event.event === "evaluated") {
    chart.addAccuracy(chart.loss.length ? chart.loss[chart.loss.length - 1][0] : 0, event.accuracy);
  } else if (event.event === "welcome") {
    const rounds = event.aggregate_every ? `; a federation averaging fronts every ${event.aggregate_every} steps` : "";
    status(`connected; the cloud sends gradients as ${event.dtype}${rounds}`);
  } else if (event.event === "round") {
    status(`round ${event.round}: took the federation's average at step ${event.step}`);
  } else if (event.event === "done") {
    const acc = event.test_accuracy !== undefined ? `, test accuracy ${(100 * event.test_accuracy).toFixed(1)}%` : "";
    status(`done: ${event.steps} steps, loss ${event.first_loss.toFixed(4)} -> ${event.last_loss.toFixed(4)}${acc}`);
  } else if (event.event === "retry") {
    status(`${event.text}; trying again in ${event.wait_s.toFixed(1)} s (retry ${event.attempt} of ${event.of})`);
  } else if (event.event === "reconnect") {
    status(`${event.text}; reconnecting in ${event.wait_s.toFixed(1)} s (attempt ${event.attempt} of ${event.of}),` +
           ` going on from step ${event.step} (${event.steps_redone} steps to train again)`);
  } else if (event.event === "error") {
    status(`stopped: ${event.text}`, true);
  }
  $("metrics").textContent = JSON.stringify(event);
}

$("train").addEventListener("click", async () => {
  $("train").disabled = true;
  chart.reset();
  window.tandemDemo.events = [];
  window.tandemDemo.state = "running";
  try {
    status("loading the model and data...");
    // The model's binary spec (wasm/build.sh packs each model the page offers); the cloud
    // refuses a front whose model differs from the one it serves.
    const spec = await fetchBytes(`${$("model").value}.tdms`);
    const edge = await TandemEdge.create({
      spec, clientId: $("client").value, token: $("token").value.trim(), steps: Number($("steps").value),
      batch: Number($("batch").value), microbatches: Number($("microbatches").value), lr: Number($("lr").value),
      wireDtype: $("dtype").value, frontUpdates: $("frontUpdates").value, pipeline: $("pipeline").value, onEvent,
      privacy: { dpClip: Number($("dpClip").value), dpNoise: Number($("dpNoise").value), nopeek: Number($("nopeek").value) },
    });
    if (document.querySelector("input[name=source]:checked").value === "files") {
      if (!local.labels.length) throw new Error("add some image files first");
      const pixels = new Uint8Array(784 * local.labels.length);
      local.pixels.forEach((p, i) => pixels.set(p, 784 * i));
      edge.setTrainingData(pixels, local.labels);
    } else {
      edge.setTrainingData(await fetchBytes("train-images.u8"), await fetchBytes("train-labels.u8"));
      edge.setTestData(await fetchBytes("test-images.u8"), await fetchBytes("test-labels.u8"));
    }
    status("connecting...");
    lastEdge = edge;
    await edge.train($("url").value);
    window.tandemDemo.state = "done";
  } catch (e) {
    status(`stopped: ${e.message}`, true);
    window.tandemDemo.state = "failed";
    window.tandemDemo.error = e.message;
  } finally {
    $("train").disabled = false;
    offerEgressLog();
  }
});

// What left this page, for the user to keep: the edge's egress log as a download.
let lastEdge = null;
function offerEgressLog() {
  if (!lastEdge) return;
  const log = lastEdge.egressLog();
  window.tandemDemo.egressLog = log;
  const link = $("egress");
  if (link.href) URL.revokeObjectURL(link.href);
  link.href = URL.createObjectURL(new Blob([log], { type: "application/x-ndjson" }));
  link.hidden = false;
}
