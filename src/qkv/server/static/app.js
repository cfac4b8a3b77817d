// qkv playground: plain JavaScript, no build step, no external resources.
// It talks to the same server's API: /v1/model, /v1/next-token, /v1/completions (streamed), /v1/translations,
// /v1/attention (attention-panel.js asks for it and draws it), /v1/walkthrough (walkthrough-panel.js asks for it;
// walkthrough.js, which `qkv lens --html` pages share, draws it) and /v1/chat/completions (chat-panel.js, for a
// model with a chat template). The numbers and token labels are the server's (the same `qkv next` and
// `qkv attention` print); this file only draws them. Each section below owns one part of the page.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { info: null, attention: null, chartSeq: 0, attentionSeq: 0, walkthroughSeq: 0, walkthroughText: null, generation: null };

// ------------------------------------------------------------------------------------------ helpers

function debounce(fn, ms) {
  let timer = null;
  return (...args) => { clearTimeout(timer); timer = setTimeout(() => fn(...args), ms); };
}

/** POST JSON and return the parsed body; a non-2xx answer throws its error message. */
async function post(path, body, signal) {
  const response = await fetch(path, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal,
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error((data.error && data.error.message) || `HTTP ${response.status}`);
  return data;
}

function sampling() {
  const topK = Number($("top-k").value);
  const topP = Number($("top-p").value);
  return { temperature: Number($("temperature").value), top_k: topK > 0 ? topK : null, top_p: topP < 1 ? topP : null };
}

// What the page shows follows what the server says the model offers (its role and endpoints), never its kind.
const serves = (endpoint) => Boolean(state.info && state.info.endpoints.includes(endpoint));
const isTranslator = () => Boolean(state.info && state.info.role === "translator");
const canPredict = () => serves("/v1/next-token");

// ------------------------------------------------------------------------------------- model info

async function loadInfo() {
  const info = await (await fetch("/v1/model")).json();
  state.info = info;
  const layers = isTranslator()
    ? `${info.encoder_layers} encoder + ${info.decoder_layers} decoder layers` : `${info.layers} layers`;
  $("model-info").textContent = `${info.name}: ${info.description} · `
    + `${info.parameters.toLocaleString()} parameters · `
    + `${layers} × ${info.heads} heads · d_model ${info.d_model} · context ${info.context_length} tokens · `
    + `${info.tokenizer} tokenizer, ${info.vocab_size.toLocaleString()} tokens`;
  $("max-tokens").max = info.limits.max_tokens;
  if (isTranslator()) {
    $("prompt-label").textContent = "Source sentence";
    $("prompt").value = "one two three";
    $("target-row").hidden = false;
    $("generate-heading").textContent = "Translate";
    $("generate").textContent = "Translate";
    for (const id of ["max-tokens", "max-tokens-label", "seed", "seed-label", "continue", "stop"]) $(id).hidden = true;
    $("beam").hidden = $("beam-label").hidden = false;
  } else if (!canPredict()) {  // an encoder: it reads a text and predicts nothing
    $("prompt-label").textContent = "Text";
    $("sampling-section").hidden = $("generate-section").hidden = true;
  }
  showChat(info);
  if (!serves("/v1/walkthrough")) {
    $("show-walkthrough").disabled = true;
    $("walkthrough-status").textContent = `${info.unavailable["/v1/walkthrough"]}. `
      + "The attention view above shows its attention.";
  }
}

// ----------------------------------------------------------------------------- next-token chart

function showControls() {
  const s = sampling();
  $("temperature-value").textContent = s.temperature === 0 ? "0 (greedy)" : s.temperature.toFixed(2);
  $("top-k-value").textContent = s.top_k === null ? "off" : String(s.top_k);
  $("top-p-value").textContent = s.top_p === null ? "off" : s.top_p.toFixed(2);
}

async function updateChart() {
  if (!canPredict()) return;
  const seq = ++state.chartSeq;
  const body = { prompt: $("prompt").value, target: $("target").value, n: 15, ...sampling() };
  try {
    const data = await post("/v1/next-token", body);
    if (seq === state.chartSeq) renderChart(data);
  } catch (error) {
    if (seq === state.chartSeq) $("chart-summary").textContent = error.message;
  }
}

function renderChart(data) {
  const chart = $("chart");
  chart.replaceChildren();
  for (const t of data.tokens) {
    const row = document.createElement("div");
    row.className = "bar-row" + (t.prob === 0 ? " removed" : "");
    row.setAttribute("role", "listitem");
    const pct = (100 * t.prob).toFixed(1) + "%";
    row.setAttribute("aria-label", `${JSON.stringify(t.text)}: ${pct} (at T = 1: ${(100 * t.prob_t1).toFixed(1)}%)`);
    row.innerHTML = '<span class="tok"></span><div class="track"><div class="bar"></div><div class="mark"></div></div>'
      + '<span class="pct"></span>';
    row.querySelector(".tok").textContent = t.label;
    row.querySelector(".tok").title = `token ${t.id}: ${JSON.stringify(t.token)} · logit ${t.logit.toFixed(3)}`;
    row.querySelector(".bar").style.width = `${100 * t.prob}%`;
    row.querySelector(".mark").style.left = `calc(${100 * t.prob_t1}% - 1px)`;
    row.querySelector(".pct").textContent = pct;
    chart.appendChild(row);
  }
  chart.dataset.version = String(Number(chart.dataset.version) + 1);
  const shown = data.tokens.reduce((sum, t) => sum + t.prob, 0);
  const read = isTranslator() ? `Source of ${data.context_tokens} tokens` : `After ${data.context_tokens} tokens`;
  $("chart-summary").textContent = `${read}: ${data.kept.toLocaleString()} token(s) can `
    + `be drawn; these ${data.tokens.length} hold ${(100 * shown).toFixed(1)}% of the probability; `
    + `entropy ${data.entropy_bits.toFixed(2)} bits.`;
}

const updateChartSoon = debounce(updateChart, 120);

// ------------------------------------------------------------------------------------ generation

function outputStart() {
  const out = $("output");
  const prompt = Object.assign(document.createElement("span"), { className: "prompt", textContent: $("prompt").value });
  out.replaceChildren(prompt);
  out.dataset.state = "running";
  out.dataset.tokens = "0";
  return out;
}

function outputToken(text) {
  const span = Object.assign(document.createElement("span"), { className: "token", textContent: text });
  $("output").appendChild(span);
  $("output").dataset.tokens = String(Number($("output").dataset.tokens) + 1);
}

function setRunning(running) {
  $("generate").disabled = running;
  $("stop").disabled = !running;
  $("continue").disabled = running || $("output").querySelectorAll(".token").length === 0;
}

/** Read server-sent events from a fetch body; call onEvent with each parsed `data:` payload. */
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (line.startsWith("data: ")) onEvent(line.slice(6));
      }
    }
  }
}

