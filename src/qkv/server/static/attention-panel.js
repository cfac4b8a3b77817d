// qkv playground: the attention panel. It asks POST /v1/attention for the current text (and a translator's target),
// fills the kind, layer and head pickers and draws the picked map as a heatmap on a canvas, saying the weight under
// the pointer. Loaded before app.js, whose helpers ($, state, post, isTranslator) it uses when called; app.js wires
// its controls and asks it again when the text changes.
"use strict";

async function updateAttention() {
  const seq = ++state.attentionSeq;
  const view = $("attention-view");
  view.dataset.state = "loading";
  const target = $("target").value.trim();
  const body = { text: $("prompt").value, ...(isTranslator() && target ? { target } : {}) };
  try {
    if (!body.text) throw new Error("Type some text first.");
    const data = await post("/v1/attention", body);
    if (seq !== state.attentionSeq) return;
    state.attention = data;
    fillAttentionPickers(data);
    drawAttention();
    view.dataset.state = "shown";
  } catch (error) {
    if (seq !== state.attentionSeq) return;
    view.dataset.state = "error";
    $("attention-description").textContent = error.message;
  }
}

function fillSelect(select, options, keep) {
  const previous = select.value;
  select.replaceChildren(...options.map(([value, label]) => new Option(label, value)));
  if (keep && options.some(([value]) => value === previous)) select.value = previous;
}

function fillAttentionPickers(data) {
  fillSelect($("attention-kind"), Object.entries(data.groups).map(([name, group]) => [name, group.title]), true);
  const kind = $("attention-kind");
  if (!kind.dataset.touched && "cross" in data.groups) kind.value = "cross";  // a translator's alignment first
  fillLayerHead();
}

function currentMap() {
  const groups = state.attention.groups;
  return groups[$("attention-kind").value] || Object.values(groups)[0];
}

function fillLayerHead() {
  const map = currentMap();
  // Numbered from 0, as everywhere in qkv (the CLI's --layer/--head, TransformerLens, Hugging Face).
  fillSelect($("layer"), map.weights.map((_, i) => [String(i), `${i} (of 0–${map.weights.length - 1})`]), true);
  const heads = map.weights[0].map((_, i) => [String(i), `${i} (of 0–${map.weights[0].length - 1})`]);
  fillSelect($("head"), [...heads, ["mean", "all heads (mean)"]], true);
}

/** The (queries × keys) matrix for the picked layer and head (or the mean over heads). */
function pickedMatrix(map) {
  const layer = map.weights[Number($("layer").value) || 0];
  if ($("head").value !== "mean") return layer[Number($("head").value) || 0];
  return layer[0].map((row, q) => row.map((_, k) => layer.reduce((sum, head) => sum + head[q][k], 0) / layer.length));
}

function drawAttention() {
  const data = state.attention;
  const map = currentMap();
  const rows = [...map.query_tokens];
  const cols = map.key_tokens;
  if (data.target_tokens && map !== data.groups.encoder) {
    // A decoder position reads target token i and writes token i + 1.
    rows.forEach((r, i) => { rows[i] = `${r} → ${data.target_tokens[i + 1] || "(end)"}`; });
  }
  const matrix = pickedMatrix(map);
  const target = data.target_text === null || data.target_text === undefined ? "" : `. Target: "${data.target_text}"`;
  $("attention-description").textContent = `${map.description}${target}.`;
  const canvas = $("heatmap");
  const cell = Math.max(8, Math.min(34, Math.floor(820 / Math.max(rows.length, cols.length))));
  const { ctx, labelW, labelH } = QkvWalkthrough.labelledGrid(canvas, {
    rows, cols, nCols: cols.length, cellW: cell, cellH: cell, maxLabelW: 160, maxLabelH: 120, pad: 4,
  });
  matrix.forEach((row, i) => row.forEach((w, j) => {
    ctx.fillStyle = `rgba(47, 91, 211, ${Math.min(1, w)})`;
    ctx.fillRect(labelW + cell * j, labelH + cell * i, cell - 1, cell - 1);
    if (cell >= 30 && w >= 0.005) {
      ctx.fillStyle = w > 0.55 ? "#fff" : "#1d2330";
      ctx.textAlign = "center";
      ctx.fillText(w.toFixed(2).replace(/^0/, ""), labelW + cell * (j + 0.5), labelH + cell * (i + 0.5));
    }
  }));
  canvas.setAttribute("aria-label", `${map.description}: ${rows.length} × ${cols.length} heatmap`);
  state.geometry = { labelW, labelH, cell, rows, cols, matrix };
}

function hoverAttention(event) {
  const g = state.geometry;
  if (!g) return;
  const box = $("heatmap").getBoundingClientRect();
  const j = Math.floor((event.clientX - box.left - g.labelW) / g.cell);
  const i = Math.floor((event.clientY - box.top - g.labelH) / g.cell);
  if (i < 0 || j < 0 || i >= g.rows.length || j >= g.cols.length) return;
  $("attention-hover").textContent = `"${g.rows[i]}" (position ${i}) looks at "${g.cols[j]}" (position ${j}) `
    + `with weight ${g.matrix[i][j].toFixed(4)}`;
}

function toggleAttention() {
  const view = $("attention-view");
  const open = view.hidden;
  view.hidden = !open;
  $("show-attention").setAttribute("aria-expanded", String(open));
  $("show-attention").textContent = open ? "Hide attention" : "Show attention";
  if (open) updateAttention();
}
