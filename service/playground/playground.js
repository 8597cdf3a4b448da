// patchserve playground: calls this server's own API with fetch(); loads nothing from elsewhere.
//
// What a model can do is read from GET /v1/models: the routes each version serves
// (`serves`), else the verb of its task (classification -> classify, detection -> detect,
// embedding -> embed). The answer is drawn by its shape, not by the verb: `predictions` as
// score bars, `detections` as boxes over the image (filtered here by the threshold slider,
// without posting again), any array of numbers (an embedding) as its first values.
"use strict";

const TASK_VERBS = { classification: "classify", detection: "detect", embedding: "embed" };
const REQUEST_THRESHOLD = 0.05; // detections are asked for down to here; the slider filters above it
const SHOWN_VALUES = 8;

const state = { key: "", models: new Map(), image: null, imageName: "", answer: null, previewURL: null };
const $ = (id) => document.getElementById(id);

function headers() {
  return state.key ? { Authorization: "Bearer " + state.key } : {};
}

function setStatus(status) {
  document.body.dataset.status = status;
}

async function problemOf(response) {
  // RFC 9457 problem+json: title and detail; anything else: the status line.
  try {
    const body = await response.json();
    return { title: body.title || `HTTP ${response.status}`, detail: body.detail || "" };
  } catch (error) {
    return { title: `HTTP ${response.status}`, detail: response.statusText };
  }
}

function showProblem(problem) {
  $("problem-title").textContent = problem.title;
  $("problem-detail").textContent = problem.detail;
  $("problem").hidden = false;
  setStatus("error");
}

function clearProblem() {
  $("problem").hidden = true;
}

function verbsOf(model) {
  // Each version lists the routes it serves (`serves`, e.g. ["classify", "embed"]).
  const verbs = new Set();
  for (const version of model.versions || []) (version.serves || []).forEach((verb) => verbs.add(verb));
  if (verbs.size === 0 && TASK_VERBS[model.task]) verbs.add(TASK_VERBS[model.task]);
  return [...verbs];
}

async function loadModels() {
  const select = $("model");
  const previous = select.value;
  let response;
  try {
    response = await fetch("/v1/models", { headers: headers() });
  } catch (error) {
    showProblem({ title: "The server cannot be reached", detail: String(error) });
    return;
  }
  if (!response.ok) {
    showProblem(await problemOf(response));
    select.replaceChildren(new Option(response.status === 401 ? "enter the API key" : "unavailable", ""));
    return;
  }
  clearProblem();
  const body = await response.json();
  state.models = new Map(body.models.map((model) => [model.name, model]));
  select.replaceChildren(...body.models.map((model) => new Option(`${model.name} (${model.task})`, model.name)));
  if (state.models.has(previous)) select.value = previous;
  select.disabled = false;
  modelChanged();
  setStatus("ready");
}

function modelChanged() {
  const model = state.models.get($("model").value);
  if (!model) return;
  const verbs = verbsOf(model);
  $("verb").replaceChildren(...verbs.map((verb) => new Option(verb, verb)));
  $("verb-field").hidden = verbs.length < 2;
  const latest = (model.versions || []).find((v) => v.version === model.latest_version) || {};
  const input = latest.input || {};
  $("model-info").textContent =
    `version ${model.latest_version} · input ${input.width}×${input.height} ${input.color_mode || ""} · ` +
    `${latest.labels_count ?? "?"} labels · ${latest.provider || ""}`;
  if (state.image) run();
}

async function loadExamples() {
  try {
    const response = await fetch("/playground/examples");
    if (!response.ok) return;
    const { examples } = await response.json();
    if (!examples.length) return; // none packaged: the choice stays hidden
    $("example").append(...examples.map((example) => new Option(example.name, example.url)));
    $("example-field").hidden = false;
  } catch (error) {
    // no examples: nothing to offer
  }
}

async function chooseExample() {
  const url = $("example").value;
  if (!url) return;
  const response = await fetch(url);
  if (!response.ok) {
    showProblem(await problemOf(response));
    return;
  }
  setImage(await response.blob(), url.split("/").pop());
}

