// peakmem page: read the controls, ask /api/train, draw the answer. State lives in the URL query.
"use strict";

const COLORS = {  // peakmem.plot.SEGMENT_COLORS
  parameters: "#4e79a7", buffers: "#9c755f", gradients: "#f28e2b", master_weights: "#76b7b2",
  optimizer_states: "#e15759", activations: "#59a14f", temporaries: "#edc948", kv_cache: "#b07aa1",
  overhead: "#bab0ac", allocator_slack: "#d4cfcb", cuda_context: "#8c8c8c",
};
const CATEGORY_LABELS = {  // peakmem.render.CATEGORY_LABELS
  parameters: "parameters (weights)", buffers: "buffers", gradients: "gradients",
  master_weights: "master weights (fp32)", optimizer_states: "optimizer states", activations: "activations",
  temporaries: "temporaries", kv_cache: "KV cache", overhead: "overhead",
};
const OPTIONS = ["method", "precision", "optimizer", "batch", "seq", "grad_accum", "checkpointing", "attention"];
const INTS = new Set(["batch", "seq", "grad_accum"]);
const DEFAULTS = {
  model: "gpt2-xl", method: "full", precision: "mixed-bf16", optimizer: "adamw", batch: "1", seq: "",
  grad_accum: "1", checkpointing: "none", attention: "sdpa",
};
const DEFAULT_GPUS = ["rtx-4090", "a100-40gb", "h100-sxm"];
const SVG_NS = "http://www.w3.org/2000/svg";

const $ = (id) => document.getElementById(id);
const state = { source: "catalog", gpus: DEFAULT_GPUS.slice() };
const catalog = { models: new Map(), gpus: new Map() };
let requestId = 0;
let inflight = null;
let timer = null;
let lastData = null;  // re-rendered once the catalogs (GPU display names) arrive

// --- formatting: the same digits as peakmem.units (GB = 1e9 bytes, GiB = 2**30) -----------------
function fixed(x, digits) {
  return x.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
}
const fmtGB = (b, d = 2) => `${fixed(b / 1e9, d)} GB`;
const fmtGiB = (b, d = 2) => `${fixed(b / 2 ** 30, d)} GiB`;
const fmtBoth = (b) => `${fmtGB(b)} (${fmtGiB(b)})`;
const fmtInt = (n) => n.toLocaleString("en-US");
function fmtCount(n) {
  for (const [unit, size] of [["T", 1e12], ["B", 1e9], ["M", 1e6], ["K", 1e3]]) {
    if (Math.abs(n) >= size) return `${fixed(n / size, 2)} ${unit}`;
  }
  return String(n);
}
const fmtG = (x) => String(Number(x.toPrecision(6)));  // Python's format(x, "g") for these values

// --- DOM helpers ------------------------------------------------------------------------------
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}
function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}
function table(id, head, rows) {
  const t = $(id);
  t.replaceChildren();
  const tr = el("tr");
  for (const [label, num] of head) tr.append(el("th", num ? { class: "num" } : {}, label));
  t.append(el("thead", {}, tr));
  const body = el("tbody");
  for (const row of rows) {
    const r = el("tr", row.cls ? { class: row.cls } : {});
    row.cells.forEach((cell, i) => r.append(el("td", head[i][1] ? { class: "num" } : {}, cell)));
    body.append(r);
  }
  t.append(body);
}

// --- state <-> URL ------------------------------------------------------------------------------
function b64encode(text) {
  const bytes = new TextEncoder().encode(text);
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}
function b64decode(text) {
  const bin = atob(text.replace(/-/g, "+").replace(/_/g, "/"));
  return new TextDecoder().decode(Uint8Array.from(bin, (c) => c.charCodeAt(0)));
}

