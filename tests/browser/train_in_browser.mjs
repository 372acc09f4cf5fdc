// Drives the browser edge's page in Debian's headless Chromium (playwright-core): the page
// trains against a local tandem-cloud over wss with an enrolment token; the loss must fall,
// the chart must show it (screenshot), and a replayed or forged token must be refused.
// Then the page trains on local image files (PNGs picked through its file input, two classes),
// and, given a split-federated cloud's page and token, takes part in its rounds.
// Usage: node train_in_browser.mjs PAGE_URL TOKEN OTHER_TOKEN FILES_TOKEN SCREENSHOT STEPS WEB_DIR
//          [FEDERATED_PAGE_URL FEDERATED_TOKEN EGRESS_LOG [VIT_PAGE_URL VIT_TOKEN]]
// Given a cloud serving samples/fashion-vit, the page also trains the vision transformer's
// front (patches, [CLS], layer 0) and its loss must fall. Given a busy cloud's page, a token
// for it and a file to create once the page has been refused, the page retries and trains.
// Given a cloud's page and token (HEAL_URL HEAL_TOKEN) that the shell script kills once it has
// a checkpoint of the page's run and starts again on the same port, the page reconnects with
// the token that cloud's Welcome gave it, goes on from its checkpoint in memory and finishes.
import { readFileSync, writeFileSync } from "node:fs";
import { crc32, deflateSync } from "node:zlib";
import { chromium } from "playwright-core";

const [pageUrl, token, otherToken, filesToken, screenshot, stepsText, webDir, fedUrl, fedToken, egressPath, vitUrl, vitToken,
       asyncToken, busyUrl, busyToken, releasePath, healUrl, healToken] =
  process.argv.slice(2);
const steps = Number(stepsText || 50);
// An 8-bit grey PNG of w x h pixels.
function png(pixels, w, h) {
  const chunk = (type, data) => {
    const body = Buffer.concat([Buffer.from(type), data]);
    const out = Buffer.alloc(12 + data.length);
    out.writeUInt32BE(data.length, 0);
    body.copy(out, 4);
    out.writeUInt32BE(crc32(body) >>> 0, 8 + data.length);
    return out;
  };
  const header = Buffer.alloc(13);
  header.writeUInt32BE(w, 0);
  header.writeUInt32BE(h, 4);
  header[8] = 8;  // bit depth; colour type 0 (grey)
  const rows = Buffer.alloc(h * (w + 1));
  for (let y = 0; y < h; ++y) Buffer.from(pixels.subarray(y * w, (y + 1) * w)).copy(rows, y * (w + 1) + 1);
  return Buffer.concat([Buffer.from([137, 80, 78, 71, 13, 10, 26, 10]), chunk("IHDR", header),
                        chunk("IDAT", deflateSync(rows)), chunk("IEND", Buffer.alloc(0))]);
}

