// peakmem page: read the controls, ask the API the question the CLI would be asked, draw the answer.
// Every number shown comes from the API's JSON (the CLI's --json); the page computes no memory.
// State lives in the URL query.
"use strict";

const COLORS = {  // peakmem.plot.SEGMENT_COLORS
  parameters: "#4e79a7", buffers: "#9c755f", gradients: "#f28e2b", master_weights: "#76b7b2",
  optimizer_states: "#e15759", activations: "#59a14f", temporaries: "#edc948", kv_cache: "#b07aa1",
  cuda_graphs: "#ff9da7", overhead: "#bab0ac", allocator_slack: "#d4cfcb", cuda_context: "#8c8c8c",
};
const CATEGORY_LABELS = {  // peakmem.render.CATEGORY_LABELS
  parameters: "parameters (weights)", buffers: "buffers", gradients: "gradients",
  master_weights: "master weights (fp32)", optimizer_states: "optimizer states", activations: "activations",
  temporaries: "temporaries", kv_cache: "KV cache", cuda_graphs: "CUDA graphs", overhead: "overhead",
};
// The questions: each is one CLI command (and one API endpoint).
const ENDPOINTS = {
  train: "/api/train", fit: "/api/fit", infer: "/api/infer", fit_infer: "/api/fit_infer", plan: "/api/plan",
};
const TRAIN = ["train", "fit", "plan"];
const INFER = ["infer", "fit_infer"];
// Each control: its element id, the API field (key; default: the id), its default, whether it is a
// whole number, and the questions it belongs to. An empty value is left out (the CLI's default).
const FIELDS = [
  { id: "method", def: "full", modes: TRAIN },
  { id: "lora_rank", def: "", int: true, modes: TRAIN, only: "adapter" },
  { id: "lora_targets", def: "", modes: TRAIN, only: "adapter" },
  { id: "lora_target_parameters", def: "", modes: TRAIN, only: "adapter" },
  { id: "peft", def: "", modes: TRAIN, only: "adapter" },
  { id: "quant", def: "", modes: TRAIN, only: "qlora" },
  { id: "kbit_prep", def: "", modes: TRAIN, only: "qlora" },
  { id: "trl", def: "", modes: TRAIN, only: "adapter" },
  { id: "framework", def: "hf", modes: TRAIN },
  { id: "transformers", def: "", modes: TRAIN },
  { id: "bitsandbytes", def: "", modes: TRAIN, only: "qlora" },
  { id: "torchao", def: "", modes: TRAIN, only: "qlora" },
  { id: "precision", def: "mixed-bf16", modes: TRAIN },
  { id: "optimizer", def: "adamw", modes: TRAIN },
  { id: "batch", def: "1", int: true, modes: TRAIN },
  { id: "seq", def: "", int: true, modes: TRAIN },
  { id: "grad_accum", def: "1", int: true, modes: TRAIN },
  { id: "grad_sync", def: "auto", modes: TRAIN },
  { id: "padded_lengths", def: "fixed", modes: TRAIN },
  { id: "checkpointing", def: "none", modes: TRAIN },
  { id: "attention", def: "sdpa", modes: TRAIN },
  { id: "loss", def: "standard", modes: TRAIN },
  { id: "optimizer_in_backward", def: "", bool: true, modes: TRAIN },
  { id: "activation_offload", def: "", bool: true, modes: TRAIN },
  { id: "compile", def: "", bool: true, modes: TRAIN },
  { id: "liger", def: "", bool: true, modes: TRAIN },
  { id: "keep_grads", def: "", bool: true, modes: TRAIN },
  { id: "objective", def: "sft", modes: ["train"] },
  { id: "teacher", def: "", modes: ["train"], only: "distill" },
  { id: "critic", def: "", modes: ["train"], only: "ppo" },
  { id: "trainer", def: "trl", modes: ["train"], only: "online" },
  { id: "reference", def: "auto", modes: ["train"], only: "post" },
  { id: "rollout", def: "hf", modes: ["train"], only: "generates" },
  { id: "beta", def: "", num: true, modes: ["train"], only: "post" },
  { id: "num_generations", def: "", int: true, modes: ["train"], only: "online" },
  { id: "completion", def: "", int: true, modes: ["train"], only: "post" },
  { id: "rollout_memory", def: "0.3", num: true, modes: ["train"], only: "generates" },
  { id: "rollout_sleep", def: "", bool: true, modes: ["train"], only: "generates" },
  { id: "images", def: "", int: true, modes: ["train", "fit"] },
  { id: "image_size", def: "", modes: ["train", "fit"] },
  { id: "gpu_count", def: "1", int: true, modes: ["train", "fit"] },
  { id: "sharding", def: "none", modes: ["train", "fit"] },  // -> zero (0-3) or fsdp (a mode)
  { id: "tp", def: "1", int: true, modes: ["train", "fit"] },
  { id: "ulysses", def: "1", int: true, modes: ["train", "fit"] },
  { id: "tiled_mlp", def: "", bool: true, modes: ["train", "fit"] },
  { id: "max_tokens_per_gpu", def: "", int: true, modes: ["train", "fit"] },
  { id: "pp", def: "1", int: true, modes: ["train", "fit"] },
  { id: "offload", def: "none", modes: ["train", "fit"] },
  { id: "offload_params", def: "none", modes: ["train", "fit"] },
  { id: "float8_all_gather", def: "", bool: true, modes: ["train", "fit"] },
  { id: "engine", def: "hf", modes: INFER },
  { id: "weights", def: "", modes: INFER },  // empty: the checkpoint's quantization_config, else bf16
  { id: "kv_cache", def: "auto", modes: INFER },
  { id: "infer_batch", key: "batch", def: "1", int: true, modes: INFER },
  { id: "context", def: "", int: true, modes: INFER },
  { id: "infer_tp", key: "tp", def: "1", int: true, modes: INFER },
  { id: "infer_pp", key: "pp", def: "1", int: true, modes: INFER },
  { id: "infer_dp", key: "dp", def: "1", int: true, modes: INFER },
  { id: "infer_ep", key: "ep", def: "1", int: true, modes: INFER },
  { id: "dp_attention", def: "", bool: true, modes: INFER },
  { id: "gpu_memory_utilization", def: "", num: true, modes: INFER },
  { id: "max_loras", def: "", int: true, modes: INFER },
  { id: "max_lora_rank", def: "", int: true, modes: INFER },
  { id: "prefix_tokens", def: "", int: true, modes: INFER },
  { id: "draft", def: "", modes: INFER },
  { id: "draft_method", def: "", modes: INFER },  // empty: from the draft's config (EAGLE-3 architectures)
  { id: "num_speculative_tokens", def: "", int: true, modes: INFER },
  { id: "enforce_eager", def: "", bool: true, modes: INFER },
  { id: "disable_custom_all_reduce", def: "", bool: true, modes: INFER },
  { id: "interconnect", def: "", modes: INFER },  // empty: the catalog GPU's
  { id: "model_runner", def: "", modes: INFER },  // empty: the release's for the model (auto)
  { id: "cudagraph_mode", def: "", modes: INFER },  // empty: the release's (auto)
  { id: "cuda_graph_max_bs", def: "", int: true, modes: INFER },  // empty: SGLang's for the GPU
  { id: "attention_backend", def: "", modes: INFER },  // empty: SGLang's for the model and GPU
  { id: "max_num_seqs", def: "", int: true, modes: INFER },  // empty: vLLM's for the GPU
  { id: "prefill_chunk", def: "", int: true, modes: INFER },  // empty: the engine's for the GPU
  { id: "vllm_entrypoint", def: "serve", modes: INFER },
  { id: "engine_version", def: "", modes: INFER },
  { id: "max_gpus", def: "8", int: true, modes: ["plan"] },
  { id: "global_batch", def: "", int: true, modes: ["plan"] },
];
const DEFAULT_MODEL = "gpt2-xl";
const DEFAULT_GPUS = ["rtx-4090", "a100-40gb", "h100-sxm"];
const SVG_NS = "http://www.w3.org/2000/svg";
const STATE_CLASS = { "fits": "fits", "tight": "tight", "does not fit": "nofit" };

