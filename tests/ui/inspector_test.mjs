// The routing inspector page end to end, in headless Chromium driven by playwright-core:
// `switchyard serve --ui --enable-return-routed-experts --api-key K` on the built-in tiny model;
// the page asks for the key, draws the heatmap, and after one API request the heatmap's counts
// have grown by exactly that request's routes (every row it computed, each MoE layer's top-k);
// the token × layer view shows the same expert ids for the pasted routes (uint8 .npy), uploaded
// int32 and uint16 .npy files, and the request id looked up in the server's route store (with
// its tokens' text); the store forgets the oldest request; odd requests leave the server serving.
// Saves a screenshot.
//
//   node tests/ui/inspector_test.mjs --switchyard BIN --deps DEPS_DIR --work DIR
// Exit 0: passed; 1: failed; 77: Chromium or playwright-core missing outside CI (CI=true fails).
import { spawn, execFileSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync } from "node:fs";
import net from "node:net";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, arg, i, all) => {
    if (arg.startsWith("--")) pairs.push([arg.slice(2), all[i + 1]]);
    return pairs;
  }, []),
);
const switchyard = args.switchyard ?? join(root, "build", "switchyard");
const deps = args.deps ?? join(root, "deps");
const work = args.work ?? join(root, "build");
const chromiumPath = process.env.CHROMIUM ?? "/usr/bin/chromium";
const KEY = "inspector-test-key";
const STORE = 3;

function unavailable(what) {
  if (process.env.CI) {
    console.error(`FAIL: ${what} (CI must have it: scripts/setup.sh installs it)`);
    process.exit(1);
  }
  console.log(`SKIP: ${what}; run scripts/setup.sh to install it`);
  process.exit(77);
}

const failures = [];
let passed = 0;
function check(ok, what, detail = "") {
  if (ok) {
    ++passed;
  } else {
    failures.push(what);
    console.error(`FAIL: ${what}${detail ? `: ${detail}` : ""}`);
  }
}

// A reader for the .npy routes the server returns, written apart from the page's (ui/src/npy.ts).
function readNpy(bytes) {
  if (bytes.subarray(0, 6).toString("latin1") !== "\x93NUMPY") throw new Error("not a .npy");
  const headerLength = bytes[6] === 1 ? bytes.readUInt16LE(8) : bytes.readUInt32LE(8);
  const start = (bytes[6] === 1 ? 10 : 12) + headerLength;
  const header = bytes.subarray(0, start).toString("latin1");
  const descr = /'descr':\s*'([^']+)'/.exec(header)[1];
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header)[1].split(",").filter((s) => s.trim()).map(Number);
  const count = shape.reduce((a, b) => a * b, 1);
  const readers = { "|u1": (i) => bytes.readUInt8(start + i), "<u2": (i) => bytes.readUInt16LE(start + 2 * i) };
  if (!readers[descr]) throw new Error(`unexpected dtype ${descr}`);
  return { descr, shape, ids: Array.from({ length: count }, (_, i) => readers[descr](i)) };
}

function writeNpy(descr, shape, ids) {
  const size = { "<i4": 4, "<u2": 2 }[descr];
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': (${shape.join(", ")}), }`;
  header += " ".repeat(63 - ((10 + header.length) % 64)) + "\n";
  const out = Buffer.alloc(10 + header.length + ids.length * size);
  out.write("\x93NUMPY", 0, "latin1");
  out[6] = 1;
  out[7] = 0;
  out.writeUInt16LE(header.length, 8);
  out.write(header, 10, "latin1");
  ids.forEach((id, i) => {
    const at = 10 + header.length + i * size;
    if (size === 4) out.writeInt32LE(id, at);
    else out.writeUInt16LE(id, at);
  });
  return out;
}