function setImage(blob, name) {
  state.image = blob;
  state.imageName = name || "image";
  if (state.previewURL) URL.revokeObjectURL(state.previewURL);
  state.previewURL = URL.createObjectURL(blob);
  $("preview").src = state.previewURL;
  $("stage").hidden = false;
  run();
}

function parseServerTiming(header) {
  // "decode;dur=1.2, queue;dur=0.3, compute;dur=5.1, total;dur=7.9" -> {decode: 1.2, ...} (ms)
  const timings = {};
  for (const entry of (header || "").split(",")) {
    const [name, ...params] = entry.trim().split(";");
    const dur = params.map((p) => p.trim()).find((p) => p.startsWith("dur="));
    if (name && dur) timings[name] = Number(dur.slice(4));
  }
  return timings;
}

function showTiming(header) {
  const t = parseServerTiming(header);
  const parts = ["decode", "queue", "compute"].filter((name) => name in t);
  if (!parts.length) {
    $("timing").hidden = true;
    return;
  }
  const known = parts.reduce((sum, name) => sum + t[name], 0);
  const total = Math.max(t.total || known, known, 1e-6);
  const bar = $("timing-bar");
  bar.replaceChildren();
  const segments = [...parts.map((name) => [name, t[name]]), ["other", total - known]];
  for (const [name, ms] of segments) {
    const span = document.createElement("span");
    span.className = name;
    span.style.width = `${(100 * ms) / total}%`;
    span.title = `${name} ${ms.toFixed(2)} ms`;
    bar.append(span);
  }
  const text = $("timing-text");
  text.replaceChildren();
  for (const [name, ms] of segments) {
    const swatch = document.createElement("span");
    swatch.className = `swatch ${name}`;
    swatch.style.background = `var(--${name})`;
    text.append(swatch, `${name} ${ms.toFixed(1)} ms`);
  }
  text.append(` · total ${total.toFixed(1)} ms (Server-Timing)`);
  $("timing").hidden = false;
}

function hideAnswers() {
  for (const id of ["predictions", "detections", "vector", "heatmap-figure", "raw-details"]) $(id).hidden = true;
  $("overlay").replaceChildren();
}

function showPredictions(predictions) {
  const list = $("predictions");
  list.replaceChildren();
  for (const p of predictions) {
    const item = document.createElement("li");
    item.className = "prediction";
    const label = document.createElement("span");
    label.className = "label";
    label.textContent = p.label;
    const bar = document.createElement("span");
    bar.className = "bar";
    const fill = document.createElement("span");
    fill.style.width = `${Math.max(0, Math.min(1, p.score)) * 100}%`;
    bar.append(fill);
    const score = document.createElement("span");
    score.className = "score";
    score.textContent = p.score.toFixed(3);
    item.append(label, bar, score);
    list.append(item);
  }
  list.hidden = false;
}

function drawDetections() {
  const answer = state.answer;
  if (!answer || !Array.isArray(answer.detections)) return;
  const threshold = Number($("threshold").value);
  $("threshold-value").textContent = threshold.toFixed(2);
  const svg = $("overlay");
  const ns = "http://www.w3.org/2000/svg";
  svg.setAttribute("viewBox", `0 0 ${answer.image.width} ${answer.image.height}`);
  svg.replaceChildren();
  const shown = answer.detections.filter((d) => d.score >= threshold);
  for (const d of shown) {
    const group = document.createElementNS(ns, "g");
    group.setAttribute("class", "box");
    group.dataset.label = d.label;
    const rect = document.createElementNS(ns, "rect");
    rect.setAttribute("x", d.box.xmin);
    rect.setAttribute("y", d.box.ymin);
    rect.setAttribute("width", Math.max(0, d.box.xmax - d.box.xmin));
    rect.setAttribute("height", Math.max(0, d.box.ymax - d.box.ymin));
    const text = document.createElementNS(ns, "text");
    text.setAttribute("x", d.box.xmin + 2);
    text.setAttribute("y", Math.max(12, d.box.ymin - 3));
    text.textContent = `${d.label} ${d.score.toFixed(2)}`;
    group.append(rect, text);
    svg.append(group);
  }
  $("detections-count").textContent =
    `${shown.length} of ${answer.detections.length} detections (score ≥ ${REQUEST_THRESHOLD}) drawn`;
  $("detections").hidden = false;
}