async function generate() {
  if (isTranslator()) return translate();
  const controller = new AbortController();
  state.generation = controller;
  const seed = $("seed").value.trim();
  const body = {
    prompt: $("prompt").value, max_tokens: Number($("max-tokens").value), stream: true,
    ...sampling(), ...(seed === "" ? {} : { seed: Number(seed) }),
  };
  const out = outputStart();
  setRunning(true);
  $("generate-status").textContent = "Generating…";
  const started = performance.now();
  let finish = null, usage = null;
  try {
    const response = await fetch("/v1/completions", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!response.ok) {
      const data = await response.json().catch(() => ({}));
      throw new Error((data.error && data.error.message) || `HTTP ${response.status}`);
    }
    await readEvents(response, (payload) => {
      if (payload === "[DONE]") return;
      const data = JSON.parse(payload);
      if (data.error) throw new Error(data.error.message);
      const choice = data.choices[0];
      if (choice.text) outputToken(choice.text);
      if (choice.finish_reason) finish = choice.finish_reason;
      if (data.usage) usage = data.usage;
    });
    const seconds = (performance.now() - started) / 1000;
    const n = usage ? usage.completion_tokens : Number(out.dataset.tokens);
    $("generate-status").textContent = `${n} tokens in ${seconds.toFixed(2)} s (${(n / seconds).toFixed(1)} tokens/s); `
      + (finish === "stop" ? "the model wrote <eos>." : "reached the token limit.");
    out.dataset.state = "done";
  } catch (error) {
    out.dataset.state = error.name === "AbortError" ? "stopped" : "error";
    $("generate-status").textContent = error.name === "AbortError" ? "Stopped." : error.message;
  } finally {
    state.generation = null;
    setRunning(false);
  }
}

async function translate() {
  const out = outputStart();
  out.replaceChildren();
  setRunning(true);
  $("generate-status").textContent = "Translating…";
  try {
    const data = await post("/v1/translations", { text: $("prompt").value, beam: Number($("beam").value) || 1 });
    outputToken(data.translations[0].text);
    $("generate-status").textContent = `${data.usage.prompt_tokens} source tokens → ${data.usage.completion_tokens} `
      + "target tokens. The attention view shows how the decoder looked at the source while writing it.";
    out.dataset.state = "done";
  } catch (error) {
    out.dataset.state = "error";
    $("generate-status").textContent = error.message;
  } finally {
    setRunning(false);
    $("continue").disabled = true;
  }
}

function continueFromOutput() {
  $("prompt").value = $("output").textContent;
  $("output").replaceChildren();
  $("continue").disabled = true;
  onTextChanged();
}

// ---------------------------------------------------------------------------------------- wiring

const updateAttentionSoon = debounce(() => { if (!$("attention-view").hidden) updateAttention(); }, 400);

function onTextChanged() {
  updateChartSoon();
  updateAttentionSoon();
  updateWalkthroughSoon();
}

function wire() {
  for (const id of ["temperature", "top-k", "top-p"]) {
    $(id).addEventListener("input", () => { showControls(); updateChartSoon(); });
  }
  $("prompt").addEventListener("input", onTextChanged);
  $("target").addEventListener("input", onTextChanged);
  $("generate").addEventListener("click", generate);
  $("stop").addEventListener("click", () => state.generation && state.generation.abort());
  $("continue").addEventListener("click", continueFromOutput);
  $("show-attention").addEventListener("click", toggleAttention);
  $("show-walkthrough").addEventListener("click", toggleWalkthrough);
  $("attention-kind").addEventListener("change", () => {
    $("attention-kind").dataset.touched = "1";
    fillLayerHead();
    drawAttention();
  });
  $("layer").addEventListener("change", drawAttention);
  $("head").addEventListener("change", drawAttention);
  $("heatmap").addEventListener("mousemove", hoverAttention);
  wireChat();
}

async function main() {
  wire();
  showControls();
  try {
    await loadInfo();
  } catch (error) {
    $("model-info").textContent = `Cannot reach the server: ${error.message}`;
    return;
  }
  document.body.dataset.ready = "1";
  updateChart();
}

main();
