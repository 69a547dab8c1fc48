// The routing inspector: a live expert-load heatmap (GET api/expert_load, polled every second)
// and a token × layer table of chosen experts for a pasted / uploaded routes array or a request
// id still in the server's route store (GET api/routes/{id}). Text goes in via textContent only.
import "./style.css";
import { base64ToBytes, isNpy, parseNpy } from "./npy";

interface ExpertLoad {
  model: string;
  architecture: string;
  capture: boolean;
  num_hidden_layers: number;
  moe_layers: number[];
  num_experts: number;
  top_k: number;
  expert_load_tokens: number[][];
  routes_captured_total: number;
  running_requests: number;
  waiting_requests: number;
  route_store: { max_requests: number; ids: string[] } | null;
}

interface StoredRoutes {
  id: string;
  choices: { index: number; rows: number; routed_experts: string; tokens: string[] }[];
}

interface RouteTable {
  source: string;
  rows: number;
  layers: number;
  topK: number;
  ids: ArrayLike<number>;
  tokens: string[] | null;
  layerNames: number[]; // hidden-layer index of each axis-1 entry
  moe: boolean[]; // whether each axis-1 entry is a MoE layer (dense rows are 0 on the wire)
}

const KEY_STORAGE = "switchyard-api-key";
const POLL_MS = 1000;
const PAGE_ROWS = 200;

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;

let apiKey = sessionStorage.getItem(KEY_STORAGE) ?? "";
let model: ExpertLoad | null = null;
let previous: { at: number; load: number[][] } | null = null;
let heatmapShape = "";
let table: RouteTable | null = null;
let pageStart = 0;

class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

async function api<T>(path: string): Promise<T> {
  const headers: Record<string, string> = {};
  if (apiKey) headers.Authorization = `Bearer ${apiKey}`;
  const response = await fetch(`api/${path}`, { headers, cache: "no-store" });
  const text = await response.text();
  let body: unknown = null;
  try {
    body = JSON.parse(text);
  } catch {
    // not JSON: reported below with the status
  }
  if (!response.ok) {
    const message =
      (body as { error?: { message?: string } } | null)?.error?.message ?? `HTTP ${response.status}`;
    if (response.status === 401) $("key-form").hidden = false;
    throw new HttpError(response.status, message);
  }
  return body as T;
}

// ---------------------------------------------------------------------------------------------
// Expert load heatmap.

// Viridis, five stops: cheap to interpolate, readable in grey, distinct from the route colours.
const VIRIDIS = [
  [68, 1, 84],
  [59, 82, 139],
  [33, 145, 140],
  [94, 201, 98],
  [253, 231, 37],
];
function viridis(t: number): string {
  const x = Math.min(1, Math.max(0, t)) * (VIRIDIS.length - 1);
  const i = Math.min(VIRIDIS.length - 2, Math.floor(x));
  const f = x - i;
  const c = VIRIDIS[i].map((v, k) => Math.round(v + (VIRIDIS[i + 1][k] - v) * f));
  return `rgb(${c[0]}, ${c[1]}, ${c[2]})`;
}

function buildHeatmap(load: ExpertLoad) {
  const heatmap = $<HTMLTableElement>("heatmap");
  heatmap.replaceChildren();
  const head = heatmap.createTHead().insertRow();
  head.appendChild(document.createElement("th")).textContent = "layer \\ expert";
  for (let e = 0; e < load.num_experts; ++e) {
    const th = head.appendChild(document.createElement("th"));
    th.textContent = String(e);
    th.className = "expert";
  }
  head.appendChild(document.createElement("th")).textContent = "max/mean";
  const body = heatmap.createTBody();
  load.moe_layers.forEach((layer, m) => {
    const row = body.insertRow();
    row.appendChild(document.createElement("th")).textContent = `L${layer}`;
    for (let e = 0; e < load.num_experts; ++e) {
      const cell = row.insertCell();
      cell.className = "load";
      cell.dataset.layer = String(layer);
      cell.dataset.expert = String(e);
      cell.dataset.index = String(m);
    }
    row.insertCell().className = "imbalance";
  });
}

function updateHeatmap(load: ExpertLoad, now: number) {
  const shape = `${load.moe_layers.join(",")}/${load.num_experts}`;
  if (shape !== heatmapShape) {
    buildHeatmap(load);
    heatmapShape = shape;
    previous = null;
  }
  const rate = (document.querySelector('input[name="load-mode"]:checked') as HTMLInputElement)
    .value === "rate";
  const seconds = previous ? Math.max(0.001, (now - previous.at) / 1000) : 1;
  const rows = $<HTMLTableElement>("heatmap").tBodies[0].rows;
  load.expert_load_tokens.forEach((counts, m) => {
    const shown = counts.map((c, e) =>
      rate ? (previous ? (c - previous.load[m][e]) / seconds : 0) : c,
    );
    const max = Math.max(...shown);
    const mean = shown.reduce((a, b) => a + b, 0) / shown.length;
    const cells = rows[m].cells;
    counts.forEach((count, e) => {
      const cell = cells[e + 1];
      cell.dataset.count = String(count);
      cell.style.background = max > 0 ? viridis(shown[e] / max) : "";
      cell.title = `layer ${load.moe_layers[m]}, expert ${e}: ${count} tokens since start` +
        (rate ? `, ${shown[e].toFixed(1)}/s now` : "");
    });
    cells[cells.length - 1].textContent = mean > 0 ? (max / mean).toFixed(2) : "–";
  });
  previous = { at: now, load: load.expert_load_tokens };
}