const $ = (id) => document.getElementById(id);
const state = { source: "catalog", question: "train", gpus: DEFAULT_GPUS.slice() };
const catalog = { models: new Map(), gpus: new Map() };
let requestId = 0;
let inflight = null;
let timer = null;
let last = null;  // [question, data]: re-rendered once the catalogs (GPU display names) arrive

// --- formatting: the same digits as peakmem.units (GB = 1e9 bytes, GiB = 2**30) -----------------
function fixed(x, digits) {
  return x.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
}
// a no-break space between a number and its unit: a narrow table wraps "5.70 GB (5.31 GiB)" only before "("
const fmtGB = (b, d = 2) => `${fixed(b / 1e9, d)}\u00a0GB`;
const fmtGiB = (b, d = 2) => `${fixed(b / 2 ** 30, d)}\u00a0GiB`;
const fmtBoth = (b) => `${fmtGB(b)} (${fmtGiB(b)})`;
const fmtInt = (n) => n.toLocaleString("en-US");
const fmtSigned = (b) => (b >= 0 ? "+" : "-") + fmtGB(Math.abs(b));  // peakmem.render_plan._signed
function fmtCount(n) {
  for (const [unit, size] of [["T", 1e12], ["B", 1e9], ["M", 1e6], ["K", 1e3]]) {
    if (Math.abs(n) >= size) return `${fixed(n / size, 2)} ${unit}`;
  }
  return String(n);
}
// peakmem.render.fmt_per_param: Python's format(x, ".4g"); tiny shares as "<0.001"
const fmtPerParam = (x) => (x > 0 && x < 0.001 ? "<0.001" : String(Number(x.toPrecision(4))));
function fmtSeconds(s) {  // peakmem.render_plan.fmt_seconds
  if (s >= 3600) return `${(s / 3600).toFixed(1)} h`;
  if (s >= 1) return `${s.toFixed(2)} s`;
  return `${(s * 1000).toFixed(1)} ms`;
}
const fmtTerm = (b) => (b < 0 ? "-" : "") + fmtGB(Math.abs(b));
const fmtRange = (r) => `${fixed(r.low_bytes / 1e9, 1)}–${fmtGB(r.high_bytes, 1)}`;

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
// head: [[label, numeric?], ...]; rows: {cells, cls}. The first cell of a row is its header (scope=row).
function fillTable(t, head, rows, caption) {
  t.replaceChildren();
  if (caption) t.append(el("caption", { class: "visually-hidden" }, caption));
  const tr = el("tr");
  for (const [label, num] of head) tr.append(el("th", num ? { class: "num", scope: "col" } : { scope: "col" }, label));
  t.append(el("thead", {}, tr));
  const body = el("tbody");
  for (const row of rows) {
    const r = el("tr", row.cls ? { class: row.cls } : {});
    row.cells.forEach((cell, i) => {
      const attrs = head[i][1] ? { class: "num" } : {};
      r.append(i === 0 ? el("th", { ...attrs, scope: "row" }, cell) : el("td", attrs, cell));
    });
    body.append(r);
  }
  t.append(body);
  return t;
}
const table = (id, head, rows) => fillTable($(id), head, rows);
function scrollBox(label, t) {
  return el("div", { class: "scroll", tabindex: "0", role: "region", "aria-label": label }, t);
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
  if (ENDPOINTS[q.get("q")]) state.question = q.get("q");
  $("model").value = q.get("model") || DEFAULT_MODEL;
  for (const f of FIELDS) {
    const value = q.get(f.id);
    $(f.id).value = value !== null ? value : f.def;
  }
  if (q.has("gpus")) state.gpus = q.get("gpus").split(",").map((s) => s.trim()).filter(Boolean);
  document.querySelector(`input[name=source][value=${state.source}]`).checked = true;
  document.querySelector(`input[name=question][value=${state.question}]`).checked = true;
  showSource();
  showQuestion();
}