const fail = (text) => {
  console.error(`FAIL: ${text}`);
  process.exitCode = 1;
};

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--ignore-certificate-errors"],
});
try {
  const context = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1000, height: 820 } });
  const page = await context.newPage();
  page.on("console", (m) => { if (m.type() === "error") console.error(`page: ${m.text()}`); });
  page.on("pageerror", (e) => console.error(`page error: ${e.message}`));
  page.on("response", (r) => { if (r.status() >= 400) console.error(`page: HTTP ${r.status()} for ${r.url()}`); });

  // Trains from the page at `url` (its query sets the run); returns the page's record of it.
  const trainAt = async (url, timeout = 120000) => {
    await page.goto(url);
    await page.click("#train");
    await page.waitForFunction(() => ["done", "failed"].includes(window.tandemDemo.state), null, { timeout, polling: 250 });
    return page.evaluate(() => ({ ...window.tandemDemo, status: document.getElementById("status").textContent }));
  };
  // Runs one training from the page with `tokenText`; returns the page's record of it.
  const run = (tokenText, client) =>
    trainAt(`${pageUrl}?token=${encodeURIComponent(tokenText)}&client=${client}&steps=${steps}`, 300000);

  // First (the probe holds the busy cloud's one connection from just before this program):
  // a cloud at its bound answers Busy, the page emits a "retry" event, and once the held
  // connection is released it trains 5 steps there.
  if (busyUrl) {
    await page.goto(`${busyUrl}?token=${encodeURIComponent(busyToken)}&client=page-busy&steps=5`);
    await page.click("#train");
    await page.waitForFunction(() => window.tandemDemo.events.some((e) => e.event === "retry") ||
                                      ["done", "failed"].includes(window.tandemDemo.state), null, { timeout: 60000, polling: 100 });
    writeFileSync(releasePath, "");
    await page.waitForFunction(() => ["done", "failed"].includes(window.tandemDemo.state), null, { timeout: 120000, polling: 250 });
    const busy = await page.evaluate(() => ({ ...window.tandemDemo, status: document.getElementById("status").textContent }));
    const retries = busy.events.filter((e) => e.event === "retry");
    if (busy.state !== "done" || retries.length < 1)
      fail(`the page against a busy cloud: ${busy.status} (${retries.length} retries)`);
    else if (!/at most 1 connections at once/.test(retries[0].text) || retries[0].attempt !== 1 || retries[0].of !== 8)
      fail(`the page's retry event: ${JSON.stringify(retries[0])}`);
    else console.log(`busy cloud: the page was refused (${retries[0].text}), retried ${retries.length} time(s), then ${busy.status}`);
  }
  // A cloud killed mid-run and started again: the page reconnects and finishes its 40 steps.
  if (healUrl) {
    const healed = await trainAt(`${healUrl}?token=${encodeURIComponent(healToken)}&client=page-heal&steps=40`, 180000);
    const reconnects = healed.events.filter((e) => e.event === "reconnect");
    // A step event counts its driver's steps: the last one made again started at the checkpoint.
    const lastStep = healed.events.filter((e) => e.event === "step").pop();
    const from = reconnects.length ? reconnects[reconnects.length - 1].step : 0;
    if (healed.state !== "done" || reconnects.length < 1 || !lastStep || from + lastStep.step !== 40)
      fail(`the page whose cloud restarted: ${healed.status} (${reconnects.length} reconnects, last step ${lastStep?.step} ` +
           `after step ${from})`);
    else if (reconnects[0].step % 10 !== 0 || reconnects[0].step < 10)
      fail(`the page's reconnect event: ${JSON.stringify(reconnects[0])}`);
    else console.log(`restarted cloud: the page reconnected ${reconnects.length} time(s) (${reconnects[0].text}; from step ` +
                     `${reconnects[0].step}), then ${healed.status}`);
  }
  // An Error inside the module (here a bad option) is caught there and reaches JavaScript as
  // a readable one (the module is built with WebAssembly exceptions).
  await page.goto(pageUrl);
  const thrown = await page.evaluate(async () => {
    const spec = new Uint8Array(await (await fetch("model.tdms")).arrayBuffer());
    try {
      await TandemEdge.create({ spec, wireDtype: "f99" });
      return "created";
    } catch (e) {
      return e instanceof Error ? e.message : `not an Error: ${e}`;
    }
  });
  if (thrown !== "[edge] unknown wire dtype 'f99' (known: f32, f16, bf16, i8)") fail(`a bad option in the page: ${thrown}`);

  const t0 = Date.now();
  const trained = await run(token, "page-1");
  const seconds = (Date.now() - t0) / 1000;
  const losses = trained.events.filter((e) => e.event === "step").map((e) => e.loss);
  const done = trained.events.find((e) => e.event === "done");
  if (trained.state !== "done") fail(`training did not finish: ${trained.status}`);
  else if (losses.length !== steps) fail(`${losses.length} steps reported, expected ${steps}`);
  else {
    const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
    const before = mean(losses.slice(0, 5)), after = mean(losses.slice(-5));
    console.log(JSON.stringify({ steps: losses.length, loss_first5: before, loss_last5: after,
                                 test_accuracy: done.test_accuracy, seconds,
                                 samples_per_s: trained.events.filter((e) => e.event === "step").pop().samples_per_s }));
    if (!(after < before)) fail(`the loss did not fall: ${before} -> ${after}`);
    // The chart drew the loss line: blue pixels on the canvas.
    const blue = await page.evaluate(() => {
      const c = document.getElementById("chart");
      const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
      let n = 0;
      for (let i = 0; i < d.length; i += 4) n += d[i] < 80 && d[i + 2] > 200;
      return n;
    });
    if (blue < 200) fail(`the chart shows no loss line (${blue} blue pixels)`);
    await page.screenshot({ path: screenshot, fullPage: true });
  }
  // The page's egress log, as its download link offers it: the shell script verifies it.
  if (!trained.egressLog || !(await page.isVisible("#egress"))) fail("the page offers no egress log");
  else writeFileSync(egressPath, trained.egressLog);

  const replayed = await run(token, "page-1");
  const wantReplay = "the enrolment token was already used";
  if (replayed.state !== "failed" || !replayed.status.includes(wantReplay))
    fail(`a replayed token was not refused: ${replayed.status}`);
  else console.log(`replayed token: ${replayed.status}`);

  const forged = `${otherToken.slice(0, -4)}${otherToken.endsWith("AAAA") ? "BBBB" : "AAAA"}`;
  const refused = await run(forged, "page-2");
  if (refused.state !== "failed" || !refused.status.includes("signature does not verify"))
    fail(`a forged token was not refused: ${refused.status}`);
  else console.log(`forged token: ${refused.status}`);

  // Local files: 24 trousers (class 1) and 24 bags (class 8) from the bundled images, as PNGs.
  const images = readFileSync(`${webDir}/train-images.u8`), labels = readFileSync(`${webDir}/train-labels.u8`);
  const filesOf = (label) => [...labels.keys()].filter((i) => labels[i] === label).slice(0, 24)
    .map((i) => ({ name: `img${i}.png`, mimeType: "image/png", buffer: png(images.subarray(784 * i, 784 * (i + 1)), 28, 28) }));
  // With noise on the cut and NoPeek: every step reports epsilon and the distance correlation.
  await page.goto(`${pageUrl}?token=${encodeURIComponent(filesToken)}&client=page-3&steps=10&dpClip=4&dpNoise=0.8&nopeek=0.1`);
  await page.uncheck("#invert");  // already light on dark
  for (const label of [1, 8]) {
    await page.setInputFiles("#files", filesOf(label));
    await page.selectOption("#fileLabel", String(label));
    await page.click("#addFiles");
    await page.waitForFunction((n) => document.getElementById("fileCount").textContent.startsWith(`${n} images`),
                               label === 1 ? 24 : 48);
  }
  await page.fill("#batch", "16");
  await page.click("#train");
  await page.waitForFunction(() => ["done", "failed"].includes(window.tandemDemo.state), null, { timeout: 120000 });
  const local = await page.evaluate(() => ({ ...window.tandemDemo, status: document.getElementById("status").textContent }));
  const localSteps = local.events.filter((e) => e.event === "step").length;
  const private_ = local.events.filter((e) => e.event === "step" && e.dp_epsilon > 0 && e.dcor >= 0 && e.dcor <= 1);
  if (local.state !== "done" || localSteps !== 10) fail(`training on local files: ${local.status} (${localSteps} steps)`);
  else if (private_.length !== 10) fail(`${private_.length} of 10 steps reported epsilon and the distance correlation`);
  else console.log(`local files, with DP and NoPeek: ${local.status}; last step ${JSON.stringify(local.events.filter((e) => e.event === "step").pop())}`);

  // The asynchronous pipeline (pipeline=async): 20 steps, each step's Forwards before the
  // step before is backed up; the loss falls.
  if (asyncToken) {
    const ahead = await trainAt(`${pageUrl}?token=${encodeURIComponent(asyncToken)}&client=page-4&steps=20&pipeline=async`);
    const asyncLosses = ahead.events.filter((e) => e.event === "step").map((e) => e.loss);
    const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
    if (ahead.state !== "done" || asyncLosses.length !== 20) fail(`the asynchronous page: ${ahead.status} (${asyncLosses.length} steps)`);
    else if (!(mean(asyncLosses.slice(-5)) < mean(asyncLosses.slice(0, 5))))
      fail(`the asynchronous page's loss did not fall: ${mean(asyncLosses.slice(0, 5))} -> ${mean(asyncLosses.slice(-5))}`);
    else console.log(`asynchronous pipeline in the page: loss ${mean(asyncLosses.slice(0, 5)).toFixed(4)} -> ${mean(asyncLosses.slice(-5)).toFixed(4)}; ${ahead.status}`);
  }

  // A federation averaging every 5 steps: 12 steps with the front updated once a round take
  // rounds 1 and 2 at steps 5 and 10 and a last one after step 12, then evaluate.
  if (fedUrl) {
    const fed = await trainAt(`${fedUrl}?token=${encodeURIComponent(fedToken)}&client=page-fed&steps=12&frontUpdates=round`);
    const rounds = fed.events.filter((e) => e.event === "round").map((e) => `${e.round}@${e.step}`).join(" ");
    if (fed.state !== "done" || rounds !== "1@5 2@10 3@12")
      fail(`federated page: ${fed.status}; rounds ${rounds || "none"} (want 1@5 2@10 3@12)`);
    else console.log(`federated page: rounds ${rounds}; ${fed.status}`);
  }

  // The vision transformer's front in the page: 30 steps; the mean loss of the last five below
  // that of the first five.
  if (vitUrl) {
    const vit = await trainAt(`${vitUrl}?token=${encodeURIComponent(vitToken)}&client=page-vit&steps=30&model=fashion-vit&lr=0.02`,
                              300000);
    const vitLosses = vit.events.filter((e) => e.event === "step").map((e) => e.loss);
    const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
    if (vit.state !== "done" || vitLosses.length !== 30) fail(`the ViT page: ${vit.status} (${vitLosses.length} steps)`);
    else if (!(mean(vitLosses.slice(-5)) < mean(vitLosses.slice(0, 5))))
      fail(`the ViT's loss did not fall: ${mean(vitLosses.slice(0, 5))} -> ${mean(vitLosses.slice(-5))}`);
    else console.log(`ViT front in the page: loss ${mean(vitLosses.slice(0, 5)).toFixed(4)} -> ${mean(vitLosses.slice(-5)).toFixed(4)}; ${vit.status}`);
  }
} finally {
  await browser.close();
}