function restoreFromUrl() {
  const q = new URLSearchParams(location.search);
  if (q.has("cfg")) {
    state.source = "config";
    try { $("config").value = b64decode(q.get("cfg")); } catch { $("config").value = ""; }
  }
  $("model").value = q.get("model") || DEFAULTS.model;
  for (const name of OPTIONS) {
    const value = q.get(name);
    $(name).value = value !== null ? value : DEFAULTS[name];
  }
  if (q.has("gpus")) state.gpus = q.get("gpus").split(",").map((s) => s.trim()).filter(Boolean);
  document.querySelector(`input[name=source][value=${state.source}]`).checked = true;
  showSource();
}

function writeUrl() {
  const q = new URLSearchParams();
  if (state.source === "config") q.set("cfg", b64encode($("config").value));
  else q.set("model", $("model").value.trim());
  for (const name of OPTIONS) {
    const value = $(name).value.trim();
    if (value !== DEFAULTS[name]) q.set(name, value);
  }
  if (state.gpus.join(",") !== DEFAULT_GPUS.join(",")) q.set("gpus", state.gpus.join(","));
  const url = `${location.pathname}?${q.toString()}`;
  history.replaceState(null, "", url);
  $("share").href = url;
}

// --- the request --------------------------------------------------------------------------------
function requestBody() {
  const body = { gpus: state.gpus };
  if (state.source === "config") {
    const text = $("config").value.trim();
    if (!text) throw new Error("paste a config.json, or choose a catalog model");
    let config;
    try { config = JSON.parse(text); } catch (e) { throw new Error(`config.json is not valid JSON: ${e.message}`); }
    if (config === null || typeof config !== "object" || Array.isArray(config)) {
      throw new Error("config.json must be a JSON object");
    }
    body.config = config;
  } else {
    body.model = $("model").value.trim();
  }
  for (const name of OPTIONS) {
    const raw = $(name).value.trim();
    if (INTS.has(name)) {
      if (raw === "") { if (name !== "seq") body[name] = Number(DEFAULTS[name]); continue; }
      if (!/^[0-9]+$/.test(raw)) throw new Error(`${name}: must be a positive whole number`);
      body[name] = Number(raw);
    } else {
      body[name] = raw;
    }
  }
  return body;
}

function schedule(delay = 120) {
  clearTimeout(timer);
  timer = setTimeout(run, delay);
}

async function run() {
  writeUrl();
  const id = ++requestId;
  let body;
  try { body = requestBody(); } catch (e) { showError(e.message); return; }
  if (inflight) inflight.abort();
  inflight = new AbortController();
  $("result").classList.add("loading");
  try {
    // with GPUs, /api/fit (`peakmem fit --json`): the same estimate plus, per GPU, the planner's
    // limits (largest micro-batch, longest sequence) and the ranked changes that make it fit
    const endpoint = body.gpus.length ? "/api/fit" : "/api/train";
    const resp = await fetch(endpoint, {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
      signal: inflight.signal,
    });
    const data = await resp.json().catch(() => ({ error: `HTTP ${resp.status}` }));
    if (id !== requestId) return;  // a newer request is on its way
    if (!resp.ok) showError(data.error || `HTTP ${resp.status}`, data.suggestions);
    else if (endpoint === "/api/fit") render(data.estimate, data.gpus);
    else render(data, []);
  } catch (e) {
    if (e.name !== "AbortError" && id === requestId) showError(`the server did not answer: ${e.message}`);
  } finally {
    if (id === requestId) $("result").classList.remove("loading");
  }
}

// --- rendering ----------------------------------------------------------------------------------
function showError(message, suggestions) {
  const box = $("error");
  box.replaceChildren(message);
  if (suggestions && suggestions.length) {
    box.append(el("br"), "try: ");
    suggestions.forEach((s, i) => {
      const b = el("button", { type: "button" }, s);
      b.addEventListener("click", () => { $("model").value = s; schedule(0); });
      box.append(i ? " " : "", b);
    });
  }
  box.hidden = false;
  $("details").hidden = true;  // no stale numbers next to an error
  $("answer").textContent = "";
  for (const id of ["total", "allocated", "reserved", "peak-phase"]) $(id).textContent = "—";
  document.body.dataset.state = "error";
}