function writeUrl() {
  const q = new URLSearchParams();
  if (state.question !== "train") q.set("q", state.question);
  if (state.source === "config") q.set("cfg", b64encode($("config").value));
  else q.set("model", $("model").value.trim());
  for (const f of FIELDS) {
    const value = $(f.id).value.trim();
    if (value !== f.def) q.set(f.id, value);
  }
  if (state.gpus.join(",") !== DEFAULT_GPUS.join(",")) q.set("gpus", state.gpus.join(","));
  const url = `${location.pathname}?${q.toString()}`;
  history.replaceState(null, "", url);
  $("share").href = url;
}

// --- the request --------------------------------------------------------------------------------
function applies(f, question) {
  if (!f.modes.includes(question)) return false;
  const method = $("method").value;
  if (f.only === "adapter") return method !== "full";
  if (f.only === "qlora") return method === "qlora";
  const objective = $("objective").value;
  if (f.only === "post") return objective !== "sft";
  if (f.only === "online") return objective === "grpo" || objective === "rloo";
  if (f.only === "generates") return ["grpo", "rloo", "ppo", "distill"].includes(objective);
  if (f.only === "distill") return objective === "distill";
  if (f.only === "ppo") return objective === "ppo";
  return true;
}

function requestBody(question) {
  const body = {};
  if (question === "plan") {
    if (!state.gpus.length) throw new Error("plan needs a GPU: add one under GPUs");
    body.gpus = state.gpus.slice(0, 1);
  } else {
    if (question.startsWith("fit") && !state.gpus.length) throw new Error("fit needs a GPU: add one under GPUs");
    body.gpus = state.gpus;
  }
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
  for (const f of FIELDS) {
    if (!applies(f, question)) continue;
    const raw = $(f.id).value.trim();
    if (raw === "") continue;  // the CLI's default
    if (f.id === "sharding") {
      if (raw.startsWith("zero-")) body.zero = Number(raw.slice(5));
      else if (raw.startsWith("fsdp-")) body.fsdp = raw.slice(5);
      continue;
    }
    if (f.bool) {
      body[f.id] = raw === "true";
    } else if (f.num) {
      const x = Number(raw);
      if (!Number.isFinite(x)) throw new Error(`${f.id}: must be a number`);
      body[f.id] = x;
    } else if (f.int) {
      if (!/^[0-9]+$/.test(raw)) throw new Error(`${f.key || f.id}: must be a positive whole number`);
      body[f.key || f.id] = Number(raw);
    } else {
      body[f.key || f.id] = raw;
    }
  }
  return body;
}