function showRecent(ids: string[]) {
  const recent = $("recent");
  recent.replaceChildren();
  if (ids.length === 0) return;
  recent.append("recent: ");
  for (const id of ids.slice(0, 6)) {
    const button = recent.appendChild(document.createElement("button"));
    button.className = "link";
    button.textContent = id.length > 18 ? `${id.slice(0, 16)}…` : id;
    button.title = id;
    button.dataset.id = id;
    button.addEventListener("click", () => {
      $<HTMLInputElement>("request-id").value = id;
      void lookUp(id);
    });
  }
}

async function poll() {
  if (!$<HTMLInputElement>("pause").checked) {
    try {
      const load = await api<ExpertLoad>("expert_load");
      model = load;
      $("key-form").hidden = true;
      $("model").textContent =
        `${load.model} · ${load.architecture} · ${load.num_hidden_layers} layers ` +
        `(${load.moe_layers.length} MoE) · ${load.num_experts} experts · top-${load.top_k}`;
      const note = $("load-note");
      note.hidden = load.capture;
      note.textContent = load.capture
        ? ""
        : "Route capture is off, so the engine counts no expert load: start the server with " +
          "--enable-return-routed-experts.";
      if (load.capture) updateHeatmap(load, performance.now());
      showRecent(load.route_store?.ids ?? []);
      const live = $("live");
      live.textContent =
        `live · ${new Date().toLocaleTimeString()} · ${load.routes_captured_total} rows captured · ` +
        `${load.running_requests} running, ${load.waiting_requests} waiting`;
      live.dataset.state = "ok";
    } catch (error) {
      const live = $("live");
      live.textContent = `not updating: ${(error as Error).message}`;
      live.dataset.state = "error";
    }
  }
  setTimeout(poll, POLL_MS);
}

// ---------------------------------------------------------------------------------------------
// Token × layer table.

function status(text: string, error = false) {
  const el = $("routes-status");
  el.textContent = text;
  el.dataset.state = error ? "error" : "ok";
}

// Which hidden layer each axis-1 entry is, and whether it is MoE, from the model's shape.
function layerLayout(layers: number): { names: number[]; moe: boolean[]; note: string } {
  const all = Array.from({ length: layers }, (_, i) => i);
  if (model && layers === model.num_hidden_layers) {
    const moe = new Set(model.moe_layers);
    return { names: all, moe: all.map((l) => moe.has(l)), note: "all hidden layers" };
  }
  if (model && layers === model.moe_layers.length) {
    return { names: model.moe_layers, moe: all.map(() => true), note: "MoE layers only" };
  }
  return {
    names: all,
    moe: all.map(() => true),
    note: model ? `${layers} layers: does not match this model's shape` : `${layers} layers`,
  };
}

function tableFromBytes(bytes: Uint8Array, source: string, tokens: string[] | null): RouteTable {
  if (isNpy(bytes)) {
    const npy = parseNpy(bytes);
    if (npy.shape.length !== 3) {
      throw new Error(`expected shape (rows, layers, top_k), got (${npy.shape.join(", ")})`);
    }
    const [rows, layers, topK] = npy.shape;
    const layout = layerLayout(layers);
    return {
      source: `${source} · ${npy.dtype} (${rows}, ${layers}, ${topK}) · ${layout.note}`,
      rows, layers, topK, ids: npy.data, tokens, layerNames: layout.names, moe: layout.moe,
    };
  }
  // SGLang's /generate gives flat int32 without a header: shape from the model.
  if (!model) throw new Error("not a .npy file, and the model's shape is not known yet");
  const layers = model.num_hidden_layers;
  const topK = model.top_k;
  if (bytes.length % (4 * layers * topK) !== 0) {
    throw new Error("not a .npy file, nor flat int32 rows of (layers × top_k) for this model");
  }
  const ids = new Int32Array(bytes.slice().buffer);
  const layout = layerLayout(layers);
  return {
    source: `${source} · flat int32 (SGLang) as (${ids.length / (layers * topK)}, ${layers}, ${topK})`,
    rows: ids.length / (layers * topK), layers, topK, ids, tokens,
    layerNames: layout.names, moe: layout.moe,
  };
}