function numericArray(value) {
  return Array.isArray(value) && value.length > 0 && value.every((x) => typeof x === "number");
}

function showVector(answer) {
  const [name, values] = Object.entries(answer).find(([, value]) => numericArray(value)) || [];
  if (!values) return false;
  const norm = Math.sqrt(values.reduce((sum, x) => sum + x * x, 0));
  $("vector-summary").textContent = `${name}: ${values.length} values, L2 norm ${norm.toFixed(3)}; the first ${Math.min(SHOWN_VALUES, values.length)}:`;
  $("vector-values").textContent = values.slice(0, SHOWN_VALUES).map((x) => x.toFixed(4)).join(", ");
  $("vector").hidden = false;
  return true;
}

function imageForm() {
  const form = new FormData();
  form.append("image", state.image, state.imageName);
  return form;
}

async function showHeatMap(name, verb) {
  // Only a model that exports attention maps draws one; any other answers a problem, and nothing is shown.
  const response = await fetch(`/v1/models/${encodeURIComponent(name)}/${verb}?render=png`, {
    method: "POST",
    headers: headers(),
    body: imageForm(),
  });
  if (!response.ok || !(response.headers.get("content-type") || "").startsWith("image/png")) return;
  const heatmap = $("heatmap");
  if (heatmap.src) URL.revokeObjectURL(heatmap.src);
  heatmap.src = URL.createObjectURL(await response.blob());
  $("heatmap-figure").hidden = false;
}

let runs = 0;

async function run() {
  const name = $("model").value;
  const verb = $("verb").value;
  if (!state.image || !name || !verb) return;
  const mine = ++runs;
  setStatus("busy");
  clearProblem();
  hideAnswers();
  state.answer = null;
  const params = new URLSearchParams();
  if (verb === "detect") params.set("threshold", REQUEST_THRESHOLD);
  const query = params.toString() ? `?${params}` : "";
  let response;
  try {
    response = await fetch(`/v1/models/${encodeURIComponent(name)}/${verb}${query}`, {
      method: "POST",
      headers: { ...headers(), Accept: "application/json" },
      body: imageForm(),
    });
  } catch (error) {
    showProblem({ title: "The request failed", detail: String(error) });
    return;
  }
  if (mine !== runs) return; // a newer run started meanwhile
  showTiming(response.headers.get("server-timing"));
  if (!response.ok) {
    document.body.dataset.answered = `${name}/${verb}:${state.imageName}`;
    showProblem(await problemOf(response));
    return;
  }
  const answer = await response.json();
  state.answer = answer;
  $("raw").textContent = JSON.stringify(answer, null, 2);
  $("raw-details").hidden = false;
  if (Array.isArray(answer.predictions)) showPredictions(answer.predictions);
  else if (Array.isArray(answer.detections)) drawDetections();
  else showVector(answer);
  if (Array.isArray(answer.predictions)) await showHeatMap(name, verb);
  if (mine === runs) {
    document.body.dataset.answered = `${name}/${verb}:${state.imageName}`; // what the page now shows
    setStatus("done");
  }
}

function wireDropZone() {
  const drop = $("drop");
  drop.addEventListener("dragover", (event) => {
    event.preventDefault();
    drop.classList.add("over");
  });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (event) => {
    event.preventDefault();
    drop.classList.remove("over");
    const file = event.dataTransfer.files[0];
    if (file) setImage(file, file.name);
  });
  $("file").addEventListener("change", () => {
    const file = $("file").files[0];
    if (file) setImage(file, file.name);
  });
}

document.addEventListener("DOMContentLoaded", () => {
  wireDropZone();
  $("model").addEventListener("change", modelChanged);
  $("verb").addEventListener("change", run);
  $("example").addEventListener("change", chooseExample);
  $("threshold").addEventListener("input", drawDetections);
  $("key").addEventListener("change", () => {
    state.key = $("key").value.trim(); // kept in this page's memory only
    loadModels();
  });
  loadExamples();
  loadModels();
});