function schedule(delay = 120) {
  clearTimeout(timer);
  document.body.dataset.state = "pending";
  timer = setTimeout(() => run("change"), delay);
}

async function run(trigger) {
  clearTimeout(timer);
  writeUrl();
  const id = ++requestId;
  const question = state.question;
  document.body.dataset.state = "loading";
  document.body.dataset.trigger = trigger;
  for (const node of document.querySelectorAll("[aria-invalid]")) node.removeAttribute("aria-invalid");
  let body;
  try { body = requestBody(question); } catch (e) { showError(e.message); return; }
  if (inflight) inflight.abort();
  inflight = new AbortController();
  $("result").classList.add("loading");
  $("result").setAttribute("aria-busy", "true");
  try {
    const resp = await fetch(ENDPOINTS[question], {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
      signal: inflight.signal,
    });
    const data = await resp.json().catch(() => ({ error: `HTTP ${resp.status}` }));
    if (id !== requestId) return;  // a newer request is on its way
    if (!resp.ok) showError(data.error || `HTTP ${resp.status}`, data.suggestions, data.field);
    else {
      render(question, data);
      // on a phone the answer is below the form: show it when asked for with Enter or the button
      if (trigger === "submit" && window.matchMedia("(max-width: 860px)").matches) $("result").scrollIntoView();
    }
  } catch (e) {
    if (e.name !== "AbortError" && id === requestId) showError(`the server did not answer: ${e.message}`);
  } finally {
    if (id === requestId) {
      $("result").classList.remove("loading");
      $("result").removeAttribute("aria-busy");
    }
  }
}

// --- rendering ----------------------------------------------------------------------------------
function showError(message, suggestions, field) {
  const box = $("error");
  box.replaceChildren(message);
  if (suggestions && suggestions.length) {
    box.append(el("br"), "try: ");
    suggestions.forEach((s, i) => {
      const b = el("button", { type: "button" }, s);
      b.addEventListener("click", () => { $("model").value = s; showModelInfo(); schedule(0); });
      box.append(i ? " " : "", b);
    });
  }
  const f = field && FIELDS.find((x) => (x.key || x.id) === field && applies(x, state.question));
  if (f) $(f.id).setAttribute("aria-invalid", "true");
  else if (field === "model" || (field || "").startsWith("config")) {
    $(state.source === "config" ? "config" : "model").setAttribute("aria-invalid", "true");
  }
  box.hidden = false;
  $("details").hidden = true;  // no stale numbers next to an error
  $("answer").textContent = "";
  $("band").hidden = true;
  $("verdicts").replaceChildren();
  for (const id of ["total", "allocated", "reserved", "peak-phase"]) $(id).textContent = "—";
  document.body.dataset.state = "error";
}

function gpuName(name) {
  const g = catalog.gpus.get(name);
  return g ? g.display_name.replace(/^NVIDIA (GeForce )?/, "") : name;
}

function render(question, data) {
  last = [question, data];
  $("error").hidden = true;
  $("details").hidden = false;
  for (const id of ["fit-view", "plan-view", "ranks-view", "search-box"]) $(id).hidden = true;
  $("estimate-view").hidden = false;
  $("totals").hidden = false;
  if (question === "plan") renderPlan(data);
  else if (question === "fit" || question === "fit_infer") renderFit(question, data);
  else {
    renderEstimate(data);
    renderVerdicts(data.verdicts || []);
    $("answer").textContent = data.headline;
  }
  document.body.dataset.mode = question;
  document.body.dataset.state = "ready";
}