// Pasted text: base64 of a .npy (or of SGLang's flat int32), or a JSON response carrying one.
function tableFromText(text: string, source: string): RouteTable {
  const trimmed = text.trim().replace(/^"|"$/g, "");
  if (!trimmed) throw new Error("nothing to show: paste routed_experts or choose a file");
  if (trimmed.startsWith("{")) {
    const body = JSON.parse(trimmed);
    const routes =
      body?.choices?.find((c: { routed_experts?: string }) => c.routed_experts)?.routed_experts ??
      body?.meta_info?.routed_experts ??
      body?.routed_experts;
    if (typeof routes !== "string") throw new Error("this JSON has no routed_experts field");
    return tableFromBytes(base64ToBytes(routes), `${source} (JSON)`, null);
  }
  return tableFromBytes(base64ToBytes(trimmed), source, null);
}

function expertColour(id: number): string {
  const experts = model?.num_experts ?? 64;
  return `hsl(${Math.round((id * 137.508) % 360)}, 70%, ${id < experts ? 86 : 60}%)`;
}

function renderTable() {
  const el = $<HTMLTableElement>("routes");
  el.replaceChildren();
  $("routes-controls").hidden = !table;
  if (!table) return;
  const t = table;
  const moeOnly = $<HTMLInputElement>("moe-only").checked;
  const shown = t.layerNames.map((_, i) => i).filter((i) => !moeOnly || t.moe[i]);
  const head = el.createTHead().insertRow();
  head.appendChild(document.createElement("th")).textContent = "row";
  if (t.tokens) head.appendChild(document.createElement("th")).textContent = "token";
  for (const i of shown) {
    const th = head.appendChild(document.createElement("th"));
    th.textContent = `L${t.layerNames[i]}`;
    if (!t.moe[i]) th.className = "dense";
  }
  const body = el.createTBody();
  const end = Math.min(t.rows, pageStart + PAGE_ROWS);
  const experts = model?.num_experts ?? Infinity;
  for (let r = pageStart; r < end; ++r) {
    const row = body.insertRow();
    row.dataset.row = String(r);
    row.appendChild(document.createElement("th")).textContent = String(r);
    if (t.tokens) {
      const token = row.insertCell();
      token.className = "token";
      token.dataset.testid = "token";
      token.textContent = JSON.stringify(t.tokens[r] ?? "").slice(1, -1);
    }
    for (const i of shown) {
      const cell = row.insertCell();
      const at = (r * t.layers + i) * t.topK;
      const ids = Array.from({ length: t.topK }, (_, k) => Number(t.ids[at + k]));
      cell.dataset.row = String(r);
      cell.dataset.layer = String(t.layerNames[i]);
      cell.dataset.experts = ids.join(",");
      cell.textContent = ids.join(" ");
      if (!t.moe[i]) cell.className = "dense";
      else if (ids.some((id) => id < 0 || id >= experts)) cell.className = "bad";
      else cell.style.background = expertColour(ids[0]);
    }
  }
  $("page").textContent = t.rows ? `rows ${pageStart}–${end - 1} of ${t.rows}` : "no rows";
}

function show(next: RouteTable) {
  table = next;
  pageStart = 0;
  status(next.source);
  renderTable();
}

function fail(error: unknown) {
  table = null;
  renderTable();
  status((error as Error).message, true);
}

async function lookUp(id: string) {
  if (!id.trim()) return fail(new Error("enter a request id"));
  try {
    const stored = await api<StoredRoutes>(`routes/${encodeURIComponent(id.trim())}`);
    const choice = stored.choices.find((c) => c.routed_experts);
    if (!choice) throw new Error(`request ${stored.id} has no routes`);
    const note = stored.choices.length > 1 ? ` (choice ${choice.index} of ${stored.choices.length})` : "";
    show(tableFromBytes(base64ToBytes(choice.routed_experts), `request ${stored.id}${note}`, choice.tokens));
  } catch (error) {
    fail(error);
  }
}

function main() {
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    apiKey = $<HTMLInputElement>("key").value.trim();
    sessionStorage.setItem(KEY_STORAGE, apiKey);
    $("key-form").hidden = true;
  });
  $("lookup").addEventListener("click", () => void lookUp($<HTMLInputElement>("request-id").value));
  $("request-id").addEventListener("keydown", (event) => {
    if (event.key === "Enter") void lookUp($<HTMLInputElement>("request-id").value);
  });
  $("show").addEventListener("click", () => {
    try {
      show(tableFromText($<HTMLTextAreaElement>("paste").value, "pasted"));
    } catch (error) {
      fail(error);
    }
  });
  $("file").addEventListener("change", async () => {
    const file = $<HTMLInputElement>("file").files?.[0];
    if (!file) return;
    try {
      const bytes = new Uint8Array(await file.arrayBuffer());
      show(
        isNpy(bytes)
          ? tableFromBytes(bytes, `file ${file.name}`, null)
          : tableFromText(new TextDecoder().decode(bytes), `file ${file.name}`),
      );
    } catch (error) {
      fail(error);
    }
  });
  $("moe-only").addEventListener("change", renderTable);
  $("prev").addEventListener("click", () => {
    pageStart = Math.max(0, pageStart - PAGE_ROWS);
    renderTable();
  });
  $("next").addEventListener("click", () => {
    if (table && pageStart + PAGE_ROWS < table.rows) pageStart += PAGE_ROWS;
    renderTable();
  });
  void poll();
}

main();
