// Drives the browser edge's page in Debian's headless Chromium (playwright-core): the page
// trains against a local tandem-cloud over wss with an enrolment token; the loss must fall,
// the chart must show it (screenshot), and a replayed or forged token must be refused.
// Usage: node train_in_browser.mjs PAGE_URL TOKEN OTHER_TOKEN SCREENSHOT STEPS
import { chromium } from "playwright-core";

const [pageUrl, token, otherToken, screenshot, stepsText] = process.argv.slice(2);
const steps = Number(stepsText || 50);
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

  // Runs one training from the page with `tokenText`; returns the page's record of it.
  const run = async (tokenText, client) => {
    const url = `${pageUrl}?token=${encodeURIComponent(tokenText)}&client=${client}&steps=${steps}`;
    await page.goto(url);
    await page.click("#train");
    await page.waitForFunction(() => ["done", "failed"].includes(window.tandemDemo.state), null,
                               { timeout: 300000, polling: 250 });
    return page.evaluate(() => ({ ...window.tandemDemo, status: document.getElementById("status").textContent }));
  };

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
} finally {
  await browser.close();
}