// The training or serving answer: totals, band, per rank, chart, tables.
function renderEstimate(data) {
  $("total").textContent = fmtBoth(data.device_total_bytes);
  $("allocated").textContent = fmtGB(data.peak_allocated_bytes);
  $("reserved").textContent = fmtGB(data.peak_reserved_bytes);
  $("peak-phase").textContent = data.peak_phase;
  if (data.job === "train" && data.setup && data.setup.seq_len) $("seq").placeholder = `default ${data.setup.seq_len}`;
  if (data.job === "infer" && data.setup && data.setup.context) $("context").placeholder = `default ${data.setup.context}`;
  renderBand(data.band);
  renderRanks(data);
  const bars = data.chart || [];
  $("chart-title").textContent = bars.length > 1 ? "Ways to bring it down" : "Where the memory goes";
  renderChart(bars, data.verdicts || []);
  renderTables(data);
}

// The band (low/likely/high per quantity and the terms that widen it), when the JSON has one.
function renderBand(band) {
  const line = $("band");
  const box = $("band-box");
  const total = band && band.device_total;
  if (!total) { line.hidden = true; box.hidden = true; return; }
  const parts = [`needs ≈ ${fmtGB(total.likely_bytes, 1)} (${fmtRange(total)}) on the device`];
  if (band.allocated) parts.push(`allocated ≈ ${fmtGB(band.allocated.likely_bytes, 1)} (${fmtRange(band.allocated)})`);
  if (band.reserved) parts.push(`reserved ≈ ${fmtGB(band.reserved.likely_bytes, 1)} (${fmtRange(band.reserved)})`);
  line.textContent = parts.join("; ");
  line.hidden = false;
  const terms = band.terms || [];
  box.hidden = !terms.length;
  table("band-terms", [["term"], ["low", 1], ["high", 1], ["source"]], terms.map((t) => ({
    cells: [t.name, fmtTerm(t.low_bytes), fmtTerm(t.high_bytes), t.source || ""],
  })));
}

function verdictState(v) {
  return STATE_CLASS[v.verdict] ? v.verdict : (v.fits ? "fits" : "does not fit");
}

function verdictText(v) {
  const st = verdictState(v);
  let text = `${gpuName(v.gpu)} (${fmtGB(v.capacity_bytes, 1)}): ${st}`;
  if (typeof v.headroom_bytes === "number") {
    text += v.headroom_bytes >= 0 ? `, ${fmtGB(v.headroom_bytes, 1)} to spare` : `, ${fmtGB(-v.headroom_bytes, 1)} short`;
  }
  return text;
}

// One chip per GPU: fits / tight / does not fit (the JSON's verdict when it has one).
function renderVerdicts(rows, extra = () => "") {
  const box = $("verdicts");
  box.replaceChildren();
  for (const v of rows) {
    let text = verdictText(v);
    if (typeof v.max_concurrent === "number") text += ` · the KV pool holds ${fmtInt(v.max_concurrent)} sequences`;
    text += extra(v);
    box.append(el("li", { class: `verdict ${STATE_CLASS[verdictState(v)]}`, "data-gpu": v.gpu, "data-verdict": verdictState(v) }, text));
  }
}

function renderRanks(data) {
  const ranks = data.ranks || [];
  if (!ranks.length) return;
  $("ranks-view").hidden = false;
  $("layout").textContent = data.layout ? `(${data.layout})` : "";
  table("ranks", [["rank type"], ["ranks", 1], ["device total", 1], ["allocated (phase)", 1], ["model states", 1],
    ["NCCL buffers", 1], ["CPU pinned", 1]], ranks.map((r) => ({
    cells: [r.role + (typeof r.stage === "number" ? ` (stage ${r.stage})` : ""), fmtInt(r.ranks), fmtBoth(r.device_total_bytes),
      `${fmtGB(r.peak_allocated_bytes)} (${r.peak_phase})`, fmtGB(r.model_state_bytes), fmtGB(r.nccl_bytes || 0),
      fmtGB(r.cpu_pinned_bytes || 0)],
  })));
  const cpu = [];
  if (typeof data.cpu_per_node_bytes === "number") {
    cpu.push(`CPU RAM per node: ${fmtBoth(data.cpu_per_node_bytes)} (pinned offload ${fmtGB(data.cpu_pinned_per_node_bytes || 0)}, model loading ${fmtGB(data.cpu_load_per_node_bytes || 0)})`);
  }
  if (data.nvme_per_node_bytes) cpu.push(`NVMe per node: ${fmtGB(data.nvme_per_node_bytes)}`);
  $("cpu-line").textContent = cpu.join("; ");
}