function gpuName(name) {
  const g = catalog.gpus.get(name);
  return g ? g.display_name.replace(/^NVIDIA (GeForce )?/, "") : name;
}

function render(data, fits) {
  lastData = [data, fits];
  $("error").hidden = true;
  $("details").hidden = false;
  $("answer").textContent = data.headline;
  $("total").textContent = fmtBoth(data.device_total_bytes);
  $("allocated").textContent = fmtGB(data.peak_allocated_bytes);
  $("reserved").textContent = fmtGB(data.peak_reserved_bytes);
  $("peak-phase").textContent = data.peak_phase;
  const seq = data.setup && (data.setup.seq_len ?? data.setup.seq);
  if (seq) $("seq").placeholder = `default ${seq}`;
  renderVerdicts(data.verdicts || [], fits || []);
  renderChart(data.chart, data.verdicts || []);
  renderTables(data);
  document.body.dataset.state = "ready";
}

function renderVerdicts(verdicts, fits) {
  const box = $("verdicts");
  box.replaceChildren();
  const byGpu = new Map(fits.map((f) => [f.gpu, f]));
  for (const v of verdicts) {
    let text = v.fits
      ? `${gpuName(v.gpu)} (${fmtGB(v.capacity_bytes, 1)}): fits, ${fmtGB(v.headroom_bytes, 1)} to spare`
      : `${gpuName(v.gpu)} (${fmtGB(v.capacity_bytes, 1)}): does not fit, ${fmtGB(-v.headroom_bytes, 1)} short`;
    const f = byGpu.get(v.gpu);
    const title = [];
    if (f) {
      const lim = f.limits || {};
      const changes = f.candidates || [];
      if (f.fits && lim.largest_micro_batch) text += ` · batch up to ${fmtInt(lim.largest_micro_batch)}`;
      if (!f.fits && changes.length) text += ` · fits with: ${changes[0].label}`;
      if (lim.longest_seq) title.push(`longest sequence that fits at this batch: ${fmtInt(lim.longest_seq)}`);
      if (changes.length) title.push(`changes that fit: ${changes.map((c) => c.label).join("; ")}`);
    }
    const attrs = { class: `verdict ${v.fits ? "fits" : "nofit"}`, "data-gpu": v.gpu };
    if (title.length) attrs.title = title.join("\n");
    box.append(el("span", attrs, text));
  }
}

// The part of a change's label before its parenthesis, at most LABEL_CHARS characters: it must fit
// the chart's left margin; the full label is the text's tooltip and the table below.
const LABEL_CHARS = 30;
function shortLabel(label) {
  const head = label.split(" (")[0];
  return head.length <= LABEL_CHARS ? head : head.slice(0, LABEL_CHARS - 1) + "…";
}