// Raw HTTP, so a path reaches the server exactly as written (fetch would normalise "..").
function rawGet(port, path) {
  return new Promise((resolve) => {
    const socket = net.connect(port, "127.0.0.1");
    let data = "";
    socket.on("data", (chunk) => (data += chunk.toString("latin1")));
    socket.on("end", () => resolve(Number(data.slice(9, 12))));
    socket.on("error", () => resolve(0));
    socket.write(`GET ${path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function until(what, probe, timeoutMs = 15000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    last = await probe();
    if (last.ok) return last;
    await sleep(100);
  }
  check(false, what, JSON.stringify(last?.detail ?? last).slice(0, 400));
  return last;
}

// ---------------------------------------------------------------------------------------------

if (!existsSync(chromiumPath)) unavailable(`Chromium not found at ${chromiumPath} (Debian package chromium)`);
const playwrightEntry = join(deps, "node_modules", "playwright-core", "index.mjs");
if (!existsSync(playwrightEntry)) unavailable(`playwright-core not found under ${deps}/node_modules`);
const { chromium } = await import(pathToFileURL(playwrightEntry).href);

// The committed page must be the one its sources build (ui/README.md: npm run build).
const { sourceHash } = await import(pathToFileURL(join(root, "ui", "source_hash.mjs")).href);
const builtFrom = readFileSync(join(root, "ui", "dist-source.sha256"), "utf8").trim();
check(sourceHash() === builtFrom, "ui/dist is built from the current ui/ sources",
  "rebuild it: cd ui && npm install && npm run build, and commit ui/dist and ui/dist-source.sha256");

mkdirSync(work, { recursive: true });
const model = join(work, "ui_inspector_tiny");
if (!existsSync(join(model, "config.json"))) {
  execFileSync(switchyard, ["make-model", "--preset", "tiny", "--seed", "1", "--out", model], { stdio: "inherit" });
}

const server = spawn(switchyard, [
  "serve", "--model", model, "--port", "0", "--ui", "--enable-return-routed-experts",
  "--api-key", KEY, "--ui-route-store", String(STORE), "--threads", "2",
  // A small KV cache: sizing it from memory takes the tiny model a minute to start.
  "--kv-cache-tokens", "1024",
], { stdio: ["ignore", "pipe", "pipe"] });
let serverOutput = "";
server.stdout.on("data", (d) => (serverOutput += d));
server.stderr.on("data", (d) => (serverOutput += d));
const exited = new Promise((resolve) => server.on("exit", (code, signal) => resolve(code ?? signal)));
const watchdog = setTimeout(() => {
  console.error("FAIL: the test ran past 150 s\n" + serverOutput.slice(-2000));
  server.kill("SIGKILL");
  process.exit(1);
}, 150000);

let browser;
try {
  const listening = await until("serve prints its port", async () => {
    const match = /listening on http:\/\/[^:]+:(\d+)/.exec(serverOutput);
    return { ok: !!match, detail: serverOutput, port: match && Number(match[1]) };
  }, 30000);
  const port = listening.port;
  const base = `http://127.0.0.1:${port}`;
  const auth = { Authorization: `Bearer ${KEY}` };
  await until("serve becomes healthy", async () => {
    const status = await fetch(`${base}/health`).then((r) => r.status, () => 0);
    return { ok: status === 200, detail: serverOutput };
  }, 60000);
  check(serverOutput.includes(`routing inspector at http://127.0.0.1:${port}/ui/`), "serve prints the page's address");

  // The page is public; its data is behind the key, with OpenAI's error schema.
  const page0 = await fetch(`${base}/ui/`);
  check(page0.status === 200 && page0.headers.get("content-type").startsWith("text/html"), "GET /ui/ without the key is the page");
  const denied = await fetch(`${base}/ui/api/expert_load`);
  check(denied.status === 401 && (await denied.json()).error?.message, "GET /ui/api/expert_load without the key is a 401 error body");
  const shape = await (await fetch(`${base}/ui/api/expert_load`, { headers: auth })).json();
  const moeLayers = shape.moe_layers;
  const experts = shape.num_experts;
  const topK = shape.top_k;
  const layers = shape.num_hidden_layers;
  check(moeLayers.length > 0 && experts > 0 && shape.capture === true, "the model has MoE layers and capture is on", JSON.stringify(shape));
  for (const path of ["/ui/../CMakeLists.txt", "/ui/%2e%2e/%2e%2e/etc/passwd", "/ui//etc/passwd", "/ui/assets/../../README.md"]) {
    check((await rawGet(port, path)) === 404, `GET ${path} is a 404`);
  }

  browser = await chromium.launch({
    executablePath: chromiumPath,
    headless: true,
    // playwright gives every launch a fresh profile directory of its own.
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  // The browser logs every 401 / 404 answer as a failed resource load: those are expected here.
  page.on("console", (m) => m.type() === "error" && !m.text().startsWith("Failed to load resource") && pageErrors.push(m.text()));
  await page.goto(`${base}/ui/`);

  // It asks for the key, then draws one cell per (MoE layer, expert).
  await page.waitForSelector('[data-testid="key-form"]:not([hidden])', { timeout: 10000 });
  await page.fill('[data-testid="key"]', KEY);
  await page.click('#key-form button[type="submit"]');
  const cells = () => page.$$eval("td.load", (els) => els.map((e) => ({ layer: Number(e.dataset.layer), expert: Number(e.dataset.expert), count: e.dataset.count === undefined ? NaN : Number(e.dataset.count) })));
  const drawn = await until("the heatmap draws every (MoE layer, expert) cell", async () => {
    const all = await cells();
    return { ok: all.length === moeLayers.length * experts && all.every((c) => !Number.isNaN(c.count)), detail: all.length, all };
  });
  const key = (layer, expert) => `${layer}/${expert}`;
  const baseline = new Map(drawn.all.map((c) => [key(c.layer, c.expert), c.count]));

  // One request through the API; its routes say which experts its tokens went to.
  const prompt = "The routing inspector shows which experts each token chose";
  const completion = await (await fetch(`${base}/v1/completions`, {
    method: "POST",
    headers: { ...auth, "Content-Type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: 6, temperature: 0, return_routed_experts: true }),
  })).json();
  const id = completion.id;
  const b64 = completion.choices?.[0]?.routed_experts;
  check(typeof b64 === "string" && typeof id === "string", "the completion carries its id and routes", JSON.stringify(completion).slice(0, 300));
  const routes = readNpy(Buffer.from(b64, "base64"));
  const [rows] = routes.shape;
  check(routes.shape[1] === layers && routes.shape[2] === topK && rows === completion.usage.prompt_tokens + completion.usage.completion_tokens - 1,
    "routes have shape (N-1, layers, top_k)", JSON.stringify(routes.shape));
  const at = (r, l, k) => routes.ids[(r * layers + l) * topK + k];

  // Every row of a fresh prompt went through the forward pass once: the heatmap must grow by
  // exactly this request's expert choices, and nothing else ran meanwhile.
  const expected = new Map(baseline);
  for (let r = 0; r < rows; ++r)
    for (const l of moeLayers)
      for (let k = 0; k < topK; ++k) expected.set(key(l, at(r, l, k)), expected.get(key(l, at(r, l, k))) + 1);
  const grown = await until("the heatmap grows by exactly the request's routes", async () => {
    const all = await cells();
    const wrong = all.filter((c) => c.count !== expected.get(key(c.layer, c.expert)));
    return { ok: wrong.length === 0, detail: wrong.slice(0, 5) };
  });
  const changed = [...expected].filter(([k, v]) => v !== baseline.get(k)).length;
  check(grown.ok && changed > 0, "some heatmap cells changed", String(changed));
  // And the counts themselves are the server's: /metrics' Prometheus counters, cell by cell.
  const metrics = await (await fetch(`${base}/metrics`, { headers: auth })).text();
  const prometheus = new Map();
  for (const m of metrics.matchAll(/^switchyard:expert_load_tokens_total\{[^}]*layer="(\d+)",expert="(\d+)"\} (\d+)$/gm))
    prometheus.set(key(Number(m[1]), Number(m[2])), Number(m[3]));
  const shownNow = await cells();
  const differ = shownNow.filter((c) => prometheus.get(key(c.layer, c.expert)) !== c.count);
  check(prometheus.size === moeLayers.length * experts && differ.length === 0,
    "every heatmap cell equals its /metrics counter", JSON.stringify(differ.slice(0, 5)));

  // The token × layer table shows the ids of the array given to it.
  async function tableMatches(what, layerSet) {
    const shown = await page.$$eval("#routes td[data-layer]", (els) => els.map((e) => [Number(e.dataset.row), Number(e.dataset.layer), e.dataset.experts]));
    const want = [];
    for (let r = 0; r < Math.min(rows, 200); ++r)
      for (const l of layerSet) want.push([r, l, Array.from({ length: topK }, (_, k) => at(r, l, k)).join(",")]);
    const ok = JSON.stringify(shown) === JSON.stringify(want);
    check(ok, what, ok ? "" : `first shown ${JSON.stringify(shown.slice(0, 3))}, want ${JSON.stringify(want.slice(0, 3))}`);
  }
  await page.fill('[data-testid="paste"]', b64);
  await page.click('[data-testid="show"]');
  await tableMatches("pasted routes (uint8 .npy): the table shows the same expert ids", moeLayers);
  check((await page.textContent('[data-testid="routes-status"]')).includes(`|u1 (${rows}, ${layers}, ${topK})`), "the status names dtype and shape");
  await page.uncheck("#moe-only");
  await tableMatches("with dense layers shown, every layer's column is there", [...Array(layers).keys()]);
  await page.check("#moe-only");

  // A whole JSON response pasted works too.
  await page.fill('[data-testid="paste"]', JSON.stringify(completion));
  await page.click('[data-testid="show"]');
  await tableMatches("a pasted JSON response: the same expert ids", moeLayers);

  // Uploaded .npy files of other integer dtypes.
  for (const descr of ["<i4", "<u2"]) {
    await page.setInputFiles('[data-testid="file"]', { name: `routes-${descr.slice(1)}.npy`, mimeType: "application/octet-stream", buffer: writeNpy(descr, routes.shape, routes.ids) });
    await page.waitForFunction((d) => document.querySelector('[data-testid="routes-status"]').textContent.includes(d), descr);
    await tableMatches(`uploaded ${descr} .npy: the same expert ids`, moeLayers);
  }

  // The request id, from the server's route store: same ids, and its tokens' text.
  await until("the page lists the request among the recent ones", async () => {
    const ids = await page.$$eval('[data-testid="recent"] button', (els) => els.map((e) => e.dataset.id));
    return { ok: ids.includes(id), detail: ids };
  });
  await page.fill('[data-testid="request-id"]', id);
  await page.click('[data-testid="lookup"]');
  await page.waitForFunction((i) => document.querySelector('[data-testid="routes-status"]').textContent.includes(i), id);
  await tableMatches("looked up by request id: the same expert ids", moeLayers);
  const tokens = await page.$$eval('#routes td.token', (els) => els.map((e) => e.textContent));
  const stored = await (await fetch(`${base}/ui/api/routes/${encodeURIComponent(id)}`, { headers: auth })).json();
  check(tokens.length === rows && tokens.every((t, i) => t === JSON.stringify(stored.choices[0].tokens[i]).slice(1, -1)),
    "every row shows its token's text", JSON.stringify(tokens.slice(0, 8)));
  check(tokens.join("").includes("routing inspector"), "the prompt's text reads from the token column", tokens.join("|").slice(0, 200));
  await page.screenshot({ path: join(work, "ui_inspector.png"), fullPage: true });

  await page.fill('[data-testid="request-id"]', "cmpl-nonexistent");
  await page.click('[data-testid="lookup"]');
  await page.waitForFunction(() => document.querySelector('[data-testid="routes-status"]').dataset.state === "error");
  check((await page.textContent('[data-testid="routes-status"]')).includes("no routes stored"), "an unknown id shows the server's 404 message");
  // "Tokens in the last second": the cells keep their totals, the tooltips add the rate.
  await page.check('input[name="load-mode"][value="rate"]');
  await until("rate mode shows per-second figures", async () => {
    const titles = await page.$$eval("td.load", (els) => els.map((e) => e.title));
    return { ok: titles.length > 0 && titles.every((t) => t.endsWith("/s now")), detail: titles[0] };
  });
  check(pageErrors.length === 0, "no errors in the page's console", pageErrors.join("; "));

  // The store keeps the last STORE requests: the first one is gone after STORE more.
  for (let i = 0; i < STORE; ++i) {
    const r = await fetch(`${base}/v1/completions`, { method: "POST", headers: { ...auth, "Content-Type": "application/json" }, body: JSON.stringify({ prompt: `filler ${i}`, max_tokens: 2 }) });
    check(r.status === 200, `filler request ${i} succeeds`);
  }
  const gone = await fetch(`${base}/ui/api/routes/${encodeURIComponent(id)}`, { headers: auth });
  const goneBody = await gone.json();
  check(gone.status === 404 && goneBody.error?.code === 404 && goneBody.error?.param === "id", "an evicted id is an OpenAI-style 404", JSON.stringify(goneBody));

  // Odd requests: answered, and the server keeps serving.
  for (const path of ["/ui/api/routes/%zz", "/ui/%ff%fe", `/ui/api/routes/${"x".repeat(20000)}`, "/ui/api/routes/%00"]) {
    const status = await rawGet(port, path);
    check(status >= 400 && status < 500, `GET ${path.slice(0, 40)} is a 4xx`, String(status));
  }
  check((await fetch(`${base}/health`)).status === 200, "the server is healthy after all that");
} catch (error) {
  check(false, "no exception", error.stack);
} finally {
  if (browser) await browser.close();
  server.kill("SIGTERM");
  const code = await exited;
  check(code === 0, "serve drains and exits 0 on SIGTERM", String(code));
  clearTimeout(watchdog);
}
if (failures.length) console.error(serverOutput.slice(-3000));
const seconds = (performance.now() / 1000).toFixed(1);
console.log(`ui inspector: ${passed} passed, ${failures.length} failed in ${seconds} s (screenshot: ${join(work, "ui_inspector.png")})`);
process.exit(failures.length ? 1 : 0);