// The changes that make a job fit (a fit answer's candidates or singles), as the CLI's tables.
function changesTable(cands, serving, baseNeed, attrs) {
  const head = serving
    ? [["change"], ["per GPU", 1], ["fits"], ["GPUs", 1], ["sequences the pool holds", 1], ["note"]]
    : [["change"], ["needs", 1], ["vs now", 1], ["fits"], ["headroom", 1], ["step", 1], ["cost", 1], ["note"]];
  const rows = cands.map((c) => {
    const note = [];
    if (c.gpus > 1 && !serving) note.push(`${c.gpus} GPUs`);
    if (c.cpu_bytes) note.push(`CPU ${fmtGB(c.cpu_bytes)}`);
    if (c.changes_job) note.push("changes the job");
    const fits = c.fits ? "yes" : "no";
    const cells = serving
      ? [c.label, fmtGB(c.needed_bytes), fits, fmtInt(c.gpus), c.max_concurrent == null ? "" : fmtInt(c.max_concurrent), note.join(", ")]
      : [c.label, fmtGB(c.needed_bytes), fmtSigned(c.needed_bytes - baseNeed), fits, fmtSigned(c.headroom_bytes),
        c.step_time ? fmtSeconds(c.step_time.total_s) : "", typeof c.relative_cost === "number" ? `${c.relative_cost.toFixed(2)}x` : "",
        note.join(", ")];
    return { cells, cls: c.fits ? "" : "nofit" };
  });
  return fillTable(el("table", attrs), head, rows);
}

// fit (training) and fit --infer: a verdict row per GPU, the changes that make it fit, and the
// answer as asked (the API's `estimate`) below.
function renderFit(question, data) {
  const serving = question === "fit_infer";
  const est = data.estimate;
  renderEstimate(est);
  const smallest = data.smallest_sufficient;
  $("answer").textContent = `${data.headline} ` + (smallest
    ? `Of the GPUs given, the smallest sufficient is ${gpuName(smallest)}.`
    : "It fits none of the GPUs given; the changes below make it fit.");
  renderVerdicts(data.gpus, (g) => {
    const lim = g.limits || {};
    if (!serving && verdictState(g) !== "does not fit" && lim.largest_micro_batch) return ` · batch up to ${fmtInt(lim.largest_micro_batch)}`;
    if (verdictState(g) === "does not fit" && g.candidates && g.candidates.length) return ` · fits with: ${g.candidates[0].label}`;
    return "";
  });
  $("fit-view").hidden = false;
  const head = serving
    ? [["GPU"], ["memory", 1], ["needs", 1], ["verdict"], ["headroom", 1], ["longest context", 1], ["most sequences", 1]]
    : [["GPU"], ["memory", 1], ["needs", 1], ["verdict"], ["headroom", 1], ["largest micro-batch", 1], ["longest sequence", 1], ["fewest GPUs"]];
  table("fit-table", head, data.gpus.map((g) => {
    const cells = [gpuName(g.gpu), fmtGB(g.capacity_bytes), fmtGB(g.needed_bytes), verdictState(g), fmtSigned(g.headroom_bytes)];
    if (serving) cells.push(fmtInt(g.max_context), fmtInt(g.max_concurrent));
    else {
      const lim = g.limits || {};
      cells.push(lim.largest_micro_batch ? fmtInt(lim.largest_micro_batch) : "none",
        lim.longest_seq ? fmtInt(lim.longest_seq) + (lim.seq_capped_at_context ? " (the model's context)" : "") : "none",
        lim.fewest_gpus_layout || lim.note || "–");
    }
    return { cells, cls: STATE_CLASS[verdictState(g)] };
  }));
  const box = $("fit-changes");
  box.replaceChildren();
  for (const g of data.gpus) {
    if (g.fits) continue;  // as the CLI: the changes for each GPU it does not fit
    const cands = g.candidates || [];
    const title = `What makes it fit on ${gpuName(g.gpu)}`;
    box.append(el("h3", {}, title));
    if (cands.length) box.append(scrollBox(title, changesTable(cands, serving, g.needed_bytes, { class: "changes", "data-gpu": g.gpu })));
    else box.append(el("p", { class: "note" }, "No combination of the searched changes fits."));
    const singles = g.singles || [];
    if (singles.length) {
      const label = `Each change alone on ${gpuName(g.gpu)}`;
      box.append(el("details", { class: "singles" }, el("summary", {}, `${label} (why not X)`),
        scrollBox(label, changesTable(singles, serving, g.needed_bytes, { "data-gpu": g.gpu }))));
    }
  }
  const space = (data.search_space || []).map((f) => {
    const options = f.options && f.options.length && f.status === "searched" ? `: ${f.options.join(", ")}` : "";
    return el("li", {}, `${f.name}: ${f.status}${f.reason ? ` (${f.reason})` : ""}${options}`);
  });
  $("search-space").replaceChildren(...space);
  $("search-box").hidden = !space.length;
  $("assumptions").replaceChildren(...[...(data.assumptions || []), ...(est.assumptions || [])].map((a) => el("li", {}, a)));
}