function renderChart(bars, verdicts) {
  const box = $("chart");
  box.replaceChildren();
  if (!bars || !bars.length) return;
  const W = 900, left = 190, right = 90, rowH = 30, top = verdicts.length ? 34 : 10, bottom = 26;
  const H = top + rowH * bars.length + bottom;
  const caps = verdicts.map((v) => v.capacity_bytes);
  const xmax = Math.max(...bars.map((b) => b.device_total_bytes), ...caps, 1) * 1.05;
  const x = (b) => left + (b / xmax) * (W - left - right);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "memory by technique" });
  // grid every "nice" number of GB
  const stepGB = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000].find((s) => xmax / 1e9 / s <= 8) || 10000;
  for (let g = 0; g * stepGB * 1e9 <= xmax; g++) {
    const gx = x(g * stepGB * 1e9);
    root.append(svg("line", { class: "grid", x1: gx, x2: gx, y1: top - 4, y2: H - bottom }));
    root.append(svg("text", { x: gx, y: H - 8, "text-anchor": "middle" }, `${g * stepGB}`));
  }
  root.append(svg("text", { x: W - right + 4, y: H - 8 }, "GB"));
  bars.forEach((bar, i) => {
    const y = top + i * rowH;
    const g = svg("g", { class: "bar", "data-label": bar.label });
    const text = svg("text", { class: "bar-label", x: left - 8, y: y + rowH / 2 + 4, "text-anchor": "end" }, shortLabel(bar.label));
    text.append(svg("title", {}, bar.label));
    g.append(text);
    let acc = 0;
    for (const s of bar.segments) {
      const rect = svg("rect", {
        x: x(acc), y: y + 4, width: Math.max(x(acc + s.bytes) - x(acc), 0), height: rowH - 8,
        fill: COLORS[s.key] || "#999", "data-key": s.key,
      });
      rect.append(svg("title", {}, `${s.label}: ${fmtGB(s.bytes)}`));
      g.append(rect);
      acc += s.bytes;
    }
    g.append(svg("text", { class: i === 0 ? "total" : "", x: x(bar.device_total_bytes) + 5, y: y + rowH / 2 + 4 },
      fmtGB(bar.device_total_bytes)));
    root.append(g);
  });
  root.append(svg("line", { class: "axis", x1: left, x2: left, y1: top - 4, y2: H - bottom }));
  verdicts.slice().sort((a, b) => a.capacity_bytes - b.capacity_bytes).forEach((v, i) => {
    const gx = x(v.capacity_bytes);
    root.append(svg("line", { class: "gpu-line", x1: gx, x2: gx, y1: top - 6, y2: H - bottom }));
    root.append(svg("text", { class: "gpu-text", x: gx, y: i % 2 ? top - 20 : top - 9, "text-anchor": "middle" },
      `${gpuName(v.gpu)} (${fmtGB(v.capacity_bytes, 1)})`));
  });
  box.append(root);
  const seen = new Map();
  for (const bar of bars) for (const s of bar.segments) seen.set(s.key, s.label);
  const legend = el("div", { class: "legend" });
  for (const [key, label] of seen) legend.append(el("span", {}, el("span", { class: `swatch seg-${key}` }), label));
  box.append(legend);
}

function renderTables(data) {
  const rows = data.bytes_per_param || [];
  const perParam = rows.map((r) => ({ cells: [r.tensor, r.dtype, fmtG(r.bytes), fmtInt(r.params), fmtBoth(r.total_bytes)] }));
  if (rows.length) {
    const sum = rows.reduce((a, r) => a + r.bytes, 0);
    perParam.push({ cls: "total", cells: ["model states", "", fmtG(sum), "", fmtBoth(data.model_state_bytes)] });
  }
  table("per-param", [["tensor"], ["dtype"], ["bytes/param", 1], ["params", 1], ["total", 1]], perParam);
  const peak = Math.max(data.peak_allocated_bytes, 1);
  const cats = Object.entries(data.breakdown).map(([c, b]) => ({
    cells: [CATEGORY_LABELS[c] || c, fmtBoth(b), `${fixed((100 * b) / peak, 1)}%`],
  }));
  cats.push({ cls: "total", cells: ["peak allocated", fmtBoth(data.peak_allocated_bytes), ""] });
  cats.push({ cells: ["peak reserved (caching allocator)", fmtBoth(data.peak_reserved_bytes), ""] });
  cats.push({ cls: "total", cells: ["device total (nvidia-smi)", fmtBoth(data.device_total_bytes), ""] });
  table("breakdown", [["category"], ["bytes", 1], ["share", 1]], cats);
  table("phases", [["phase"], ["allocated", 1]], Object.entries(data.phases).map(([p, b]) => ({
    cls: p === data.peak_phase ? "peak" : "", cells: [p === data.peak_phase ? `${p} ← peak` : p, fmtBoth(b)],
  })));
  table("ways", [["change"], ["device total", 1], ["saving", 1]], (data.ways_down || []).map((w) => ({
    cells: [w.change, fmtBoth(w.device_total_bytes), fmtGB(w.saving_bytes)],
  })));
  $("ways-note").textContent = data.ways_down_note ? `Not listed: ${data.ways_down_note}.` : "";
  $("assumptions").replaceChildren(...(data.assumptions || []).map((a) => el("li", {}, a)));
}

// --- GPUs ----------------------------------------------------------------------------------------
function renderChips() {
  const box = $("gpu-chips");
  box.replaceChildren();
  state.gpus.forEach((name, i) => {
    const remove = el("button", { type: "button", "aria-label": `remove ${name}`, title: "remove" }, "×");
    remove.addEventListener("click", () => { state.gpus.splice(i, 1); renderChips(); schedule(0); });
    box.append(el("span", { class: "chip", "data-gpu": name }, gpuName(name), remove));
  });
}

function addGpu(name) {
  name = name.trim();
  if (!name || state.gpus.includes(name) || state.gpus.length >= 16) return;
  state.gpus.push(name);
  renderChips();
  schedule(0);
}

// --- catalogs -----------------------------------------------------------------------------------
async function loadCatalogs() {
  const [models, gpus] = await Promise.all([
    fetch("/api/models").then((r) => r.json()), fetch("/api/gpus").then((r) => r.json()),
  ]);
  const list = $("model-list");
  for (const m of models) {
    catalog.models.set(m.name, m);
    for (const a of m.aliases) catalog.models.set(a.toLowerCase(), m);
    list.append(el("option", { value: m.name, label: `${m.hub_id}${m.params ? ` · ${fmtCount(m.params)}` : ""}` }));
  }
  const select = $("gpu-select");
  const groups = new Map();
  for (const g of gpus) {
    catalog.gpus.set(g.name, g);
    if (!groups.has(g.vendor)) groups.set(g.vendor, el("optgroup", { label: g.vendor }));
    groups.get(g.vendor).append(el("option", { value: g.name }, `${g.display_name} (${fmtGB(g.usable_bytes, 1)})`));
  }
  for (const group of groups.values()) select.append(group);
  renderChips();
  showModelInfo();
  if (lastData && $("error").hidden) render(...lastData);
}

function showModelInfo() {
  const m = catalog.models.get($("model").value.trim().toLowerCase());
  $("model-info").textContent = m ? `${m.hub_id}${m.params ? ` · ${fmtInt(m.params)} parameters` : ""}` : "";
}

function showSource() {
  const config = state.source === "config";
  $("catalog-box").hidden = config;
  $("config-box").hidden = !config;
}

// --- wiring -------------------------------------------------------------------------------------
function init() {
  restoreFromUrl();
  renderChips();
  for (const radio of document.querySelectorAll("input[name=source]")) {
    radio.addEventListener("change", () => { state.source = radio.value; showSource(); schedule(0); });
  }
  $("model").addEventListener("change", () => { showModelInfo(); schedule(0); });
  $("model").addEventListener("input", () => {
    showModelInfo();
    if (catalog.models.has($("model").value.trim().toLowerCase())) schedule(0);
  });
  $("config").addEventListener("input", () => schedule(400));
  for (const name of OPTIONS) {
    $(name).addEventListener(INTS.has(name) ? "input" : "change", () => schedule());
  }
  $("gpu-select").addEventListener("change", (e) => { addGpu(e.target.value); e.target.value = ""; });
  $("gpu-size-add").addEventListener("click", () => { addGpu($("gpu-size").value); $("gpu-size").value = ""; });
  $("gpu-size").addEventListener("keydown", (e) => {
    if (e.key === "Enter") { e.preventDefault(); addGpu($("gpu-size").value); $("gpu-size").value = ""; }
  });
  $("controls").addEventListener("submit", (e) => e.preventDefault());
  loadCatalogs().catch((e) => showError(`could not load the catalogs: ${e.message}`));
  run();
}

document.addEventListener("DOMContentLoaded", init);