// plan: the fastest layouts that fit, per-rank memory of the most loaded rank.
function renderPlan(data) {
  $("estimate-view").hidden = true;
  $("totals").hidden = true;
  $("band").hidden = true;
  $("verdicts").replaceChildren();
  $("plan-view").hidden = false;
  const gpu = gpuName(data.gpu);
  const best = (data.layouts || [])[0];
  $("answer").textContent = best
    ? `${data.model.name} on up to ${fmtInt(data.max_gpus)} x ${gpu}: fastest layout ${best.layout} — ` +
      `${fmtSeconds(best.step_time.total_s)} per step of ${fmtInt(data.global_batch)} x ${fmtInt(data.seq_len)} tokens; ` +
      `most loaded rank ${fmtGB(best.needed_bytes)} of ${fmtGB(best.capacity_bytes)}.`
    : `${data.model.name}: no layout searched fits on up to ${fmtInt(data.max_gpus)} x ${gpu}.`;
  $("plan-scope").textContent = data.scope ? `scope: ${data.scope}` : "";
  table("plan-table", [["#"], ["GPUs", 1], ["dp x tp x pp"], ["engine"], ["micro-batch x n", 1], ["ckpt"],
    ["per rank (most loaded)", 1], ["headroom", 1], ["step", 1], ["tokens/s/GPU", 1]], (data.layouts || []).map((lay, i) => {
    const shape = `${lay.dp} x ${lay.tp} x ${lay.pp}` + ["cp", "ep"].filter((k) => lay[k] > 1).map((k) => `, ${k}=${lay[k]}`).join("");
    const top = (lay.ranks || [])[0];
    const perRank = fmtGB(lay.needed_bytes) + (top && top.role !== "all ranks" ? ` (${top.role})` : "");
    return { cells: [String(i + 1), fmtInt(lay.gpus), shape, lay.engine, `${lay.micro_batch} x ${lay.grad_accum}`, lay.checkpointing,
      perRank, fmtSigned(lay.headroom_bytes), fmtSeconds(lay.step_time.total_s),
      fmtInt(Math.round(lay.step_time.tokens_per_s / Math.max(1, lay.gpus)))] };
  }));
  const space = (data.search_space || []).map((fam) => el("li", {},
    `${fam.name}: ${fam.status}${fam.reason ? ` (${fam.reason})` : ""}${fam.options && fam.options.length ? `: ${fam.options.join(", ")}` : ""}`));
  $("search-space").replaceChildren(...space);
  $("search-box").hidden = !space.length;
  const f = data.fewest_gpus;
  $("plan-fewest").textContent = f
    ? `fewest GPUs: ${f.layout}; most loaded rank ${fmtGB(f.needed_bytes)}; ${fmtSeconds(f.step_time.total_s)} per step` : "";
  $("assumptions").replaceChildren(...(data.assumptions || []).map((a) => el("li", {}, a)));
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
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-label": `memory by technique: ${bars.map((b) => `${b.label} ${fmtGB(b.device_total_bytes)}`).join("; ")}` });
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
  const perParam = rows.map((r) => ({ cells: [r.tensor, r.dtype, fmtPerParam(r.bytes), fmtInt(r.params), fmtBoth(r.total_bytes)] }));
  if (rows.length) {
    // model-state bytes over the model's parameters (peakmem.render.states_per_param): with adapters
    // the rows cover different parameter sets, so their bytes/param do not add up
    const params = data.model && data.model.params;
    const perParamTotal = params ? fmtPerParam(data.model_state_bytes / params) : "";
    perParam.push({ cls: "total", cells: ["model states", "", perParamTotal, "", fmtBoth(data.model_state_bytes)] });
  }
  table("per-param", [["tensor"], ["dtype"], ["bytes/param", 1], ["params", 1], ["total", 1]], perParam);
  const peak = Math.max(data.peak_allocated_bytes, 1);
  const cats = Object.entries(data.breakdown).map(([c, b]) => ({
    cells: [CATEGORY_LABELS[c] || c, fmtBoth(b), `${fixed((100 * b) / peak, 1)}%`],
  }));
  cats.push({ cls: "total", cells: ["peak allocated", fmtBoth(data.peak_allocated_bytes), ""] });
  cats.push({ cells: ["peak reserved (caching allocator)", fmtBoth(data.peak_reserved_bytes), ""] });
  cats.push({ cls: "total", cells: ["device total (nvidia-smi)", fmtBoth(data.device_total_bytes), ""] });
  if (data.releasable_cache_bytes) {  // batches of varying lengths: cache the allocator frees before an OOM
    cats.push({ cells: ["of it, cache freed before an OOM", fmtBoth(data.releasable_cache_bytes), ""] });
    cats.push({ cls: "total", cells: ["needed on the device", fmtBoth(data.needed_bytes), ""] });
  }
  table("breakdown", [["category"], ["bytes", 1], ["share", 1]], cats);
  table("phases", [["phase"], ["allocated", 1]], Object.entries(data.phases).map(([p, b]) => ({
    cls: p === data.peak_phase ? "peak" : "", cells: [p === data.peak_phase ? `${p} ← peak` : p, fmtBoth(b)],
  })));
  const ways = data.ways_down || [];
  $("ways-view").hidden = data.job !== "train";
  table("ways", [["change"], ["needs", 1], ["saving", 1]], ways.map((w) => ({
    cells: [w.change, fmtBoth(w.needed_bytes), fmtGB(w.saving_bytes)],
  })));
  $("ways-note").textContent = data.ways_down_note ? `Not listed: ${data.ways_down_note}.` : "";
  $("assumptions").replaceChildren(...(data.assumptions || []).map((a) => el("li", {}, a)));
}

// --- GPUs ----------------------------------------------------------------------------------------
function renderChips() {
  const box = $("gpu-chips");
  box.replaceChildren();
  state.gpus.forEach((name, i) => {
    const remove = el("button", { type: "button", "aria-label": `remove ${gpuName(name)}`, title: "remove" }, "×");
    remove.addEventListener("click", () => { state.gpus.splice(i, 1); renderChips(); schedule(0); });
    box.append(el("li", { class: "chip", "data-gpu": name }, gpuName(name), remove));
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
  if (last && $("error").hidden) render(...last);
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

// Only the fieldsets (and fields) of the question asked are shown, so Tab visits only those.
function showQuestion() {
  for (const box of document.querySelectorAll("fieldset[data-modes]")) {
    box.hidden = !box.dataset.modes.split(" ").includes(state.question);
  }
  const method = $("method").value;
  for (const node of document.querySelectorAll("[data-adapter]")) node.hidden = method === "full";
  for (const node of document.querySelectorAll("[data-qlora]")) node.hidden = method !== "qlora";
}

// --- wiring -------------------------------------------------------------------------------------
function init() {
  restoreFromUrl();
  renderChips();
  for (const radio of document.querySelectorAll("input[name=source]")) {
    radio.addEventListener("change", () => { state.source = radio.value; showSource(); schedule(0); });
  }
  for (const radio of document.querySelectorAll("input[name=question]")) {
    radio.addEventListener("change", () => { state.question = radio.value; showQuestion(); schedule(0); });
  }
  $("model").addEventListener("change", () => { showModelInfo(); schedule(0); });
  $("model").addEventListener("input", () => {
    showModelInfo();
    if (catalog.models.has($("model").value.trim().toLowerCase())) schedule(0);
  });
  $("config").addEventListener("input", () => schedule(400));
  for (const f of FIELDS) {
    const node = $(f.id);
    node.addEventListener(node.tagName === "SELECT" ? "change" : "input", () => {
      if (f.id === "method") showQuestion();
      schedule(f.int || node.tagName === "SELECT" ? 120 : 400);
    });
  }
  $("gpu-select").addEventListener("change", (e) => { addGpu(e.target.value); e.target.value = ""; });
  $("gpu-size-add").addEventListener("click", () => { addGpu($("gpu-size").value); $("gpu-size").value = ""; });
  $("gpu-size").addEventListener("keydown", (e) => {
    if (e.key === "Enter") { e.preventDefault(); addGpu($("gpu-size").value); $("gpu-size").value = ""; }
  });
  $("controls").addEventListener("submit", (e) => { e.preventDefault(); run("submit"); });
  loadCatalogs().catch((e) => showError(`could not load the catalogs: ${e.message}`));
  run("load");
}

document.addEventListener("DOMContentLoaded", init);
